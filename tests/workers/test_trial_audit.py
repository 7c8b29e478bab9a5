"""A trial runs its audits: the reference is never violated, GReDP's per-step claim is refuted."""

from __future__ import annotations

import pytest

from workers.trial import run_trial


def trial(mechanism: str, **over) -> dict:
    cfg = dict(sweep="t", trial_key="k", dataset="digits", model="mlp", mechanism=mechanism, epsilon=2.0,
               delta=1e-5, seed=0, train=dict(epochs=2, batch_size=64, lr=0.5),
               audit={"mode": "both", "canaries": 300, "samples": 20000, "dim": 200}) | over
    record = run_trial(cfg)
    assert record["status"] == "finished", record["traceback"]
    return record["privacy"]


def test_dpsgd_trial_is_audited_and_ok():
    p = trial("dpsgd")
    assert p["claim_status"] == "ok" and p["audit_step_violated"] is False
    assert p["audit_step_significance"] == 0.001 < p["audit_step_p_value"] <= 1  # what Holm over a sweep needs
    assert p["claim_status_without_step"] == "ok"
    assert 0 <= p["epsilon_audited"] <= p["epsilon_certified"]
    assert p["mu_audited"] < p["mu_claimed"]


def test_one_run_fields_bounds_ceiling_mia_and_cost():
    """`canaries: auto`, LR statistic: both bounds, their max, the ceiling, the MIA view and what it cost."""
    p = trial("dpsgd", audit={"mode": "one-run"}, train=dict(epochs=4, batch_size=64, lr=0.5))
    assert p["epsilon_audited"] == max(p["epsilon_audited_steinke"], p["epsilon_audited_fdp"])
    assert 0 < p["epsilon_audited"] <= p["epsilon_certified"]
    assert 0 < p["audit_ceiling"] <= p["epsilon_certified"]
    assert p["audit_tightness"] == pytest.approx(p["epsilon_audited"] / p["epsilon_certified"])
    assert p["audit_canaries"] >= 2410 and p["audit_statistic"] == "lr" and len(p["audit_ceiling_guess_counts"]) == 3
    assert p["epsilon_audited_legacy"] is not None and p["epsilon_audited_legacy"] <= p["epsilon_audited"] + 0.5
    assert 0.3 < p["mia_auc"] < 0.8 and 0 <= p["mia_tpr_at_0_1pct_fpr"] <= 1 and p["mia_examples"] > 100
    assert p["audit_s"] > 0 and p["audit_time_ratio"] > 1


def test_the_guesses_are_fixed_in_the_analysis_from_pre_run_quantities_only():
    """The accelerator phase leaves the guess counts and the ceiling to the analysis; they come out as the
    simulations at the run's canary count, shape, parameter count and seed say, whatever the canaries saw."""
    import dataclasses

    import numpy as np

    from mechanisms.auditing import white_box
    from workers import trial as phases
    from workers.audit import planned_guesses

    config = phases.as_config(dict(sweep="t", trial_key="k", dataset="digits", model="mlp", mechanism="dpsgd",
                                   epsilon=2.0, delta=1e-5, seed=3, train=dict(epochs=2, batch_size=64, lr=0.5),
                                   audit={"mode": "one-run", "canaries": 300}))
    planned = phases.plan_phase(config)
    out = phases.accelerator_phase(config, planned).one_run
    assert out.observations.guess_counts is None and out.ceiling is None and out.seed == 3 and out.n_params > 300
    sigma, rate, steps = out.shape
    expected = white_box.plan_guesses(300, steps, rate, sigma, 1e-5, seed=3, layout_n=out.n_params)
    fixed = planned_guesses(out, config.audit, 1e-5)
    assert fixed.observations.guess_counts == expected.guess_counts
    assert fixed.ceiling[0] == expected.ceiling.epsilon_audited and fixed.plan_s > out.plan_s
    shuffled = dataclasses.replace(out, observations=dataclasses.replace(
        out.observations, scores=np.random.default_rng(0).permutation(out.observations.scores)))
    assert planned_guesses(shuffled, config.audit, 1e-5).observations.guess_counts == expected.guess_counts
    assert planned_guesses(fixed, config.audit, 1e-5) is fixed


