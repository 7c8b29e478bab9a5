"""Benchmark: how busy a sweep keeps the accelerator (or, without one, the CPU slots).

    python benchmarks/sweep_busy.py [--grids quickstart,digits] [--small] [--json out.json]

Busy fraction, on a GPU machine: the share of the sweep's wall time during which at least one trial was in its
accelerator phase (the union of the records' `environment.started_at` .. `accelerator_finished_at` intervals,
over the GPUs), so trials packed onto one GPU (`gpus: 0.25`, `auto`) count once, not once each. On CPU:
(sum over trials of the training phase's seconds) / (sweep wall seconds x slots), slots being the machine's cores
divided by each trial's `resources.cpus`, so the figure says how much of the machine training used. The training
phase is a record's `metrics.accelerator_s` when the trial records its phases, else its `metrics.train_s`.

Grids (each runs as `privbench sweep run` in a fresh process with its own local Ray and a fresh store):
- `quickstart`: examples/quickstart.yaml as it is (on CPU its resources become `{cpus: 1, gpus: 0}`);
- `digits`: 20 trials, mlp and vit-tiny x nonprivate, dpsgd, dpsgd-gdp x epsilon 1 and 8 x 2 seeds, with
  `resources: {cpus: 2, gpus: 0.25}` on a GPU (`{cpus: 1, gpus: 0}` on CPU).
`--small` shrinks both to a few trials of one epoch on 256 examples (batch 64) without audits: the CI smoke run.
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
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DIGITS = {
    "name": "digits-busy", "seeds": [0, 1], "delta": 1e-5,
    "grid": {"dataset": ["digits"], "model": ["mlp", "vit-tiny"], "mechanism": ["nonprivate", "dpsgd", "dpsgd-gdp"],
             "epsilon": [1, 8]},
    "train": {"epochs": 3, "batch_size": 256, "lr": 0.5},
}
SMALL_TRAIN = {"epochs": 1, "max_train_examples": 256, "batch_size": 64}


def grid(name: str, *, gpu: bool, small: bool) -> dict[str, Any]:
    if name == "quickstart":
        spec = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    elif name == "digits":
        spec = json.loads(json.dumps(DIGITS))
    else:
        raise SystemExit(f"sweep_busy: unknown grid {name!r}; known: quickstart, digits")
    if name == "digits":
        spec["resources"] = {"cpus": 2, "gpus": 0.25} if gpu else {"cpus": 1, "gpus": 0}
    elif not gpu:
        spec["resources"] = {"cpus": 1, "gpus": 0}
    if small:
        spec["seeds"] = [0]
        spec["grid"] = spec["grid"] | {"model": spec["grid"]["model"][:1], "epsilon": [8],
                                       "mechanism": ["nonprivate", "dpsgd"]}
        spec["train"] = spec.get("train", {}) | SMALL_TRAIN
        spec["mechanism_train"] = {m: {k: v for k, v in t.items() if k not in SMALL_TRAIN}
                                   for m, t in spec.get("mechanism_train", {}).items()}
        spec["audit"] = {"mode": "off"}
    spec["name"] = f"{spec['name']}-busy" if not spec["name"].endswith("-busy") else spec["name"]
    return spec


def phase_s(record: dict[str, Any]) -> float:
    """The training phase's seconds of one trial record (see the module docstring)."""
    metrics = record.get("metrics") or {}
    value = metrics.get("accelerator_s")
    return float(value if value is not None else metrics.get("train_s") or 0.0)


def covered_s(records: list[dict[str, Any]]) -> float:
    """Seconds during which at least one trial was in its accelerator phase (the union of their intervals)."""
    spans = sorted((e["started_at"], e["accelerator_finished_at"]) for r in records
                   if "accelerator_finished_at" in (e := r.get("environment") or {}) and "started_at" in e)
    total, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def slots(spec: dict[str, Any], gpus: int) -> float:
    if gpus:
        return float(gpus)
    per_trial = float(spec.get("resources", {}).get("cpus", 1) or 1)
    return max(1.0, (os.cpu_count() or 1) // per_trial)


def run(name: str, *, gpu: bool, gpus: int, small: bool) -> dict[str, Any]:
    from orchestrator.sweep_cli import locate
    from storage.store import Store

    spec = grid(name, gpu=gpu, small=small)
    with tempfile.TemporaryDirectory(prefix="privbench-busy-") as tmp:
        path = Path(tmp) / "grid.yaml"
        path.write_text(yaml.safe_dump(spec))
        store = str(Path(tmp) / "store")
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "run", str(path), "--store", store],
                              cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"sweep_busy: the {name} sweep failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        st = Store(locate(store))
        try:
            records = st.records(spec["name"])
        finally:
            st.close()
    busy = sum(phase_s(r) for r in records)
    n_slots = slots(spec, gpus)
    metrics = [r.get("metrics") or {} for r in records]
    # the CPU phases beside it: a plan task is shared by the trials of one geometry (the same seconds, once)
    plan = sum({m["plan_s"] for m in metrics if m.get("plan_s") is not None})
    analysis = sum(m.get("analysis_s") or 0.0 for m in metrics)
    return {"grid": name, "trials": len(records), "finished": sum(r["status"] == "finished" for r in records),
            "wall_s": wall, "phase_s": busy, "plan_s": plan, "analysis_s": analysis, "slots": n_slots,
            "busy_fraction": covered_s(records) / (wall * gpus) if gpus else busy / (wall * n_slots),
            "phase_field": "accelerator_s" if any("accelerator_s" in (r.get("metrics") or {}) for r in records)
            else "train_s", "device": "cuda" if gpu else "cpu"}


def main() -> None:
    ap = argparse.ArgumentParser(description="Accelerator busy fraction of example sweeps (docs/clipping.md).")
    ap.add_argument("--grids", default="quickstart,digits")
    ap.add_argument("--small", action="store_true", help="a few one-epoch trials without audits (smoke run)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    results = []
    for name in args.grids.split(","):
        res = run(name, gpu=gpus > 0, gpus=gpus, small=args.small)
        results.append(res)
        unit = "GPUs" if gpus else "CPU slots"
        print(f"{name}: {res['finished']}/{res['trials']} trials finished in {res['wall_s']:.1f} s; "
              f"{res['phase_field']} summed {res['phase_s']:.1f} s over {res['slots']:g} {unit}: "
              f"busy fraction {res['busy_fraction']:.2f}; CPU phases: plan {res['plan_s']:.1f} s, "
              f"analysis {res['analysis_s']:.1f} s", flush=True)
    print(f"load average: {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
