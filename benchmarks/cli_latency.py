"""How long the CLI takes to answer: `privbench --help` and the read commands on a 150-trial store.

The tests only check what each command imports (tests/orchestrator/test_cli.py and
test_small_command_imports.py); the times are measured here. Each command runs in a fresh interpreter,
`--repeat` times; the table gives the best and median wall time and the best CPU time (user + system of the
child). The issue's targets: `--help` under 0.5 s, `list mechanisms|datasets|models|accountants`,
`privacy epsilon|sigma|agm` and `audit --help` under 1.5 s (the registries load light descriptors only), the
read commands under 2 s on 150 trials, and a `sweep run` of a finished sweep (nothing to do: decided from
the ledger, without Ray or MLflow) under 1.5 s.

    python benchmarks/cli_latency.py [--trials 150] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from storage.location import resolve  # noqa: E402
from storage.store import Store  # noqa: E402

# Commands that read no store (issue target: 1.5 s each on a 2-core machine).
SMALL = [["privacy", "epsilon", "--sigma", "1", "--sample-rate", "0.01", "--steps", "1000", "--delta", "1e-5"],
         ["privacy", "sigma", "--epsilon", "2", "--sample-rate", "0.01", "--steps", "1000", "--delta", "1e-5"],
         ["privacy", "agm", "--epsilon", "1", "--delta", "1e-5"],
         ["audit", "--help"]]


def build_store(folder: Path, n: int) -> None:
    """A store with n recorded trials, written through Store as the driver does."""
    st = Store(resolve(str(folder)), create=True)
    records = []
    for i in range(n):
        mech = "nonprivate" if i % 3 == 0 else "dpsgd"
        cfg = {"mechanism": mech, "dataset": "digits", "model": "mlp", "seed": i // 3,
               "epsilon": None if mech == "nonprivate" else float(1 + i % 3), "delta": 1e-5,
               "train": {"batch_size": 64}}
        records.append({"sweep": "big", "trial_key": f"key{i:04d}", "status": "finished", "config": cfg,
                        "metrics": {"accuracy": 0.8 + i / 10_000, "wall_s": 1.0, "step_time_s": 0.01},
                        "privacy": {"epsilon_claimed": cfg["epsilon"], "epsilon_certified": cfg["epsilon"]}})
    st.open_sweep("big", "name: big", [r["config"] | {"trial_key": r["trial_key"]} for r in records])
    for r in records:
        st.record(r)
    st.close()  # last connections closed: the WAL is checkpointed into the files


FINISHED_GRID = "name: done\nseeds: [0, 1]\ngrid: {dataset: [digits], model: [mlp], mechanism: [nonprivate]}\n"


def finished_sweep(folder: Path, grid_file: Path) -> None:
    """A sweep whose trials are all recorded finished: rerunning it has nothing to do."""
    from orchestrator import grid

    grid_file.write_text(FINISHED_GRID)
    spec = grid.load(grid_file)
    st = Store(resolve(str(folder)), create=True)
    configs = [t.to_dict() for t in spec.trials]
    st.open_sweep(spec.name, spec.text, configs, key_of=grid.stored_key)
    for cfg in configs:
        st.record({"sweep": spec.name, "trial_key": cfg["trial_key"], "status": "finished", "config": cfg,
                   "metrics": {"accuracy": 0.9, "wall_s": 1.0}})
    st.close()


def run(args: list[str], repeat: int) -> tuple[float, float, float]:
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "orchestrator", *args], env=env, capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if result.returncode != 0:
            raise RuntimeError(f"privbench {' '.join(args)}: {result.stderr[-1000:]}")
    return min(walls), statistics.median(walls), min(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=150)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="privbench-cli-") as tmp:
        store = Path(tmp) / "store"
        build_store(store, args.trials)
        finished_sweep(store, Path(tmp) / "done.yaml")
        lists = [["list", what] for what in ("mechanisms", "datasets", "models", "accountants")]
        commands = [["--help"], *lists, ["sweep", "list"], ["sweep", "status", "big"],
                    ["leaderboard", "big", "--format", "json"],
                    ["export", "big", "--format", "csv", "--out", str(Path(tmp) / "x.csv")],
                    ["sweep", "run", str(Path(tmp) / "done.yaml")]]
        commands += SMALL
        print(f"load average before: {os.getloadavg()[0]:.1f}; {args.trials} trials; best of {args.repeat}")
        print("| command | best wall (s) | median wall (s) | best CPU (s) |")
        print("|---|---|---|---|")
        for cmd in commands:
            full = cmd if cmd[0] in ("--help", "list") or cmd in SMALL else [*cmd, "--store", str(store)]
            best, median, cpu = run(full, args.repeat)
            print(f"| `privbench {' '.join(cmd[:3])}` | {best:.2f} | {median:.2f} | {cpu:.2f} |", flush=True)
        print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