def test_nonprivate_trial_gets_the_mia_view_only():
    p = trial("nonprivate", epsilon=None, audit={"mode": "both"})
    assert p["epsilon_audited"] is None and "audit_ceiling" not in p
    assert 0 <= p["mia_auc"] <= 1 and "mia_tpr_at_0_1pct_fpr" in p


def test_gredp_trial_is_violated_by_the_step_audit():
    p = trial("gredp")
    assert p["audit_step_violated"] is True and p["claim_status"] == "violated"
    # refuted by the step audit beyond any Holm correction, and by the run-level noise measurement without it
    assert p["audit_step_p_value"] < 1e-10 and p["claim_status_without_step"] == "violated"
    assert p["epsilon_certified"] > p["epsilon_claimed"]


def test_gredp_is_violated_at_run_level_without_the_step_audit():
    """One-run mode only: the white-box noise measurement reads GReDP's sigma / sqrt 2 off the released updates,
    so the run-level bound exceeds the claim; the correct DP-SGD at the same settings stays ok."""
    audit = {"mode": "one-run", "canaries": 300, "mia": "off"}
    p = trial("gredp", epsilon=1.0, audit=audit)
    assert "audit_step_violated" not in p
    assert p["audit_sigma_measured_upper"] < p["sigma"]  # less noise than the claim's sigma
    assert p["epsilon_claimed"] < p["epsilon_audited_noise"] <= p["epsilon_certified"]
    assert p["audit_run_violated"] is True and p["claim_status"] == "violated"
    assert p["epsilon_audited"] < p["epsilon_claimed"]  # the assumption-free bound alone does not catch it
    d = trial("dpsgd", epsilon=1.0, audit=audit)
    assert d["epsilon_audited_noise"] <= d["epsilon_certified"] and d["audit_sigma_measured_upper"] >= d["sigma"]
    assert d["audit_run_violated"] is False and d["claim_status"] == "ok"
    assert d["epsilon_audited_curve"] <= d["epsilon_certified"]


@pytest.mark.slow
@pytest.mark.parametrize("eps", [1.0, 2.0])
def test_gredp_example_settings_violated_at_run_level(eps):
    """examples/gredp.yaml's settings (digits, MLP 32, 30 epochs, canaries auto)."""
    p = trial("gredp", epsilon=eps, model_options={"hidden": 32},
              mechanism_options={"noise": "complex", "fft": "unitary", "clipping": "flat"},
              train=dict(epochs=30, batch_size=64, lr=0.5, optimizer="sgd", clip=1.0),
              audit={"mode": "one-run", "mia": "off"})
    assert p["epsilon_claimed"] < p["epsilon_audited_noise"] <= p["epsilon_certified"]
    assert p["claim_status"] == "violated" and p["audit_run_violated"] is True


def test_nonprivate_and_audit_off_record_no_audit():
    assert trial("nonprivate", epsilon=None)["epsilon_audited"] is None
    p = trial("dpsgd", audit={"mode": "off", "mia": "off"})
    assert p["epsilon_audited"] is None and "mu_audited" not in p and p["claim_status"] == "ok"
    assert "mia_auc" not in p


def test_bad_audit_mode_fails_the_trial_with_a_reason():
    """A config given as a mapping is checked by the same bounds as a grid's (workers/config.py)."""
    record = run_trial(dict(sweep="t", trial_key="k", dataset="digits", model="mlp", mechanism="dpsgd",
                            epsilon=2.0, delta=1e-5, seed=0, train=dict(epochs=1), audit={"mode": "sometimes"}))
    assert record["status"] == "failed" and "audit: mode must be one of" in record["error"]


@pytest.mark.parametrize("mode", ["step", "one-run"])
def test_single_modes(mode):
    p = trial("dpsgd", audit={"mode": mode, "canaries": 300, "dim": 200})
    assert (p["epsilon_audited"] is not None) == (mode == "one-run")
    assert ("mu_audited" in p) == (mode == "step")


def test_step_timer_leaves_out_the_audit_seconds():
    import time

    from workers.measure import StepTimer

    timer = StepTimer(warmup=0)
    timer.start()
    time.sleep(0.05)
    timer.stop(1, excluded_s=0.04)
    assert 0.005 < timer.times[0] < 0.03
