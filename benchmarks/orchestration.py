"""Orchestration cost per trial: `privbench sweep run` against bare Ray tasks and Ray Tune.

N trivial trials (digits, mlp, nonprivate, 1 epoch on 64 examples, no audit) run three ways, each in
a fresh process that starts its own local Ray:

- `privbench`: `python -m orchestrator sweep run GRID --store TMP` (MLflow/SQLite runs + ledger + leases);
- `ray`: bare Ray tasks calling `workers.trial.run_trial` on the same configs (the floor);
- `tune`: Ray Tune, a function trainable calling `run_trial`, with `MLflowLoggerCallback` (what users
  would pick instead).

privbench's extra cost per trial is (T_privbench - T_ray) / N; the goal is <= 100 ms, flat in N. Each
row also gives the extra CPU seconds of the driver process per trial (its own user + system time, not
Ray's or the workers'), which a busy shared machine disturbs less than wall time.

    python benchmarks/orchestration.py --n 60 300 1000 [--tune-max 300] [--systems ray privbench tune]
        [--timeout S] [--json out.json]

A command past --timeout is killed (its process group, Ray included) and reported as `-`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = ("name: bench\nseeds: [{seeds}]\ngrid: {{dataset: [digits], model: [mlp], mechanism: [nonprivate]}}\n"
        "train: {{epochs: 1, batch_size: 64, lr: 0.5, max_train_examples: 64}}\naudit: {{enabled: false}}\n"
        "resources: {{cpus: 1, gpus: 0}}\n")

BARE = """
import sys, time, ray
sys.path.insert(0, {root!r})
from orchestrator import grid
from workers.trial import run_trial
spec = grid.load({grid!r})
ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False)
task = ray.remote(num_cpus=1)(run_trial)
configs = [t.to_dict() | {{"resources": {{"cpus": 1, "gpus": 0}}}} for t in spec.trials]
records = ray.get([task.remote(c) for c in configs])
assert all(r["status"] == "finished" for r in records), [r["error"] for r in records if r["error"]][:3]
"""

TUNE = """
import sys, ray
sys.path.insert(0, {root!r})
from ray import tune
from ray.air.integrations.mlflow import MLflowLoggerCallback
from orchestrator import grid
from workers.trial import run_trial
spec = grid.load({grid!r})
configs = {{t.seed: t.to_dict() | {{"resources": {{"cpus": 1, "gpus": 0}}}} for t in spec.trials}}
ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False)

def trainable(cfg):
    record = run_trial(configs[cfg["seed"]])
    return {{"accuracy": record["metrics"]["accuracy"]}}

tuner = tune.Tuner(tune.with_resources(trainable, {{"cpu": 1}}),
                   param_space={{"seed": tune.grid_search(sorted(configs))}},
                   run_config=tune.RunConfig(storage_path={storage!r}, verbose=0,
                                             callbacks=[MLflowLoggerCallback(tracking_uri={tracking!r},
                                                                             experiment_name="bench")]))
results = tuner.fit()
assert not results.errors, results.errors[:3]
"""


# Runs the benchmarked program and writes the CPU seconds of its own (driver) process at exit: on a shared
# machine the driver's CPU per trial is a steadier measure of its overhead than the difference of walls.
DRIVER = """
import atexit, resource, sys
cpu_out = sys.argv.pop(1)
def _cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(cpu_out, "w") as fh:
        fh.write(repr(usage.ru_utime + usage.ru_stime))
