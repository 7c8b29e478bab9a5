"""Regenerate the terminal captures of docs/commands.md: `privbench leaderboard` on a pseudo-terminal of 80
and of 120 columns, with every `--columns` group, on the quickstart sweep.

Every capture sits between `<!-- capture: NAME -->` and `<!-- /capture -->` (NAME: `leaderboard-GROUP-WIDTH`);
this writes the command and what the terminal showed (colours left out) into each block. Nothing in a block
is typed by hand; tests/dashboards/test_doc_captures.py checks that every line fits its width.

    python scripts/doc_captures.py --store DIR     # DIR holds the quickstart sweep (scripts/results.py runs it)
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "commands.md"
BLOCK = re.compile(r"(<!-- capture: ([\w-]+) -->\n)(.*?)(<!-- /capture -->)", re.S)
NAME = re.compile(r"leaderboard-(\w+)-(\d+)")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def capture(columns: int, args: list[str]) -> str:
    """What the program prints on a terminal `columns` wide (rich reads the width from the terminal)."""
    import pexpect

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {"PYTHONPATH": str(ROOT),
                                                                                   "TERM": "xterm-256color"}
    child = pexpect.spawn(sys.executable, ["-m", "orchestrator", *args], cwd=str(ROOT), env=env,
                          dimensions=(200, columns), encoding="utf-8", timeout=300)
    text = child.read()
    child.close()
    if child.exitstatus != 0:
        raise SystemExit(f"`privbench {' '.join(args)}` exited {child.exitstatus}:\n{text[-2000:]}")
    return "\n".join(ANSI.sub("", line).rstrip() for line in text.replace("\r\n", "\n").splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="store holding the quickstart sweep")
    parser.add_argument("--sweep", default="quickstart")
    args = parser.parse_args()
    store, sweep = args.store, args.sweep
    text = PAGE.read_text()

    def block(match: re.Match) -> str:
        group, width = NAME.fullmatch(match.group(2)).groups()
        command = ["leaderboard", sweep, "--columns", group]
        shown = capture(int(width), [*command, "--store", store])
        line = f"$ privbench {' '.join(command)}     # {width} columns"
        return f"{match.group(1)}```\n{line}\n{shown}\n```\n{match.group(4)}"

    PAGE.write_text(BLOCK.sub(block, text))
    print(f"wrote {len(BLOCK.findall(text))} captures into {PAGE.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
