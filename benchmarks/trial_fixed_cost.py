"""Benchmark: a trial's fixed cost, the CPU seconds of everything but its training steps and audits.

    python benchmarks/trial_fixed_cost.py [--grid examples/quickstart.yaml] [--examples 1024] [--warm 3]
                                          [--json out.json]

Each trial of the grid runs its phases in one fresh process, as a fresh Ray worker would (`cold`, imports
included), then again `--warm` times in the same process (`warm`, as a reused worker, whose caches hold the data);
the summary is each trial's median over the warm rounds, since one round moves by 0.1-0.3 s on a shared machine.
Training is shortened to one epoch of `--examples` examples (the fixed costs do not depend on the training's
length, but the plan's accounting does: hence `grid plan` below) and the
audits are kept. What is timed is this process's CPU time (`time.process_time`), not the wall clock: a shared,
loaded machine gives the cores to others at random moments, which the CPU time does not count.

Columns (CPU seconds): `imports` (torch, privbench), `plan` (the shortened trial's plan phase: data, model,
calibration; 0 when the trial needs no plan task), `grid plan` (the plan phase at the grid's own geometry, its
sample rate and steps, calibrated afresh: what a first sweep's plan task pays, once per geometry and shared by
the seeds; shortening the training changes the geometry, and with it what accounting costs), `accelerator` (its
phase) of which `steps` (the training steps), `overhead` (the paired overhead measurement) and `fixed` (the rest:
setup, evaluation, forward passes for the audits), and `analysis` (audits and the record).
`fixed` = accelerator - steps - overhead + analysis - audits: a trial's fixed cost when its plan is read from
the store (a second sweep of the geometry); `first` = fixed + grid plan: a first sweep's, with the whole plan
charged to this trial.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, dataclasses
sys.path.insert(0, {root!r})
t0 = time.process_time()
import torch
torch.set_num_threads(1)
from orchestrator import grid as grids
from workers import trial as T
from mechanisms.accounting import calibration
needs_plan = getattr(T, 'needs_plan_task', lambda c: True)  # older privbench: every trial had a plan task
imports = time.process_time() - t0
spec = grids.load({grid!r})
rows = []
for rnd in ("cold",) + ("warm",) * {warm}:
    for grid_config in spec.trials:
        config = dataclasses.replace(grid_config, train=dataclasses.replace(
            grid_config.train, epochs=1, max_train_examples={examples}), resources=dataclasses.replace(
            grid_config.resources, cpus=1, gpus=0))
        c0 = time.process_time()
        planned = T.plan_phase(config) if needs_plan(config) else None
        c1 = time.process_time()
        out = T.accelerator_phase(config, planned)
        c2 = time.process_time()
        planned = planned or out.planned  # no plan task: planned in the accelerator phase
        step = T.step_phase(config, planned)
        record = T.analysis_phase(config, planned, out, step)
        c3 = time.process_time()
        plan_grid = 0.0
        if needs_plan(grid_config):  # the first sweep's plan of this geometry
            calibration.calibrate_sigma.cache_clear()
            g0 = time.process_time()
            T.plan_phase(grid_config)
            plan_grid = time.process_time() - g0
            calibration.calibrate_sigma.cache_clear()
        cpu = (getattr(out, 'timing', None) or {{}}).get("cpu", {{}})
        m = record["metrics"]
        rows.append({{"round": rnd, "mechanism": config.mechanism, "epsilon": config.epsilon, "seed": config.seed,
                     "imports": imports if rnd == "cold" and not rows else 0.0,
                     "plan": c1 - c0, "plan_grid": plan_grid, "accelerator": c2 - c1,
                     "steps": cpu.get("training_s", m.get("train_s")),
                     "overhead": cpu.get("overhead_s", 0.0), "analysis": c3 - c2,
                     "audits": (record.get("timing") or {{}}).get("cpu", {{}}).get("audits_s", 0.0)}})
print(json.dumps(rows))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description="CPU seconds of a trial's fixed costs, cold and warm.")
    ap.add_argument("--grid", default=str(ROOT / "examples" / "quickstart.yaml"))
    ap.add_argument("--examples", type=int, default=1024)
    ap.add_argument("--warm", type=int, default=3, help="warm rounds; the summary is their median per trial")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    code = CHILD.format(root=str(ROOT), grid=args.grid, examples=args.examples, warm=args.warm)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{'round':5} {'trial':22} {'imports':>7} {'plan':>6} {'grid':>6} {'accel':>6} {'steps':>6} {'ovhd':>6} "
          f"{'analys':>6} {'audits':>6} {'fixed':>6} {'first':>6}")
    for r in rows:
        steps = r["steps"] or 0.0
        r["fixed"] = r["accelerator"] - steps - r["overhead"] + r["analysis"] - r["audits"]
        r["first"] = r["fixed"] + r["plan_grid"]
        name = f"{r['mechanism']} e={r['epsilon']} s={r['seed']}"
        print(f"{r['round']:5} {name:22} {r['imports']:7.2f} {r['plan']:6.2f} {r['plan_grid']:6.2f} "
              f"{r['accelerator']:6.2f} {steps:6.2f} {r['overhead']:6.2f} {r['analysis']:6.2f} {r['audits']:6.2f} "
              f"{r['fixed']:6.2f} {r['first']:6.2f}")
    print("CPU seconds (time.process_time) of one process, one thread; fixed = accelerator - steps - overhead "
          "+ analysis - audits (the plan read from the store); first = fixed + grid plan (a first sweep)")
    print("warm median per trial (CPU s): fixed / first / grid plan")
    names = dict.fromkeys(f"{r['mechanism']} e={r['epsilon']} s={r['seed']}" for r in rows)
    for name in names:
        warm = [r for r in rows if r["round"] == "warm" and f"{r['mechanism']} e={r['epsilon']} s={r['seed']}" == name]
        if warm:
            print(f"  {name:22} " + " / ".join(f"{statistics.median(r[k] for r in warm):.2f}"
                                              for k in ("fixed", "first", "plan_grid")))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