atexit.register(_cpu)
"""
PRIVBENCH = DRIVER + """
import runpy
sys.argv = ["privbench", *sys.argv[1:]]
runpy.run_module("orchestrator", run_name="__main__")
"""


def timed(cmd: list[str], cwd: Path, timeout: float, tree: Path = ROOT) -> float | None:
    """Wall seconds of the command, None when it ran past `timeout` (its whole process group, Ray's
    processes included, is then killed). `tree`: the checkout whose privbench it imports."""
    start = time.perf_counter()
    env = os.environ | {"PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of it (raylet, workers) outlives the measurement
        except ProcessLookupError:
            pass
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}): {stderr[-2000:]}")
    return elapsed


def measure(n: int, systems: list[str], timeout: float) -> dict[str, float | int | None]:
    with tempfile.TemporaryDirectory(prefix="privbench-bench-") as tmp:
        folder = Path(tmp)
        grid = folder / "grid.yaml"
        grid.write_text(GRID.format(seeds=", ".join(map(str, range(n)))))
        cpu = {name: folder / f"{name}.cpu" for name in ("ray", "privbench", "tune")}
        commands = {
            "ray": [sys.executable, "-c", DRIVER + BARE.format(root=str(ROOT), grid=str(grid)), str(cpu["ray"])],
            "privbench": [sys.executable, "-c", PRIVBENCH, str(cpu["privbench"]), "sweep", "run", str(grid),
                          "--store", str(folder / "store")],
            "tune": [sys.executable, "-c", DRIVER + TUNE.format(
                root=str(ROOT), grid=str(grid), storage=str(folder / "tune"),
                tracking=f"sqlite:///{folder / 'tune-mlflow.db'}"), str(cpu["tune"])],
        }
        row: dict[str, float | int | None] = {"n": n, "load_before": os.getloadavg()[0]}
        for name in ("ray", "privbench", "tune"):
            row[f"{name}_s"] = timed(commands[name], folder, timeout) if name in systems else None
            row[f"{name}_driver_cpu_s"] = float(cpu[name].read_text()) if cpu[name].exists() else None
        row["load_after"] = os.getloadavg()[0]
    for name in ("privbench", "tune"):
        ok = row[f"{name}_s"] is not None and row["ray_s"] is not None
        row[f"{name}_extra_ms_per_trial"] = 1000 * (row[f"{name}_s"] - row["ray_s"]) / n if ok else None
        ok = row[f"{name}_driver_cpu_s"] is not None and row["ray_driver_cpu_s"] is not None
        row[f"{name}_extra_cpu_ms_per_trial"] = (
            1000 * (row[f"{name}_driver_cpu_s"] - row["ray_driver_cpu_s"]) / n if ok else None)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[60, 300, 1000])
    parser.add_argument("--tune-max", type=int, default=300, help="Run Ray Tune only up to this N (it is slow).")
    parser.add_argument("--systems", nargs="+", default=["ray", "privbench", "tune"],
                        choices=["ray", "privbench", "tune"])
    parser.add_argument("--timeout", type=float, default=3600, help="Give up on one command after this many s.")
    parser.add_argument("--json", type=Path, help="Also write the rows as JSON (after each N).")
    args = parser.parse_args()
    rows = []

    def cell(value: float | None, unit: str = "", fmt: str = ".1f") -> str:
        return "-" if value is None else f"{value:{fmt}}{unit}"

    print("| N | bare Ray (s) | privbench (s) | privbench extra / trial | privbench extra driver CPU / trial "
          "| Ray Tune + MLflow (s) | Tune extra / trial | Tune extra driver CPU / trial | load avg before / after |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.n:
        systems = [s for s in args.systems if s != "tune" or n <= args.tune_max]
        row = measure(n, systems, args.timeout)
        rows.append(row)
        print(f"| {n} | {cell(row['ray_s'])} | {cell(row['privbench_s'])} "
              f"| {cell(row['privbench_extra_ms_per_trial'], ' ms', '.0f')} "
              f"| {cell(row['privbench_extra_cpu_ms_per_trial'], ' ms', '.0f')} | {cell(row['tune_s'])} "
              f"| {cell(row['tune_extra_ms_per_trial'], ' ms', '.0f')} "
              f"| {cell(row['tune_extra_cpu_ms_per_trial'], ' ms', '.0f')} "
              f"| {row['load_before']:.1f} / {row['load_after']:.1f} |", flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
