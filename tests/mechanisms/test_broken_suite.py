"""The broken-mechanism suite: plugins whose privacy is broken, each caught, beside correct ones.

Each broken mechanism is written through the public contract as a researcher's plugin would be: six whose
analysis is wrong (tests/plugins/broken_mechs/broken_mechs.py) and seven that break privacy through the hooks
with privbench's own parts (broken_hooks.py). The default test reaches the first six's verdicts from the
trial's plan (claimed and certified epsilons, the contract check) and its one-step audit, as a trial does; the
hooks' are caught by checks of what ran, each exercised directly in
tests/mechanisms/framework/integrity/test_guard.py. The slow test runs the whole sweep on real Ray through
`plugins:` (training with every integrity check, the state replay, in-run canaries, the sweep's Holm correction)
and reads the leaderboard. No broken mechanism may be `ok`; the correct ones (built-in `dpsgd`, `dpsgd-adaclip`,
and the docs' adaptive-clipping plugin) are `ok` at the certified epsilon they had before the checks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

PLUGIN = Path(__file__).parents[1] / "plugins" / "broken_mechs"
GRID = PLUGIN / "broken.yaml"
EXPECTED = {
    "dpsgd": "ok", "dpsgd-adaclip": "ok",
    "broken-half-noise": "violated", "broken-batch-scaled-twice": "violated",
    "broken-ignores-release": "overclaimed", "broken-shuffle-as-poisson": "overclaimed",
    # broken-clip clips at 2C: uncertified by the contract, and violated by the audits that measure what runs (the
    # step audit's canary layer and the in-run canaries read a push of 2 plan units)
    "broken-noise-outside": "uncertified", "broken-clip": "violated",
}
# broken through the hooks -> the integrity check that catches it (the verdict: uncertified, with the reason)
HOOKS = {
    "broken-reused-noise": "noise_stream", "broken-hidden-state": "state_replay",
    "broken-bound-after-plan": "plan_parameters", "broken-scaled-sum": "observers",
    "broken-state-bound": "clip_range", "broken-model-update": "model_update",
    "broken-correlated-noise": "model_update",
}
# certified epsilon of the correct mechanisms on this grid before the integrity checks (issue 37): unchanged
CERTIFIED_BEFORE = {"dpsgd": 1.9989271503165622, "dpsgd-adaclip": 1.9999635179854525,
                    "docs-adaclip": 1.9999635179854525}


def test_each_verdict_from_the_plan_and_the_step_audit(monkeypatch):
    import mechanisms
    from mechanisms.framework.claims import claim_status
    from mechanisms.framework.integrity.verdict import plan_for
    from mechanisms.parts.plan import PrivacySpec
    from workers import plugins
    from workers.audit import step_audit
    from workers.config import AuditConfig

    monkeypatch.syspath_prepend(str(PLUGIN))
    plugins.load(["broken_mechs"])
    spec = PrivacySpec(epsilon=2.0, delta=1e-5, dataset_size=1437, batch_size=64, epochs=2, n_tensors=4,
                       model_dim=1000, tensor_sizes=(640, 10, 340, 10))
    verdicts = {}
    for name in EXPECTED:
        mechanism = mechanisms.get(name)
        plan = plan_for(mechanism, spec)
        audit = step_audit(mechanism, plan, spec.clip, AuditConfig(samples=20_000), {}, seed=0, workers=2)
        verdicts[name] = claim_status(plan.epsilon_claimed, plan.epsilon_certified, None,
                                      audit_violated=audit["audit_step_violated"])
    assert verdicts == EXPECTED


@pytest.mark.slow
def test_every_broken_mechanism_is_caught_in_a_sweep_and_the_correct_ones_stay_ok(tmp_path, own_ray):
    from dashboards.leaderboard import rows
    from privbench import Sweep

    sweep = Sweep(GRID, store=tmp_path / "store")
    summary = sweep.run()
    assert not summary.failures, [f.get("error") for f in summary.failures]
    records = {r["config"]["mechanism"]: r for r in sweep.records()}
    board = {row.mechanism: row for row in rows(sweep.records())}
    assert {name: row.claim_status for name, row in board.items() if name not in HOOKS} == EXPECTED | {
        "docs-adaclip": "ok"}
    for name, check in HOOKS.items():  # never ok: uncertified by the check, or violated if the canaries see it too
        assert board[name].claim_status in ("uncertified", "violated"), (name, board[name].claim_status)
        privacy = records[name]["privacy"]
        assert privacy["integrity_checks"][check] is False, (name, privacy["integrity_checks"])
        assert any(f.startswith(f"{check}: ") for f in privacy["integrity_failed"]), privacy["integrity_failed"]
        assert check in board[name].uncertified_reason and board[name].epsilon_certified is None
    for name, before in CERTIFIED_BEFORE.items():  # the correct ones: every check passed, the same certificate
        privacy = records[name]["privacy"]
        assert privacy["integrity_failed"] == [] and all(privacy["integrity_checks"].values()), privacy
        assert board[name].epsilon_certified == pytest.approx(before, rel=1e-9)
    for name in ("broken-noise-outside", "broken-clip"):  # the reason says what stepped outside
        assert board[name].epsilon_certified is None and board[name].uncertified_reason, name
    assert "make_private" in board["broken-noise-outside"].uncertified_reason
    assert "DeclaredClip" in board["broken-clip"].uncertified_reason
    for row in board.values():  # no audited epsilon above its ceiling goes unflagged
        assert not row.audit_above_ceiling or row.claim_status == "violated", row.mechanism
