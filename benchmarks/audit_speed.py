"""How long audits take: the mechanism-level audit on both paths, and the one-run canaries' overhead.

    python benchmarks/audit_speed.py [--full-samples 2000] [--json]

Prints wall times on this machine (2 shared cores: treat them as indicative, the load varies).
The full path at d = 100,000 is run with fewer samples and the per-value cost is reported with the
extrapolation to 20,000 samples per side labelled as such.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import mechanisms
from mechanisms.auditing import DiracCanaries, audit_step, step_spec


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def step_audits(full_samples: int) -> list[dict]:
    dpsgd, gredp = mechanisms.get("dpsgd"), mechanisms.get("gredp") if "gredp" in mechanisms.names() else None
    rows = []
    result, wall = timed(lambda: audit_step(dpsgd, step_spec(1.0, 1e-5), samples=20_000, dim=100_000))
    rows.append({"what": "dpsgd, support path", "dim": 100_000, "samples": 20_000, "wall_s": wall,
                 "epsilon_audited": result.epsilon_audited, "claim_status": result.claim_status})
    result, wall = timed(lambda: audit_step(dpsgd, step_spec(1.0, 1e-5), samples=full_samples, dim=100_000,
                                            path="full"))
    per_value_ns = wall / (2 * full_samples * 100_000) * 1e9
    rows.append({"what": "dpsgd, full path", "dim": 100_000, "samples": full_samples, "wall_s": wall,
                 "ns_per_value": per_value_ns,
                 "extrapolated_wall_s_at_20000": per_value_ns * 2 * 20_000 * 100_000 / 1e9,
                 "epsilon_audited": result.epsilon_audited, "claim_status": result.claim_status})
    if gredp is not None:
        result, wall = timed(lambda: audit_step(gredp, step_spec(1.0, 1e-5), samples=20_000, dim=1_000))
        rows.append({"what": "gredp, full path (FFT mixes coordinates)", "dim": 1_000, "samples": 20_000,
                     "wall_s": wall, "epsilon_audited": result.epsilon_audited,
                     "claim_status": result.claim_status})
    return rows


def one_run_overhead(steps: int = 30, m: int = 1000) -> dict:
    """A small MLP trained with privbench's DP-SGD, with and without m Dirac canaries."""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from mechanisms.catalog import dpsgd
    from mechanisms.parts.plan import PrivacySpec

    def run(with_canaries: bool) -> tuple[float, DiracCanaries | None]:
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(2048, 64), torch.randint(0, 10, (2048,)))
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        mech = dpsgd.mechanism
        plan = mech.plan(PrivacySpec(epsilon=None, delta=1e-5, dataset_size=2048, batch_size=128, epochs=1_000,
                                     sigma=1.0))
        model, opt, loader, crit = mech.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), data, plan,
                                                     criterion=nn.CrossEntropyLoss(),
                                                     generator=torch.Generator().manual_seed(0))
        canaries = DiracCanaries.attach_to(opt, m, sample_rate=plan.sample_rate) if with_canaries else None
        done, start = 0, time.perf_counter()
        while done < steps:
            for x, y in loader:
                opt.zero_grad()
                crit(model(x), y).backward()
                opt.step()
                done += 1
                if done == steps:
                    break
        return time.perf_counter() - start, canaries

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base, _ = run(False)
        with_c, canaries = run(True)
        estimate, estimate_s = timed(lambda: canaries.estimate(1e-5))
    return {"what": f"one-run canaries, MLP 64-128-10, {steps} steps, m={m}", "train_s": base,
            "train_with_canaries_s": with_c, "hook_overhead_s": canaries.overhead_s,
            "estimate_s": estimate_s, "epsilon_one_run": estimate.epsilon}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full-samples", type=int, default=2_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = step_audits(args.full_samples) + [one_run_overhead()]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for row in rows:
        print(" | ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
