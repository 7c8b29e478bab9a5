"""Regenerate the result tables of docs/results.md (and the README's quickstart table) from real runs.

Every table sits between `<!-- results: NAME -->` and `<!-- /results -->`. For each NAME asked for, this
runs `privbench sweep run examples/NAME.yaml` into one store (resuming what is already there), then
`privbench leaderboard SWEEP --format markdown` (SWEEP: the grid's `name`), and writes the command lines,
the wall time of the run and the table into every block of that name. Nothing in a block is typed by
hand, so the docs cannot drift from what the commands print (tests/test_docs.py checks their columns).

    python scripts/results.py [--store DIR] [quickstart gredp ...]   # default: every block in the docs
"""

from __future__ import annotations

import argparse
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


def block(name: str, store: str) -> str:
    import yaml

    grid = f"examples/{name}.yaml"
    sweep = yaml.safe_load((ROOT / grid).read_text())["name"]
    start = time.monotonic()
    privbench("sweep", "run", grid, "--store", store)
    wall = time.monotonic() - start
    table = privbench("leaderboard", sweep, "--format", "markdown", "--store", store, capture=True)
    minutes, seconds = divmod(round(wall), 60)
    text = (f"`privbench sweep run {grid}` ({minutes} min {seconds:02d} s wall on {machine()}; a rerun on a "
            f"store that already holds the sweep only resumes), then `privbench leaderboard {sweep} --format "
            f"markdown`:\n\n{table.strip()}\n")
    if "tune" in yaml.safe_load((ROOT / grid).read_text()):  # a tuned grid: its selections too
        tuned = privbench("leaderboard", sweep, "--view", "tuned", "--format", "markdown", "--store", store,
                          capture=True)
        text += f"\nand `privbench leaderboard {sweep} --view tuned --format markdown`:\n\n{tuned.strip()}\n"
    return text


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
        made[name] = block(name, args.store)
        for page in PAGES:  # written after each sweep, into the page as it is now: nothing done is lost
            page.write_text(BLOCK.sub(lambda m: m[1] + made[m[2]] + m[4] if m[2] in made else m[0],
                                      page.read_text()))
        print(f"{name}: regenerated", file=sys.stderr)


if __name__ == "__main__":
    main()
