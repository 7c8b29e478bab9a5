"""The input-canary audit in real trials: real examples through the loader's batches, the model, the loss and the
step, scored on the final model. A pipeline that adds no noise is `violated` by it alone; correct DP-SGD stays
`ok` with its bound below the certified epsilon."""

from __future__ import annotations

from pathlib import Path

import pytest

from mechanisms.framework.claims import claim_status
from workers.trial import run_trial

PLUGINS = str(Path(__file__).parents[1] / "plugins" / "no_noise")
# long enough for a run without noise to memorise its canaries (a DP-SGD step moves one example by lr C / B)
MEMORISING = dict(epochs=50, batch_size=64, lr=4.0)
# the one-run audit with the input canaries only in the verdict: no family bounds, no ceiling, no MIA, and few
# gradient canaries (no simulation to choose their count)
INPUT_ONLY = {"mode": "one-run", "family_bounds": False, "ceiling": False, "mia": "off", "canaries": 50}


def trial(mechanism: str, epsilon: float = 2.0, seed: int = 0, train: dict | None = None, **over) -> dict:
    cfg = dict(sweep="t", trial_key="k", dataset="digits", model="mlp", mechanism=mechanism, epsilon=epsilon,
               delta=1e-5, seed=seed, train=train or dict(epochs=2, batch_size=64, lr=0.5),
               audit=INPUT_ONLY) | over
    record = run_trial(cfg)
    assert record["status"] == "finished", record["traceback"]
    return record["privacy"]


@pytest.fixture
def no_noise(monkeypatch):
    """The plugin module beside the broken pipelines: importable by name, as a grid's `plugins:` is."""
    monkeypatch.syspath_prepend(PLUGINS)
    return ["no_noise"]


def test_a_pipeline_without_noise_is_violated_by_the_input_canaries_alone(no_noise):
    p = trial("broken-no-noise", 1.0, train=MEMORISING, plugins=no_noise)
    assert p["epsilon_claimed"] == pytest.approx(1.0, abs=0.01)
    assert p["epsilon_audited_input"] > p["epsilon_claimed"] and p["claim_status"] == "violated"
    # by this audit alone: its bound against the claim, with every other audit's outcome left out
    assert claim_status(p["epsilon_claimed"], p["epsilon_claimed"], None,
                        epsilon_audited_input=p["epsilon_audited_input"]) == "violated"
    assert "input canaries above claim" in p["audit_violations"]
    assert p["integrity_checks"]["audit_input_canaries"] is False
    assert any(f.startswith("audit_input_canaries: the input canaries") for f in p["integrity_failed"])
    assert p["audit_input_canaries"] == 719 and 300 < p["audit_input_included"] < 420


def test_the_non_private_reference_under_a_claim_of_2_is_violated_by_them_alone(no_noise):
    """Nothing clipped and 3% of the noise (`broken-unclipped`: its own clipper, so no certificate): trained long
    enough to learn its examples, it is `violated` by the input canaries alone."""
    p = trial("broken-unclipped", 2.0, train=dict(epochs=40, batch_size=64, lr=0.5), plugins=no_noise)
    assert p["epsilon_certified"] is None and p["epsilon_audited_input"] > 2.0 * 1.1
    assert claim_status(p["epsilon_claimed"], None, None, epsilon_audited_input=p["epsilon_audited_input"]) == \
        "violated" == p["claim_status"]
    assert p["integrity_checks"]["audit_input_canaries"] is False


def test_correct_dpsgd_at_the_same_settings_is_ok_and_its_bound_below_certified():
    p = trial("dpsgd", 1.0, train=MEMORISING)
    assert p["claim_status"] == "ok" and p["integrity_checks"]["audit_input_canaries"] is True
    assert 0 <= p["epsilon_audited_input"] <= p["epsilon_certified"]


def test_the_canaries_join_the_steps_at_the_plan_rate():
    """The issue's digits setting (q 0.0445, T 44): the included canaries' rows are in the batches the step trains
    on, about q T of them each, and the run's plan (N, q, T) is the one without them."""
    p = trial("dpsgd", audit=INPUT_ONLY | {"input_canaries": 400})
    rows, expected = p["audit_input_rows"], p["audit_input_included"] * p["sample_rate"] * p["steps"]
    assert abs(rows - expected) < 5 * expected ** 0.5 and p["steps"] == 44
    assert p["audit_input_canaries"] == 400 and p["audit_input_s"] > 0 and p["audit_input_guesses"] >= 0


def test_off_and_skipped():
    off = trial("dpsgd", audit=INPUT_ONLY | {"input_canaries": 0})
    assert "epsilon_audited_input" not in off and "audit_input_skipped" not in off
    shuffled = trial("dpsgd", sampler="shuffle", train=dict(epochs=1, batch_size=64, lr=0.5))
    assert "Poisson" in shuffled["audit_input_skipped"] and "epsilon_audited_input" not in shuffled
    step_only = trial("dpsgd", audit={"mode": "step", "dim": 50, "samples": 2000})
    assert "epsilon_audited_input" not in step_only  # they run with the one-run audit


def test_a_bad_count_is_one_line_before_anything_runs():
    from workers.config import AuditConfig, ConfigError, section

    with pytest.raises(ConfigError, match="input_canaries must be >= 0"):
        section(AuditConfig, {"input_canaries": -1}, "audit")
    with pytest.raises(ConfigError, match="input_canaries"):
        section(AuditConfig, {"input_canaries": "many"}, "audit")


def test_the_output_round_trips_through_json():
    import json

    import numpy as np

    from workers.audit import InputCanaryResult
    from workers.trial import AcceleratorOutput

    result = InputCanaryResult(np.array([0.5, -1.0]), np.array([True, False]), 7, 0.25)
    out = AcceleratorOutput({}, {}, {}, None, None, {}, 1.0, input_canaries=result)
    back = AcceleratorOutput.from_dict(json.loads(json.dumps(out.to_dict()))).input_canaries
    assert np.array_equal(back.scores, result.scores) and np.array_equal(back.included, result.included)
    assert (back.rows, back.seconds, back.skipped) == (7, 0.25, None)
