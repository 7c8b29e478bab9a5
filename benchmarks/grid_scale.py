"""A large grid, planned: `sweep run --dry-run` on grids of 10^4 to 10^6 trials (issue 40, item 4).

For each size N it reports the dry run's CPU time until its first line and until its 1,000th (the
process's own user + system time, read from /proc when the line arrives: a loaded machine disturbs
this far less than wall time), its peak memory (VmHWM), and, in this process, the CPU time to check the
grid (`orchestrator.grid.plan`) and to make its trials one by one (per trial, over the first 20,000).
The goals: first line within 5 s, under 1 GB, the grid checked in under 10 s.

    python benchmarks/grid_scale.py [--n 10000 100000 1000000]
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def grid_text(n: int) -> str:
    seeds = 1000 if n >= 1000 else n
    epsilons = max(n // seeds, 1)
    return (f"name: big\nmax_trials: {seeds * epsilons}\nseeds: [{', '.join(map(str, range(seeds)))}]\n"
            "grid: {dataset: [digits], model: [mlp], mechanism: [dpsgd], epsilon: ["
            + ", ".join(f"{1 + i / 1000:g}" for i in range(epsilons)) + "]}\n")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_mb(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def dry_run(grid: Path) -> tuple[float, float, float]:
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-m", "orchestrator", "sweep", "run", str(grid), "--dry-run",
                              "--store", str(grid.parent / "store")], stdout=subprocess.PIPE, text=True, env=env)
    try:
        child.stdout.readline()
        first = cpu_s(child.pid)
        for _ in range(1000):
            child.stdout.readline()
        thousandth, peak = cpu_s(child.pid), peak_mb(child.pid)
    finally:
        child.kill()
        child.wait()
    return first, thousandth, peak


def in_process(text: str) -> tuple[float, float]:
    from orchestrator import grid

    grid.plan("name: warm\nseeds: [0]\ngrid: {dataset: [digits], model: [mlp], mechanism: [dpsgd], epsilon: [1]}\n")
    start = time.process_time()
    planned = grid.plan(text)
    checked = time.process_time() - start
    start = time.process_time()
    made = sum(1 for _ in itertools.islice(planned.trials(), 20_000))
    return checked, (time.process_time() - start) / made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    print("| N | CPU to first line (s) | CPU to 1,000th line (s) | peak memory (MB) | grid checked, CPU (s) "
          "| per trial made (µs) |\n|---|---|---|---|---|---|")
    for n in args.n:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "grid.yaml"
            path.write_text(grid_text(n))
            first, thousandth, peak = dry_run(path)
            checked, per_trial = in_process(path.read_text())
        print(f"| {n:,} | {first:.2f} | {thousandth:.2f} | {peak:.0f} | {checked:.2f} | {per_trial * 1e6:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
