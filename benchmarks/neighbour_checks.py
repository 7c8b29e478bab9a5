"""Benchmark: what the neighbouring-data checks of the plan-time code cost (`workers.neighbours`).

    python benchmarks/neighbour_checks.py [--workloads digits/mlp,fashion-mnist/cnn-small] [--rounds 3] [--json]

For each (dataset / model) with `dpsgd` at the issue's setting (2 epochs, batch 64, target epsilon 2, delta 1e-5,
seed 0), the plan phase runs in ONE process, first once to warm the imports, the worker's dataset cache and the
calibration cache (what a sweep's plan task finds after its first trial), then `--rounds` times. Reported: the
plan phase's CPU seconds (`time.process_time`, so the machine's load is not counted) with the check
(`neighbours_s`: the neighbour's load, model build and plan, and the row measures) and without it (the rest), as
medians, and the check's share of the plan phase. The check runs once per plan: the store's plan cache keeps its
findings with the plan.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # privbench from this checkout, without an install


def measure(dataset: str, model: str, rounds: int) -> dict[str, Any]:
    from workers.trial import as_config, plan_phase

    config = as_config(dict(sweep="b", trial_key="k", dataset=dataset, model=model, mechanism="dpsgd", epsilon=2.0,
                            delta=1e-5, seed=0, train=dict(epochs=2, batch_size=64), audit={"mode": "off"}))
    plan_phase(config)  # warm: imports, the worker's dataset cache, the calibration cache
    checks, rest, failed = [], [], set()
    for _ in range(rounds):
        c0 = time.process_time()
        planned = plan_phase(config)
        total = time.process_time() - c0
        checks.append(planned.timing["cpu"]["neighbours_s"])
        rest.append(total - checks[-1])
        failed |= {f.check for f in planned.findings if not f.passed}
    check, other = statistics.median(checks), statistics.median(rest)
    return {"workload": f"{dataset}/{model}", "check_cpu_s": round(check, 3),
            "plan_without_check_cpu_s": round(other, 3), "check_share": round(check / (check + other), 3),
            "failed_checks": sorted(failed)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="digits/mlp,breast-cancer/mlp")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = [measure(*w.split("/"), args.rounds) for w in args.workloads.split(",")]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['workload']:<24} check {r['check_cpu_s']:.3f} CPU s, plan without it "
                  f"{r['plan_without_check_cpu_s']:.3f} CPU s ({100 * r['check_share']:.0f}% of the plan phase); "
                  f"failed checks: {r['failed_checks'] or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
