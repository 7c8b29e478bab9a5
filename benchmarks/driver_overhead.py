"""The sweep driver's own CPU per trial: `privbench sweep run` on N trivial trials, the driver process's user +
system time (not Ray's nor the workers'), at two or more N.

A trivial trial is orchestration.py's: digits, mlp, nonprivate, 1 epoch on 64 examples, no audit. The driver's
CPU includes a fixed start-up (imports, Ray's start, a fresh store's MLflow schema: about 14 s), so the figure that
says what one more trial costs is the marginal one, (CPU(N2) - CPU(N1)) / (N2 - N1), between successive N; the
plain CPU / N is given too. The goal (issue 40): at most 100 ms per trial. CPU time, not wall: the shared
development machine is loaded, and the driver's CPU is what the load disturbs least.

    python benchmarks/driver_overhead.py --n 100 1000 [--tree OTHER_CHECKOUT] [--profile OUT.prof]

`--tree` runs another checkout's privbench (a before/after comparison); `--profile` runs the driver of the last N
under cProfile and writes its statistics (the main thread: the driver's loop).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from orchestration import GRID, PRIVBENCH, timed  # noqa: E402


def driver_cpu(n: int, tree: Path, timeout: float, profile: Path | None = None) -> tuple[float, float]:
    """(driver CPU seconds, wall seconds) of one `sweep run` of n trivial trials on a fresh store."""
    with tempfile.TemporaryDirectory(prefix="privbench-driver-") as tmp:
        folder = Path(tmp)
        grid = folder / "grid.yaml"
        grid.write_text(GRID.format(seeds=", ".join(map(str, range(n)))))
        cpu = folder / "driver.cpu"
        program = PRIVBENCH
        if profile is not None:  # the same program, its main thread under cProfile
            program = PRIVBENCH.replace('runpy.run_module("orchestrator", run_name="__main__")',
                                        "import cProfile\nprofiler = cProfile.Profile()\nprofiler.enable()\n"
                                        "try:\n    runpy.run_module('orchestrator', run_name='__main__')\n"
                                        f"finally:\n    profiler.disable()\n    profiler.dump_stats({str(profile)!r})")
        wall = timed([sys.executable, "-c", program, str(cpu), "sweep", "run", str(grid), "--store",
                      str(folder / "store")], folder, timeout, tree)
        if wall is None:
            raise RuntimeError(f"sweep run of {n} trials ran past {timeout:.0f} s")
        return float(cpu.read_text()), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--tree", type=Path, default=ROOT, help="The checkout whose privbench runs.")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--profile", type=Path, help="cProfile statistics of the last N's driver, written here.")
    args = parser.parse_args()
    print(f"tree {args.tree}\n\n| N | driver CPU (s) | CPU / trial (ms) | marginal CPU / trial (ms) | wall (s) "
          "| load avg |\n|---|---|---|---|---|---|")
    previous = None
    for i, n in enumerate(args.n):
        profile = args.profile if i == len(args.n) - 1 else None
        cpu, wall = driver_cpu(n, args.tree, args.timeout, profile)
        marginal = "-" if previous is None else f"{1000 * (cpu - previous[1]) / (n - previous[0]):.0f}"
        print(f"| {n:,} | {cpu:.1f} | {1000 * cpu / n:.0f} | {marginal} | {wall:.0f} | {os.getloadavg()[0]:.1f} |",
              flush=True)
        previous = (n, cpu)


if __name__ == "__main__":
    main()
