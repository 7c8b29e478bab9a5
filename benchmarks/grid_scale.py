"""A large grid, planned and run: `sweep run --dry-run` and `sweep run` on grids of 10^4 to 10^6 trials (issue 40,
item 4).

For each size N it reports the dry run's CPU time until its first line and until its 1,000th (the
process's own user + system time, read from /proc when the line arrives: a loaded machine disturbs
this far less than wall time), its peak memory (VmHWM), and, in this process, the CPU time to check the
grid (`orchestrator.grid.check`) and to make its trials one by one (per trial, over the first 20,000).

With `--run`, it then starts `sweep run` on the same grid and a fresh store (a real local Ray, trials of
digits/mlp): the driver's CPU time until its first line, until the line that says how many trials it runs (the
sweep opened in the store: two passes over the grid), its peak memory, and what SIGTERM does after
`--run-budget` seconds (or once that line came): the exit code (143), the seconds until the driver is gone, and
whether `store check` finds the store sound afterwards.
The goals: first line within 5 s, under 1 GB, the grid checked in under 10 s.

    python benchmarks/grid_scale.py [--n 10000 100000 1000000] [--run | --run-only] [--run-budget 120]
        [--tree OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
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


def sweep_run(grid: Path, budget: float, tree: Path = ROOT) -> dict[str, object]:
    """`sweep run` (of the checkout `tree`) on a fresh store, stopped by SIGTERM once its trials are opened or after
    `budget` wall seconds."""
    env = os.environ | {"PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    store = grid.parent / "run-store"
    child = subprocess.Popen([sys.executable, "-m", "orchestrator", "sweep", "run", str(grid), "--store", str(store),
                              "--max-concurrent", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=env, start_new_session=True, cwd=grid.parent)  # not this checkout's folder: `tree`'s
    seen: dict[str, float] = {}
    opened = threading.Event()
    peak = [0.0]

    def read() -> None:
        for line in child.stderr:
            try:
                cpu = cpu_s(child.pid)
            except (FileNotFoundError, ProcessLookupError):
                break
            seen.setdefault("first", cpu)
            if " to run, up to " in line:
                seen["opened"] = cpu
                opened.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + budget
    try:
        while not opened.is_set() and time.monotonic() < deadline and child.poll() is None:
            peak[0] = max(peak[0], peak_mb(child.pid))
            time.sleep(0.5)
        if child.poll() is None:
            peak[0] = max(peak[0], peak_mb(child.pid))
            stopped = time.monotonic()
            child.send_signal(signal.SIGTERM)
            try:
                code = child.wait(timeout=180)
            except subprocess.TimeoutExpired:
                code = None
            exit_s = time.monotonic() - stopped
        else:
            code, exit_s = child.returncode, 0.0
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)  # nothing it started outlives the measurement
        except ProcessLookupError:
            pass
        child.wait()
    check = subprocess.run([sys.executable, "-m", "orchestrator", "store", "check", "--store", str(store)],
                           env=env, capture_output=True, text=True, cwd=grid.parent)
    return {"first": seen.get("first"), "opened": seen.get("opened"), "peak": peak[0], "code": code,
            "exit_s": exit_s, "check": "sound" if check.returncode == 0 else f"exit {check.returncode}"}


def in_process(text: str) -> tuple[float, float]:
    from orchestrator import grid

    grid.check("name: warm\nseeds: [0]\ngrid: {dataset: [digits], model: [mlp], mechanism: [dpsgd], epsilon: [1]}\n")
    start = time.process_time()
    planned = grid.check(text)
    checked = time.process_time() - start
    start = time.process_time()
    made = sum(1 for _ in itertools.islice(planned.trials(), 20_000))
    return checked, (time.process_time() - start) / made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--run", action="store_true", help="Also time `sweep run` (starts Ray) on each grid.")
    parser.add_argument("--run-budget", type=float, default=120.0,
                        help="Wall seconds `sweep run` is given to open its trials before SIGTERM.")
    parser.add_argument("--tree", type=Path, default=ROOT,
                        help="The checkout whose `sweep run` is timed (before/after).")
    parser.add_argument("--run-only", action="store_true", help="Time `sweep run` alone (no dry run).")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if not args.run_only:
        print("| N | CPU to first line (s) | CPU to 1,000th line (s) | peak memory (MB) | grid checked, CPU (s) "
              "| per trial made (µs) |\n|---|---|---|---|---|---|")
    runs = []
    for n in args.n:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "grid.yaml"
            path.write_text(grid_text(n))
            if not args.run_only:
                first, thousandth, peak = dry_run(path)
                checked, per_trial = in_process(path.read_text())
                print(f"| {n:,} | {first:.2f} | {thousandth:.2f} | {peak:.0f} | {checked:.2f} "
                      f"| {per_trial * 1e6:.0f} |", flush=True)
            if args.run or args.run_only:
                runs.append((n, sweep_run(path, args.run_budget, args.tree)))
    if runs:
        print(f"\n`sweep run` of {args.tree} (driver CPU; SIGTERM once the trials are opened or after the budget)\n\n"
              "| N | CPU to first line (s) | CPU to trials opened (s) | peak memory (MB) | exit code after SIGTERM "
              "| SIGTERM to exit, wall (s) | store check after |\n|---|---|---|---|---|---|---|")
        for n, r in runs:
            def cell(v: object) -> str:
                return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)
            print(f"| {n:,} | {cell(r['first'])} | {cell(r['opened'])} | {r['peak']:.0f} | {cell(r['code'])} "
                  f"| {r['exit_s']:.1f} | {r['check']} |", flush=True)


if __name__ == "__main__":
    main()
