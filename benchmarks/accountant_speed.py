"""Benchmark: calibrating sigma with PLD, ours vs dp-accounting's `calibrate_dp_mechanism`, same run.

    python benchmarks/accountant_speed.py            # full grid (T up to 20,000), a few minutes
    python benchmarks/accountant_speed.py --quick    # three settings
    python benchmarks/accountant_speed.py --json     # one JSON object on stdout

Both sides use the same PLD accountant (discretisation 1e-3) and the same relative tolerance on sigma
(dp-accounting's `tol` is absolute, so it gets rel_tol * sigma). dp-accounting starts from
`LowerEndpointAndGuess(--baseline-lower, 1.0)`: the shipped calibration used 0.01 (360 s for one 702-step
setting); 0.1 is the default here so that the baseline is not handicapped by a silly bracket.
Our time includes the RDP bracketing and starts from an empty cache. Timings are wall-clock on a
shared machine: read the ratio, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from dp_accounting import mechanism_calibration

from mechanisms.accounting.calibration import calibrate_sigma
from mechanisms.accounting.compare import DpsgdSetting
from mechanisms.accounting.reference import FRESH
from mechanisms.accounting.sound import epsilon

DELTA = 1e-5
MNIST_Q = 256 / 60000
FULL = [(MNIST_Q, steps, eps) for steps in (702, 2_000, 5_000, 14_063, 20_000) for eps in (1.0, 3.0, 8.0)]
FULL += [(4096 / 50000, 2_500, 8.0), (1024 / 67349, 198, 3.0)]
QUICK = [(MNIST_Q, 702, 8.0), (MNIST_Q, 14_063, 3.0), (MNIST_Q, 20_000, 1.0)]


def run_one(sample_rate: float, steps: int, target: float, rel_tol: float, baseline_lower: float) -> dict:
    events = DpsgdSetting.poisson(sample_rate, steps, 0.5).parts()
    calibrate_sigma.cache_clear()
    start = time.perf_counter()
    ours = calibrate_sigma(events, target, DELTA, "pld", rel_tol)
    ours_s = time.perf_counter() - start

    start = time.perf_counter()
    theirs = mechanism_calibration.calibrate_dp_mechanism(
        FRESH["pld"], events, target, DELTA,
        bracket_interval=mechanism_calibration.LowerEndpointAndGuess(baseline_lower, 1.0),
        tol=rel_tol * ours.sigma)
    theirs_s = time.perf_counter() - start
    theirs_eps = epsilon(events(theirs), DELTA, "pld")
    return {
        "sample_rate": sample_rate, "steps": steps, "epsilon_target": target,
        "sigma_ours": ours.sigma, "epsilon_ours": ours.epsilon, "pld_evaluations_ours": ours.evaluations,
        "seconds_ours": ours_s,
        "sigma_dp_accounting": float(theirs), "epsilon_dp_accounting": theirs_eps,
        "seconds_dp_accounting": theirs_s,
        "sigma_rel_diff": ours.sigma / float(theirs) - 1, "speedup": theirs_s / ours_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three settings instead of the full grid")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--rel-tol", type=float, default=1e-3)
    parser.add_argument("--baseline-lower", type=float, default=0.1,
                        help="lower endpoint of dp-accounting's bracket search")
    args = parser.parse_args(argv)
    rows = []
    for sample_rate, steps, target in (QUICK if args.quick else FULL):
        row = run_one(sample_rate, steps, target, args.rel_tol, args.baseline_lower)
        rows.append(row)
        if not args.json:
            print(f"q={sample_rate:.5f} T={steps:>6} eps={target:<4g} ours {row['sigma_ours']:.5f} "
                  f"({row['seconds_ours']:.2f}s, {row['pld_evaluations_ours']} PLD evals) | dp-accounting "
                  f"{row['sigma_dp_accounting']:.5f} ({row['seconds_dp_accounting']:.2f}s) | "
                  f"x{row['speedup']:.1f}", file=sys.stderr, flush=True)
    total_ours = sum(r["seconds_ours"] for r in rows)
    total_theirs = sum(r["seconds_dp_accounting"] for r in rows)
    summary = {
        "rel_tol": args.rel_tol, "baseline_lower": args.baseline_lower, "rows": rows,
        "total_seconds_ours": total_ours, "total_seconds_dp_accounting": total_theirs,
        "speedup_total": total_theirs / total_ours,
        "speedup_median": statistics.median(r["speedup"] for r in rows),
        "speedup_min": min(r["speedup"] for r in rows),
        "max_seconds_ours": max(r["seconds_ours"] for r in rows),
        "max_abs_sigma_rel_diff": max(abs(r["sigma_rel_diff"]) for r in rows),
        "all_at_or_below_target": all(r["epsilon_ours"] <= r["epsilon_target"] for r in rows),
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print("| q | T | target eps | sigma (ours) | sigma (dp-accounting) | PLD evals (ours) | s (ours) "
          "| s (dp-accounting) | speed-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['sample_rate']:.5f} | {r['steps']} | {r['epsilon_target']:g} | {r['sigma_ours']:.4f} | "
              f"{r['sigma_dp_accounting']:.4f} | {r['pld_evaluations_ours']} | {r['seconds_ours']:.2f} | "
              f"{r['seconds_dp_accounting']:.2f} | {r['speedup']:.1f}x |")
    print(f"\ntotal {total_ours:.1f}s vs {total_theirs:.1f}s: x{summary['speedup_total']:.1f} overall, "
          f"median x{summary['speedup_median']:.1f}, min x{summary['speedup_min']:.1f}; "
          f"max sigma difference {summary['max_abs_sigma_rel_diff']:.2e}; "
          f"all achieved <= target: {summary['all_at_or_below_target']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
