"""Regenerate the result tables of docs/results.md (and the README's quickstart table) from real runs.

Every table sits between `<!-- results: NAME -->` and `<!-- /results -->`. For each NAME asked for, this
runs `privbench sweep run examples/NAME.yaml` into one store (resuming what is already there), then
`privbench leaderboard SWEEP --format markdown --columns all` (SWEEP: the grid's `name`), and writes the command lines,
the wall time of the run and the table into every block of that name. Nothing in a block is typed by
hand, so the docs cannot drift from what the commands print (tests/test_docs.py checks their columns).

A wall time is written only for trials that ran in this call: a rerun on a store that already holds the
whole sweep runs nothing, so the block keeps the time it has (and without one, nothing is written); a
resume that ran some trials says how many.

    python scripts/results.py [--store DIR] [quickstart gredp ...]   # default: every block in the docs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "docs" / "results.md", ROOT / "README.md"]
BLOCK = re.compile(r"(<!-- results: ([\w-]+) -->\n)(.*?)(<!-- /results -->)", re.S)


def privbench(*args: str, capture: bool = False) -> str:
    done = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=ROOT, text=True, check=False,
                          stdout=subprocess.PIPE if capture else None)
    if done.returncode != 0:
        raise SystemExit(f"`privbench {' '.join(args)}` exited {done.returncode}")
    return done.stdout or ""


def machine() -> str:
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{os.cpu_count()} CPU cores, {device}, load average {os.getloadavg()[0]:.1f} at the end"


# The docs' tables show every column (the terminal's default is the compact set).
LEADERBOARD_ARGS = ("--format", "markdown", "--columns", "all")
TIMING = re.compile(r"^`privbench sweep run [^`]+` \((.*?)\), then ", re.M)


def finished(sweep: str, store: str) -> tuple[int, int]:
    """(finished, total) trials of the sweep in the store; (0, 0) when the store does not hold it yet."""
    done = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "status", sweep, "--store", store,
                           "--json"], cwd=ROOT, text=True, capture_output=True, check=False)
    try:
        counts = json.loads(done.stdout)["counts"]
    except (ValueError, KeyError):  # no such sweep in the store (yet): one error line, no JSON
        return 0, 0
    return counts.get("finished", 0), sum(counts.values())


def timing(ran: int, total: int, wall: float, previous: str | None, where: str) -> str:
    """The parenthesis after the run command: the wall time of what ran in this call, never a no-op
    resume's (then the block's previous timing stays, and without one there is nothing true to write)."""
    minutes, seconds = divmod(round(wall), 60)
    if ran <= 0:
        if previous is None:
            raise SystemExit("nothing ran (the store already holds the whole sweep), so there is no wall time to "
                             "write: rerun with a fresh --store to time it")
        return previous
    part = "" if ran >= total else f" for {ran} of {total} trials (the rest were resumed from the store)"
    return (f"{minutes} min {seconds:02d} s wall{part} on {where}; a rerun on a store that already holds the "
            "sweep only resumes")


def block(name: str, store: str, previous: str | None) -> str:
    import yaml

    grid = f"examples/{name}.yaml"
    sweep = yaml.safe_load((ROOT / grid).read_text())["name"]
    before, _ = finished(sweep, store)
    start = time.monotonic()
    privbench("sweep", "run", grid, "--store", store)
    wall = time.monotonic() - start
    after, total = finished(sweep, store)
    when = timing(after - before, total, wall, previous, machine())
    table = privbench("leaderboard", sweep, *LEADERBOARD_ARGS, "--store", store, capture=True)
    text = (f"`privbench sweep run {grid}` ({when}), then `privbench leaderboard {sweep} "
            f"{' '.join(LEADERBOARD_ARGS)}`:\n\n{table.strip()}\n")
    if "tune" in yaml.safe_load((ROOT / grid).read_text()):  # a tuned grid: its selections too
        tuned = privbench("leaderboard", sweep, "--view", "tuned", "--format", "markdown", "--store", store,
                          capture=True)
        text += f"\nand `privbench leaderboard {sweep} --view tuned --format markdown`:\n\n{tuned.strip()}\n"
    return text


def previous_timing(name: str) -> str | None:
    """The timing text of the first existing block called `name` (None when it has none)."""
    for page in PAGES:
        for m in BLOCK.finditer(page.read_text()):
            found = TIMING.search(m[3]) if m[2] == name else None
            if found:
                return found[1]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="blocks to regenerate (default: all)")
    parser.add_argument("--store", default=str(ROOT / "privbench-store"), help="store the sweeps run in")
    args = parser.parse_args()
    known = {m[2] for page in PAGES for m in BLOCK.finditer(page.read_text())}
    unknown = set(args.names) - known
    if unknown:
        raise SystemExit(f"no result block named {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    made: dict[str, str] = {}
    for name in args.names or sorted(known):
        made[name] = block(name, args.store, previous_timing(name))
        for page in PAGES:  # written after each sweep, into the page as it is now: nothing done is lost
            page.write_text(BLOCK.sub(lambda m: m[1] + made[m[2]] + m[4] if m[2] in made else m[0],
                                      page.read_text()))
        print(f"{name}: regenerated", file=sys.stderr)


if __name__ == "__main__":
    main()
