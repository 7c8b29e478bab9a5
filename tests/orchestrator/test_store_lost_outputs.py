"""A command whose stdout or stderr is closed, full or gone (issue 50, item 4): at most one line, where one can
be written, and the exit code docs/commands.md gives, never a traceback. Real streams, through a shell."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.storage.test_ledger_survives_mirror import recorded

ROOT = Path(__file__).resolve().parents[2]


def shell(command: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`command` with `privbench` as this checkout's CLI, stdout and stderr captured where not redirected."""
    prog = f"{sys.executable} -m orchestrator"
    return subprocess.run(["bash", "-c", command.replace("privbench", prog)], cwd=ROOT, capture_output=True,
                          text=True, env=os.environ | {"PYTHONPATH": str(ROOT)}, timeout=300)


@pytest.mark.parametrize("redirect", [">&-", ">/dev/full"])
@pytest.mark.parametrize("args", ["sweep list --store {store}", "sweep list --json --store {store}"])
def test_a_closed_or_full_stdout_is_one_line_and_exit_1(store, tmp_path, redirect, args):
    recorded(store)
    done = shell(f"privbench {args.format(store=store)} {redirect}", tmp_path)
    assert done.returncode == 1, done  # main: 1 with a 23- or 43-line traceback
    assert "Traceback" not in done.stderr and done.stdout == "", done.stderr
    assert done.stderr.startswith("error: the output could not be written to stdout (") and \
        done.stderr.count("\n") == 1, done.stderr


def test_a_reader_that_left_is_exit_141_and_no_line(store, tmp_path):
    """The reader of the pipe is gone before the first write."""
    recorded(store)
    done = shell(f"privbench sweep list --store {store} | (exec 0<&-; sleep 1); echo \"${{PIPESTATUS[0]}}\"",
                 tmp_path)
    assert done.stdout.strip() == "141" and done.stderr == "", done


@pytest.mark.parametrize("redirect", ["2>&-", "2>/dev/full"])
def test_a_lost_stderr_keeps_the_commands_exit_code(tmp_path, redirect):
    done = shell(f"privbench sweep list --store {tmp_path / 'none'} {redirect}", tmp_path)
    assert done.returncode == 2 and done.stdout == "", done  # "no privbench store": said nowhere, exit 2 stands
    both = shell(f"privbench sweep list --store {tmp_path / 'none'} >&- {redirect}", tmp_path)
    assert both.returncode == 2 and both.stdout == "" and both.stderr == "", both
