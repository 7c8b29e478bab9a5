"""The README's "Then:" block, run as a newcomer runs it: as one bash script, in order, in a folder holding a
small store at the default place (issue 41, item 3). An unquoted `--float table*` passed every test that
called the CLI directly, but bash expands it to `table.tex`, which the line before writes."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def then_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"^Then:\n\n```bash\n(.*?)^```", text, re.S | re.M)
    assert block, "the README has a 'Then:' bash block"
    return [ln for ln in block.group(1).splitlines() if ln.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readme_then_block_runs_in_order_as_a_bash_script(figure_store, tmp_path):
    lines = then_block()
    assert [ln.split()[1] for ln in lines] == ["plot", "leaderboard", "leaderboard", "report", "ui"]
    shutil.copytree(figure_store, tmp_path / "privbench-store")  # the commands' default store
    port = free_port()
    script = []
    for line in lines:
        line = line.replace(" quickstart ", " figs ")  # the small store's sweep
        if line.split()[1] == "ui":  # serves until stopped: in the background, on a free port, until it answers
            command = line.split("#")[0].strip()
            script += [f"{command} --port {port} & ui=$!",
                       f"for _ in $(seq 600); do curl -fs -o /dev/null http://127.0.0.1:{port}/ && break; "
                       "kill -0 $ui || exit 3; sleep 0.1; done",
                       f"curl -fs -o /dev/null http://127.0.0.1:{port}/", "kill -INT $ui", "wait $ui || true"]
        else:
            script.append(line)
    env = os.environ | {"PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "error" not in done.stderr, done.stderr[-3000:]
    for name in ("fig.pdf", "table.tex", "report.html"):
        assert (tmp_path / name).stat().st_size > 100, name
    assert "\\begin{table*}" in done.stdout  # the third line's float(s), printed to stdout
