"""`sweep run` as a person runs it: on a real pseudo-terminal (issue 41, item 1).

The README's first command hung in every terminal: rich's live progress swaps `sys.stderr` for a proxy
that prints to its console, and the console wrote to whatever `sys.stderr` was, the proxy again, forever.
Piped output never showed it, and the tests only piped `sweep run`. Here the driver runs on a pty at 80
and 120 columns (rich reads the width from the terminal, no COLUMNS): the bars draw, the sweep ends with
exit 0, and Ctrl-C (130), or SIGTERM (143, the slow test), stops it with the store intact and a rerun resuming.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pexpect
import pytest

from tests.conftest import TINY
from tests.orchestrator.test_driver_kill import finished_count
from tests.orchestrator.test_submit import trial_runs

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def spawn(columns: int, *args: str) -> pexpect.spawn:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {
        "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}
    return pexpect.spawn(sys.executable, ["-m", "orchestrator", *args], cwd=str(ROOT), env=env,
                         dimensions=(50, columns), encoding="utf-8", timeout=300)


def finish(child: pexpect.spawn) -> tuple[int, str]:
    """Everything the program printed until it ended, and its exit code (a signal's death counts as 128+n)."""
    text = child.read()
    child.close()
    code = child.exitstatus if child.exitstatus is not None else 128 + child.signalstatus
    return code, ANSI.sub("", text.replace("\r\n", "\n"))


def wait_for_a_finished_trial(child: pexpect.spawn, ledger: Path) -> str:
    """Read the terminal until the ledger records one more finished trial than when called (the pty must be
    drained, or the driver blocks on a full terminal buffer: a stand-in for a person's screen)."""
    seen, deadline, before = [], time.monotonic() + 300, finished_count(ledger)
    while finished_count(ledger) <= before:
        assert child.isalive(), "".join(seen)[-3000:]
        assert time.monotonic() < deadline, "no trial finished within 300 s; the terminal showed:\n" + "".join(
            seen)[-3000:]
        try:
            seen.append(child.read_nonblocking(100_000, timeout=0.2))
        except pexpect.TIMEOUT:
            pass
    return "".join(seen)


def test_a_live_progress_display_on_our_console_ends():
    """The four-line reproduction: a `Progress` on privbench's stderr console, advanced on a pty."""
    program = ("from rich.progress import Progress\nfrom orchestrator.console import err\n"
               "with Progress(console=err) as p:\n    t = p.add_task('x', total=3)\n"
               "    for _ in range(3): p.advance(t)\nprint('done')\n")
    child = pexpect.spawn(sys.executable, ["-c", program], cwd=str(ROOT), encoding="utf-8", timeout=60,
                          env=os.environ | {"PYTHONPATH": str(ROOT), "TERM": "xterm-256color"})
    code, text = finish(child)
    assert code == 0 and "done" in text, text[-2000:]


def grid(write_grid, name: str, seeds: int) -> Path:
    return write_grid({"name": name, "seeds": list(range(seeds)), "grid": TINY["grid"] | {"mechanism": ["nonprivate"]}},
                      name=f"{name}.yaml")


def interrupt(child: pexpect.spawn, sig: signal.Signals, store: Path) -> int:
    """Stop a drawing `sweep run` once a trial has finished (Ctrl-C as the terminal sends it, or a signal), check
    its one-line exit and the store it leaves, and return how many trials are finished."""
    early = ANSI.sub("", wait_for_a_finished_trial(child, store / "ledger.db"))
    assert " trials, " in early and " to run" in early, early
    if sig == signal.SIGINT:
        child.sendintr()  # SIGINT to the foreground process group, as the terminal sends it
    else:
        child.kill(sig)
    got, text = finish(child)
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert got == 128 + sig, text[-3000:]
    assert len(errors) == 1 and f"stopped by {sig.name}" in errors[0], text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    with sqlite3.connect(store / "ledger.db") as db:
        assert db.execute("pragma integrity_check").fetchone() == ("ok",)
        assert db.execute("select count(*) from privbench_trials where lease_owner is not null").fetchone() == (0,)
    return finished_count(store / "ledger.db")


def resumed(store: Path, args: tuple[str, ...], columns: int, finished: int, trials: int) -> None:
    """A rerun on the pty finishes only what is left, drawing its bars within the terminal's width."""
    got, text = finish(spawn(columns, *args))
    assert got == 0, text[-3000:]
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= columns, text
    assert f"{finished} already finished, {trials - finished} to run" in text, text
    assert "━" in text  # the live bars drew
    assert sum(": done" in ln for ln in lines) == trials - finished, text  # one line per trial run now
    assert finished_count(store / "ledger.db") == trials
    keys = [r.data.tags["privbench.trial_key"] for r in trial_runs(store, "tty")]
    assert len(keys) == trials == len(set(keys))


def test_sweep_run_on_a_terminal_draws_stops_on_ctrl_c_and_resumes(write_grid, store):
    """Ctrl-C at 120 columns (130), then a rerun at 80 that finishes only what is left."""
    trials = 3
    args = ("sweep", "run", str(grid(write_grid, "tty", trials)), "--store", str(store), "--max-concurrent", "1")
    after_ctrl_c = interrupt(spawn(120, *args), signal.SIGINT, store)
    assert 1 <= after_ctrl_c < trials
    resumed(store, args, 80, after_ctrl_c, trials)


@pytest.mark.slow
def test_sweep_run_on_a_terminal_stops_on_sigterm_and_resumes(write_grid, store):
    """SIGTERM at 80 columns (143), then a rerun at 120. The driver handles SIGTERM and SIGINT with one
    handler (`orchestrator/runner.py`), so the default suite stops a running sweep by Ctrl-C only; its SIGTERM
    checks are those during Ray's start (tests/orchestrator/test_one_line_failures.py)."""
    trials = 3
    args = ("sweep", "run", str(grid(write_grid, "tty", trials)), "--store", str(store), "--max-concurrent", "1")
    after_sigterm = interrupt(spawn(80, *args), signal.SIGTERM, store)
    assert 1 <= after_sigterm < trials
    resumed(store, args, 120, after_sigterm, trials)
