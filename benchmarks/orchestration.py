"""Orchestration cost per trial: `privbench sweep run` against bare Ray tasks and Ray Tune.

N trivial trials (digits, mlp, nonprivate, 1 epoch on 64 examples, no audit) run three ways, each in
a fresh process that starts its own local Ray:

- `privbench`: `python -m orchestrator sweep run GRID --store TMP` (MLflow/SQLite runs + ledger + leases);
- `ray`: bare Ray tasks calling `workers.trial.run_trial` on the same configs (the floor);
- `tune`: Ray Tune, a function trainable calling `run_trial`, with `MLflowLoggerCallback` (what users
  would pick instead).

privbench's extra cost per trial is (T_privbench - T_ray) / N; the goal is <= 100 ms, flat in N.

    python benchmarks/orchestration.py --n 60 300 1000 [--tune-max 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
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
ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
task = ray.remote(num_cpus=1)(run_trial)
configs = [dict(t) | {{"resources": {{"cpus": 1, "gpus": 0}}}} for t in spec.trials]
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
configs = {{t["seed"]: dict(t) | {{"resources": {{"cpus": 1, "gpus": 0}}}} for t in spec.trials}}
ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)

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


def timed(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    env = os.environ | {"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, start_new_session=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({result.returncode}): {result.stderr[-2000:]}")
    return elapsed


def measure(n: int, with_tune: bool) -> dict[str, float | int | None]:
    with tempfile.TemporaryDirectory(prefix="privbench-bench-") as tmp:
        folder = Path(tmp)
        grid = folder / "grid.yaml"
        grid.write_text(GRID.format(seeds=", ".join(map(str, range(n)))))
        row: dict[str, float | int | None] = {"n": n}
        row["ray_s"] = timed([sys.executable, "-c", BARE.format(root=str(ROOT), grid=str(grid))], folder)
        row["privbench_s"] = timed([sys.executable, "-m", "orchestrator", "sweep", "run", str(grid), "--store",
                                    str(folder / "store")], folder)
        row["tune_s"] = None
        if with_tune:
            row["tune_s"] = timed([sys.executable, "-c", TUNE.format(
                root=str(ROOT), grid=str(grid), storage=str(folder / "tune"),
                tracking=f"sqlite:///{folder / 'tune-mlflow.db'}")], folder)
    row["privbench_extra_ms_per_trial"] = 1000 * (row["privbench_s"] - row["ray_s"]) / n
    row["tune_extra_ms_per_trial"] = (1000 * (row["tune_s"] - row["ray_s"]) / n) if row["tune_s"] else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[60, 300, 1000])
    parser.add_argument("--tune-max", type=int, default=300, help="Run Ray Tune only up to this N (it is slow).")
    parser.add_argument("--json", type=Path, help="Also write the rows as JSON.")
    args = parser.parse_args()
    rows = []
    print("| N | bare Ray (s) | privbench (s) | privbench extra / trial | Ray Tune + MLflow (s) | Tune extra / trial |")
    print("|---|---|---|---|---|---|")
    for n in args.n:
        row = measure(n, with_tune=n <= args.tune_max)
        rows.append(row)
        tune = f"{row['tune_s']:.1f}" if row["tune_s"] else "not run"
        tune_extra = f"{row['tune_extra_ms_per_trial']:.0f} ms" if row["tune_extra_ms_per_trial"] else "-"
        print(f"| {n} | {row['ray_s']:.1f} | {row['privbench_s']:.1f} | {row['privbench_extra_ms_per_trial']:.0f} ms "
              f"| {tune} | {tune_extra} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
