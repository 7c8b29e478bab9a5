"""Tightness of the one-run audit on real trials: audited / certified and ceiling / certified, before and after.

    python benchmarks/audit_tightness.py [--workload quickstart|digits|gredp|shuffled] [--epsilon 1 8] [--json]

`quickstart` is examples/quickstart.yaml's DP-SGD trial (Fashion-MNIST, cnn-small, 5 epochs, batch 512,
seed 0; ~3-8 minutes a trial on 2 shared cores); `digits` the MLP-32 of examples/gredp.yaml with DP-SGD;
`gredp` and `shuffled` those examples' broken mechanisms at their settings. "before" is the estimate
the platform reported before issue 14 (1,000 canaries, summed residual, Steinke over every threshold),
measured with `--before`.
"""

from __future__ import annotations

import argparse
import json

from workers.trial import run_trial

WORKLOADS = {
    "quickstart": dict(dataset="fashion-mnist", model="cnn-small", mechanism="dpsgd",
                       train=dict(epochs=5, batch_size=512, lr=4.0, optimizer="sgd", clip=1.0)),
    "digits": dict(dataset="digits", model="mlp", mechanism="dpsgd", model_options={"hidden": 32},
                   train=dict(epochs=30, batch_size=64, lr=0.5, optimizer="sgd", clip=1.0)),
    "gredp": dict(dataset="digits", model="mlp", mechanism="gredp", model_options={"hidden": 32},
                  mechanism_options={"noise": "complex", "fft": "unitary", "clipping": "flat"},
                  train=dict(epochs=30, batch_size=64, lr=0.5, optimizer="sgd", clip=1.0)),
    "shuffled": dict(dataset="digits", model="vit-tiny", mechanism="shuffled-dpsgd",
                     mechanism_options={"batch_clip_ratio": 16},
                     train=dict(epochs=30, batch_size=128, lr=0.001, optimizer="adam", clip=1.0)),
}
KEYS = ("epsilon_claimed", "epsilon_certified", "epsilon_audited", "epsilon_audited_steinke", "epsilon_audited_fdp",
        "epsilon_audited_fdp_gdp", "epsilon_audited_legacy", "audit_ceiling", "audit_tightness",
        "audit_ceiling_tightness", "audit_canaries", "audit_guesses", "audit_s", "audit_time_ratio", "mia_auc",
        "mia_tpr_at_0_1pct_fpr",
        "epsilon_audited_curve", "epsilon_audited_noise", "audit_sigma_measured", "sigma", "audit_run_violated",
        "audit_plan_s", "audit_family_s", "audit_canary_push", "audit_canary_push_se", "audit_violations",
        "audit_above_ceiling", "claim_status")


def run(workload: str, epsilon: float, before: bool, seed: int = 0) -> dict:
    audit = {"mode": "one-run"} | ({"canaries": 1000, "statistic": "sum", "mia": "off"} if before else {})
    cfg = WORKLOADS[workload] | dict(sweep="tightness", trial_key=f"{workload}-{epsilon}", epsilon=epsilon,
                                     delta=1e-5, seed=seed, calibration="claimed", accountant="pld", audit=audit)
    record = run_trial(cfg)
    if record["status"] != "finished":
        raise RuntimeError(record["traceback"])
    row = {k: record["privacy"].get(k) for k in KEYS}
    return {"workload": workload, "epsilon": epsilon, "before": before, "accuracy": record["metrics"]["accuracy"],
            "train_s": record["metrics"]["train_s"]} | row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="digits")
    parser.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 8.0])
    parser.add_argument("--before", action="store_true", help="the pre-issue-14 audit configuration")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for eps in args.epsilon:
        row = run(args.workload, eps, args.before)
        print(json.dumps(row) if args.json else "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                          for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
