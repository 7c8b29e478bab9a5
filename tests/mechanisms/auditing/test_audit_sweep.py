"""The one-run audit measures what ran, in a real sweep: an engine clipping at 2C after planning, a clipped sum
doubled before the noise and noise reused every step are `violated` with the audit's words, beside `dpsgd`,
which stays `ok` (tests/plugins/audit_mechs/ holds the three plugins). The default test runs each step on the
one-step audit's canary layer; the slow ones train each in-process, and run the whole sweep on Ray through
`plugins:` and read the leaderboard."""

from __future__ import annotations

from pathlib import Path

import pytest

PLUGIN = Path(__file__).parents[2] / "plugins" / "audit_mechs"
GRID = PLUGIN / "audit.yaml"
WORDS = {"audit-engine-2c": "canaries pushed beyond the bound", "audit-sum-doubled": "canaries pushed beyond the bound",
         "audit-reused-noise": "noise repeats across steps"}


def trial(mechanism: str, epochs: int) -> dict:
    from workers.trial import run_trial

    record = run_trial(dict(sweep="s", trial_key=mechanism, dataset="digits", model="mlp", mechanism=mechanism,
                            epsilon=2.0, delta=1e-5, seed=0, plugins=["audit_mechs"],
                            train=dict(epochs=epochs, batch_size=64, lr=0.5),
                            audit={"mode": "one-run", "mia": "off", "canaries": 2410}))
    assert record["status"] == "finished", record.get("traceback")
    return record["privacy"]


@pytest.mark.parametrize("mechanism", ["dpsgd", *WORDS])
def test_the_step_audits_canary_layer_runs_the_mechanisms_own_step(monkeypatch, mechanism):
    """The one-step audit's canary layer (`step_probe`): the mechanism's own make_private and post-processing on a
    linear layer, its canaries measured in the plan's units."""
    import mechanisms
    from mechanisms.framework.integrity.verdict import plan_for
    from mechanisms.parts.plan import PrivacySpec
    from workers import plugins
    from workers.audit import step_probe

    monkeypatch.syspath_prepend(str(PLUGIN))
    plugins.load(["audit_mechs"])
    m = mechanisms.get(mechanism)
    out = step_probe(m, plan_for(m, PrivacySpec(epsilon=2.0, delta=1e-5, dataset_size=1437, batch_size=64,
                                                epochs=2)), seed=0)
    assert out["audit_step_probe_steps"] == 32
    if mechanism == "dpsgd":
        assert out["audit_step_probe_push"] == pytest.approx(1.0, abs=0.15)
        assert out["audit_step_probe_p_value"] > 0.01 and "audit_step_probe_findings" not in out
    elif mechanism == "audit-reused-noise":
        assert out["audit_step_probe_p_value"] < 1e-6
        assert any("repeats" in words for words in out["audit_step_probe_findings"])
    else:
        assert out["audit_step_probe_push"] == pytest.approx(2.0, abs=0.2)
        assert out["audit_step_probe_p_value"] < 1e-6 and "2" in out["audit_step_probe_findings"][0]


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["dpsgd", *WORDS])
def test_each_step_bug_is_violated_by_the_audit_in_words(monkeypatch, mechanism):
    monkeypatch.syspath_prepend(str(PLUGIN))
    p = trial(mechanism, epochs=2)
    if mechanism == "dpsgd":
        assert p["claim_status"] == "ok" and not p.get("audit_findings"), p.get("audit_findings")
        assert p["audit_canary_push"] == pytest.approx(1.0, abs=5 * p["audit_canary_push_se"] + 0.05)
        assert all(p["integrity_checks"][c] for c in ("audit_push", "audit_noise", "audit_ceiling"))
        return
    assert p["claim_status"] == "violated"
    assert WORDS[mechanism] in p["audit_violations"], p.get("audit_findings")
    assert p["integrity_checks"]["audit_push" if "pushed" in WORDS[mechanism] else "audit_noise"] is False
    if mechanism != "audit-reused-noise":
        assert p["audit_canary_push"] > 1.5


@pytest.mark.slow
def test_the_step_bugs_are_violated_in_a_sweep_and_dpsgd_stays_ok(tmp_path):
    import ray

    from dashboards.leaderboard import rows
    from privbench import Sweep

    ray.shutdown()  # the sweep starts its own local Ray, which ships the grid's plugins: module to its workers
    try:
        sweep = Sweep(GRID, store=tmp_path / "store")
        summary = sweep.run()
        assert not summary.failures, [f.get("error") for f in summary.failures]
        board = {row.mechanism: row for row in rows(sweep.records())}
    finally:
        ray.shutdown()
    assert board["dpsgd"].claim_status == "ok" and board["dpsgd"].audit_violation is None
    for name, words in WORDS.items():
        assert board[name].claim_status == "violated", name
        assert words in (board[name].audit_violation or ""), (name, board[name].audit_violation)
