"""What honest tuning costs in epsilon, for a DP-SGD run shaped like the digits tuning example.

    python benchmarks/tuning_cost.py            # markdown tables: budget per-run, then budget total
    python benchmarks/tuning_cost.py --json     # one JSON object on stdout

Geometry (the planned `examples/tuning.yaml`): digits with a 20% test split and a 10% validation split
carved from the training pool, so N = 1,258 training records; Poisson sampling at q = 64 / 1258, 5 epochs
of round(N / B) = 20 steps (T = 100); delta 1e-5. For each target epsilon, each run-count distribution
(negative-binomial with shape 0.5) and each mean number of candidates:

* `per-run`: sigma calibrated for one run (PLD, as an ordinary trial); the selection's epsilon on top
  (RDP, the only accountant with Papernot & Steinke's analysis). The run's own RDP epsilon is shown too,
  so the tuning overhead is not confused with RDP's looseness against PLD. `fixed N` is what a grid of N
  = mean fixed runs certifies (their N-fold composition, PLD): the sound bound for picking the best of a
  fixed grid.
* `total`: the sigma each candidate needs so that the whole selection meets the target, against the
  per-run sigma; the achieved selection epsilon, and what one such candidate alone certifies (PLD).

Numbers, not timings: the script is deterministic (it takes about a minute on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import json
import sys

from mechanisms.accounting.compare import DpsgdSetting
from mechanisms.accounting.tuning_cost import RunCount, account, fixed_runs_epsilon

DELTA = 1e-5
N_TRAIN, BATCH, EPOCHS = 1258, 64, 5
FAMILY = DpsgdSetting.of("poisson", N_TRAIN, BATCH, EPOCHS, DELTA).parts()
TARGETS = (1.0, 2.0, 8.0)
MEANS = (4, 8, 16)
SHAPE = 0.5


def run_counts(mean: int) -> list[RunCount]:
    return [RunCount("poisson", mean), RunCount("geometric", mean), RunCount("logarithmic", mean),
            RunCount("negative-binomial", mean, SHAPE)]


def measure() -> list[dict]:
    rows = []
    for target in TARGETS:
        for mean in MEANS:
            for runs in run_counts(mean):
                per_run = account((FAMILY,), runs, target, DELTA, "per-run")
                total = account((FAMILY,), runs, target, DELTA, "total")
                fixed = fixed_runs_epsilon([FAMILY(per_run.sigmas[0])] * mean, DELTA)
                rows.append({
                    "target": target, "mean": mean, "distribution": runs.label(),
                    "sigma_run": per_run.sigmas[0], "eps_run": per_run.epsilon_run,
                    "eps_run_rdp": per_run.epsilon_run_rdp, "eps_tuned": per_run.epsilon_tuned,
                    "eps_fixed_n": fixed,
                    "sigma_total": total.sigmas[0], "eps_tuned_total": total.epsilon_tuned,
                    "eps_run_total": total.epsilon_run,
                })
    return rows


def summary(rows: list[dict]) -> list[str]:
    """One row per (target, mean): per-run sigma's selection epsilon, and the total budget's sigma ratio."""
    names = [r.label().split("(")[0] for r in run_counts(1)]
    lines = ["| target eps | eps run (PLD / RDP) | mean K | " + " | ".join(f"{n}: eps tuned, sigma x" for n in names)
             + " | fixed N composed |", "|---" * (4 + len(names)) + "|"]
    for target in TARGETS:
        for mean in MEANS:
            cells = [r for r in rows if r["target"] == target and r["mean"] == mean]
            first = cells[0]
            lines.append(f"| {target:g} | {first['eps_run']:.2f} / {first['eps_run_rdp']:.2f} | {mean} | "
                         + " | ".join(f"{r['eps_tuned']:.2f}, {r['sigma_total'] / r['sigma_run']:.2f}"
                                      for r in cells) + f" | {first['eps_fixed_n']:.2f} |")
    return lines


def markdown(rows: list[dict]) -> str:
    lines = [f"DP-SGD on digits: N = {N_TRAIN}, q = {BATCH}/{N_TRAIN}, T = {FAMILY.steps}, delta = {DELTA:g}; "
             f"negative-binomial shape {SHAPE}", "",
             "summary: eps tuned = the selection's epsilon at the per-run sigma; sigma x = the sigma budget "
             "total needs over the per-run sigma", "", *summary(rows), "",
             "budget: per-run (sigma for one run at the target)", "",
             "| target eps | mean K | distribution | sigma | eps run (PLD) | eps run (RDP) | eps tuned (RDP) "
             "| x target | fixed N = mean, composed (PLD) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['target']:g} | {r['mean']} | {r['distribution'].split('(')[0]} | {r['sigma_run']:.4f} "
                     f"| {r['eps_run']:.3f} | {r['eps_run_rdp']:.3f} | {r['eps_tuned']:.3f} "
                     f"| {r['eps_tuned'] / r['target']:.2f} | {r['eps_fixed_n']:.3f} |")
    lines += ["", "budget: total (sigma for the whole selection at the target)", "",
              "| target eps | mean K | distribution | sigma per-run | sigma total | ratio | eps tuned (RDP) "
              "| eps of one candidate (PLD) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['target']:g} | {r['mean']} | {r['distribution'].split('(')[0]} | {r['sigma_run']:.4f} "
                     f"| {r['sigma_total']:.4f} | {r['sigma_total'] / r['sigma_run']:.2f} "
                     f"| {r['eps_tuned_total']:.4f} | {r['eps_run_total']:.3f} |")
    worst = max(r["eps_tuned_total"] / r["target"] for r in rows)
    lines += ["", f"every budget-total selection <= its target: {worst <= 1} (largest ratio {worst:.6f})"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    rows = measure()
    if args.json:
        json.dump({"n_train": N_TRAIN, "batch_size": BATCH, "steps": FAMILY.steps, "delta": DELTA,
                   "shape": SHAPE, "rows": rows}, sys.stdout)
        print()
    else:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
