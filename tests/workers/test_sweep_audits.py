"""A 50-trial sweep of a correct mechanism shows no `violated`, while a broken one among them still does.

The 50 step audits are those a trial runs (`workers.audit.step_audit` at the default `AuditConfig`: 20,000
samples per side, dim 1000, significance 0.001), one per trial at the sweep's sigmas and seeds; the training
runs around them are left out (they do not change the step audit). Their records go through the leaderboard,
which applies Holm over the sweep: the family-wise error (any correct claim called violated) is at most 0.1%.
"""

from __future__ import annotations

import types

from dashboards.leaderboard import rows
from mechanisms import get
from mechanisms.framework.claims import claim_status
from storage.verdicts import sweep_claim_statuses
from workers.audit import AuditConfig, step_audit

SIGMAS = {1.0: 4.0, 2.0: 1.8, 8.0: 0.6, 0.5: 8.0, 4.0: 1.1}  # target epsilon -> a sweep's noise multiplier


def trial_record(mechanism: str, eps: float, sigma: float, seed: int, certified: float) -> dict:
    plan = types.SimpleNamespace(sigma=sigma, delta=1e-5)
    audit = step_audit(get(mechanism), plan, 1.0, AuditConfig(), {}, seed, 1)
    claimed = eps  # run-level claim and certificate (the accountant's); the step audit is what is under test
    privacy = audit | {
        "epsilon_claimed": claimed, "epsilon_certified": certified, "epsilon_audited": None, "sigma": sigma,
        "claim_status": claim_status(claimed, certified, None, audit_violated=audit["audit_step_violated"]),
        "claim_status_without_step": claim_status(claimed, certified, None)}
    config = {"dataset": "digits", "model": "mlp", "mechanism": mechanism, "epsilon": eps, "seed": seed}
    return {"sweep": "clean", "trial_key": f"{mechanism}-{eps}-{seed}", "status": "finished", "config": config,
            "metrics": {"accuracy": 0.9}, "privacy": privacy}


def test_fifty_correct_dpsgd_audits_show_no_violation_and_a_broken_trial_still_does():
    records = [trial_record("dpsgd", eps, sigma, seed, eps) for eps, sigma in SIGMAS.items() for seed in range(10)]
    assert len(records) == 50
    p = sorted(r["privacy"]["audit_step_p_value"] for r in records)
    assert all(r["privacy"]["audit_step_significance"] == 0.001 for r in records)
    board = rows(records)
    assert [r.claim_status for r in board] == ["ok"] * len(SIGMAS), p[:5]
    assert sweep_claim_statuses(records) == ["ok"] * 50

    # soundness kept: GReDP (noise sigma / sqrt 2, certified above its claim) in the same sweep is refuted
    broken = trial_record("gredp", 2.0, 1.8, 0, 2.0 * 1.5)
    assert broken["privacy"]["audit_step_p_value"] < 1e-10
    statuses = sweep_claim_statuses([*records, broken])
    assert statuses == ["ok"] * 50 + ["violated"]
    assert {r.mechanism: r.claim_status for r in rows([*records, broken])}["gredp"] == "violated"
