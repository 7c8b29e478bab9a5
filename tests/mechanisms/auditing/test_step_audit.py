"""The mechanism-level audit: soundness, detection of a broken mechanism, DP-SGD never violated, speed."""

import itertools
import json
import time

import numpy as np
import pytest
from audit_test_mechanisms import DPSGD_BARE, GREDP_REFERENCE, HALF_NOISE, HALF_NOISE_BARE

import mechanisms
from mechanisms.auditing import Gaussian, audit_step, step_spec, tradeoff
from mechanisms.auditing.canary import roc_counts
from mechanisms.auditing.cases import dirac_case
from mechanisms.auditing.sampling import sample_scores
from mechanisms.auditing.step_audit import SIGNIFICANCE, claim_p_value

DPSGD = mechanisms.get("dpsgd")


@pytest.mark.parametrize("delta", [1e-5, 0.1])
def test_audited_epsilon_and_mu_are_below_the_truth_in_95_of_100_audits(delta):
    """Correctly calibrated Gaussian mechanism (dpsgd, sigma = 1): the exact one-step epsilon is
    gaussian_epsilon(1, delta) and mu is 1. At delta = 0.1 the audit is nearly tight, so a slip in
    the confidence bounds or the split would show."""
    eps_true = tradeoff.gaussian_epsilon(1.0, delta)
    # at 5% (not the 0.1% default) the 95-of-100 statements below test the bounds' coverage hardest
    runs = [audit_step(DPSGD, step_spec(1.0, delta), samples=20_000, seed=seed, significance=0.05)
            for seed in range(100)]
    eps = np.array([r.epsilon_audited for r in runs])
    mu = np.array([r.mu_audited for r in runs])
    assert np.sum(eps < eps_true) >= 95
    assert np.sum(mu < 1.0) >= 95
    # a correct mechanism is called violated at most at the audit's significance (5%)
    assert sum(r.violated for r in runs) <= 5
    assert sum(r.claim_status == "ok" for r in runs) >= 95
    # the p-value says the same: violated exactly when p <= 5%, and p <= 5% in at most 5 of 100
    assert all(r.violated == (r.p_value <= 0.05) for r in runs)
    assert np.median(mu) > 0.85  # tight, not vacuous
    if delta == 0.1:
        assert np.median(eps) > 0.8 * eps_true


def test_negative_control_point_estimates_on_the_same_samples_overshoot():
    """Without held-out thresholds and Clopper-Pearson bounds the same data 'prove' mu > 1 for a
    1-GDP mechanism: the soundness test above can fail."""
    case = dirac_case(16, 1.0, np.random.default_rng(0))
    over = 0
    for seed in range(20):
        scores = sample_scores(DPSGD, case, sigma=1.0, clip=1.0, samples=20_000, seed=seed, path="support")
        _, fn, tn = roc_counts(scores.held_in, scores.held_out)
        alpha, beta = 1 - tn / scores.held_out.size, fn / scores.held_in.size
        over += tradeoff.mu_from_errors(alpha, beta).max() > 1.0
    assert over >= 15


def test_default_significance_is_the_one_policy_and_the_textbook_step_is_ok_at_seeds_0_to_19():
    """`privbench audit dpsgd --sigma 1` (20,000 samples, dim 1000, 0.1%) at seeds 0-19: each `ok`. At 5% seed 0
    was called violated (its p-value, about 0.014, says why): the policy, not the data, made that false alarm."""
    from workers.audit import AuditConfig

    assert AuditConfig().step_significance == SIGNIFICANCE == 0.001
    runs = [audit_step(DPSGD, step_spec(1.0, 1e-5), seed=seed) for seed in range(20)]
    assert all(r.significance == SIGNIFICANCE for r in runs)
    assert [r.claim_status for r in runs] == ["ok"] * 20
    assert all(SIGNIFICANCE < r.p_value <= 1 for r in runs)
    assert 0.001 < runs[0].p_value <= 0.05  # the old false alarm: below 5%, far above 0.1%
    assert audit_step(DPSGD, step_spec(1.0, 1e-5), seed=0, significance=0.05).violated


def test_p_value_is_the_smallest_significance_that_refutes():
    """The bisection agrees with the verdict at any significance: violated iff p <= significance."""
    for sig in (0.2, 0.05, 0.01):
        for seed in range(6):
            r = audit_step(DPSGD, step_spec(1.0, 1e-5), samples=4_000, seed=seed, significance=sig)
            assert r.violated == (r.p_value <= sig), (sig, seed, r.p_value)
    claim = Gaussian(1.0)
    n = 10_000
    p = claim_p_value(claim, 300, n, 300, n, known=1e-3)  # alpha = beta = 3%: far below G_1 (beta ~ 0.24)
    assert p < 1e-100
    assert claim_p_value(claim, 4000, n, 4000, n, known=1e-3) == 0.5  # above the curve (G_1(0.4) = 0.23)
    assert 1e-3 < claim_p_value(claim, 3000, n, 3000, n, known=1e-3) < 0.05  # just below it (G_1(0.3) = 0.32)


@pytest.mark.parametrize("seed", range(5))
def test_mechanism_that_adds_half_its_claimed_noise_is_violated(seed):
    result = audit_step(HALF_NOISE, step_spec(1.0, 1e-5), samples=20_000, seed=seed)
    assert result.violated and result.claim_status == "violated"
    assert result.p_value < 1e-100  # refuted by any sweep's Holm correction, too
    assert result.mu_audited > result.mu_claimed == 1.0
    # the scalar epsilon alone would not show it: the curve comparison does
    assert any(p.below_claim for p in result.cases[0].points)


def test_half_noise_without_hooks_is_violated_through_the_plan_fallback():
    """No claimed_step_tradeoff: the claim is the envelope of the plan's (eps(delta), delta) points;
    no AUDIT_COORDINATEWISE: whole rows are privatised."""
    result = audit_step(HALF_NOISE_BARE, step_spec(1.0, 1e-5), samples=20_000, dim=64)
    assert result.cases[0].path == "full"
    assert result.claimed_curve.startswith("max of")
    assert result.violated and result.claim_status == "violated"


def test_dpsgd_is_rarely_violated_and_its_audited_epsilon_stays_below_the_certificate():
    """A correct mechanism is flagged at most at the audit's significance (5%): over 40 audits on
    independent samples (sigma 0.3-5, delta 1e-5 and 1e-2) at most 4 may be, and the audited epsilon
    never exceeds the certified one."""
    violated = 0
    for i, (sigma, delta, _) in enumerate(itertools.product([0.3, 0.5, 1.0, 2.0, 5.0], [1e-5, 1e-2], range(4))):
        result = audit_step(DPSGD, step_spec(sigma, delta), samples=20_000, seed=1000 + i, significance=0.05)
        violated += result.violated
        assert result.epsilon_audited <= result.epsilon_certified
    assert violated <= 4


@pytest.mark.parametrize("sigma", [0.3, 0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-2])
def test_dpsgd_whole_row_path_is_not_violated(sigma, delta):
    assert not audit_step(DPSGD, step_spec(sigma, delta), samples=5_000, dim=32, path="full").violated


@pytest.mark.parametrize("sigma", [0.5, 2.0])
def test_dpsgd_without_hooks_is_not_violated_under_the_plan_fallback(sigma):
    for seed in range(3):
        result = audit_step(DPSGD_BARE, step_spec(sigma, 1e-5), samples=20_000, dim=32, seed=seed)
        assert result.cases[0].path == "full" and not result.violated and result.claim_status == "ok"


def test_twenty_thousand_samples_of_a_100k_dimensional_step_take_under_ten_seconds():
    start = time.perf_counter()
    result = audit_step(DPSGD, step_spec(1.0, 1e-5), samples=20_000, dim=100_000)
    assert time.perf_counter() - start < 10.0
    assert result.dim == 100_000 and result.samples == 20_000
    assert result.cases[0].path == "support"


@pytest.mark.parametrize(("noise", "violated_case"), [("complex", "dirac"), ("real", "odd-symmetric")])
def test_gredp_reference_model_is_violated(noise, violated_case):
    """seed_004 5.7: complex noise is DP-SGD at sigma/sqrt(2) (mu = 1.41 against the claimed 1);
    real noise leaves the odd part of the gradient noise-free (a perfect distinguisher)."""
    result = audit_step(GREDP_REFERENCE, step_spec(1.0, 1e-5, options={"noise": noise}), samples=20_000, dim=64)
    by_name = {c.case: c for c in result.cases}
    assert result.p_value < 1e-30  # still violated after Holm over a sweep of any realistic size
    assert set(by_name) == {"dirac", "odd-symmetric"}
    assert all(c.path == "full" for c in result.cases)
    assert by_name[violated_case].violated and result.claim_status == "violated"
    if noise == "complex":
        assert 1.0 < result.mu_audited < 1.5
    else:
        assert by_name["odd-symmetric"].mu_audited > 5


def test_same_seed_same_result_and_json_record():
    a = audit_step(DPSGD, step_spec(1.5, 1e-5), samples=4_000, seed=9)
    b = audit_step(DPSGD, step_spec(1.5, 1e-5), samples=4_000, seed=9)
    c = audit_step(DPSGD, step_spec(1.5, 1e-5), samples=4_000, seed=10)
    assert a.epsilon_audited == b.epsilon_audited and a.mu_audited == b.mu_audited
    assert (a.epsilon_audited, a.mu_audited) != (c.epsilon_audited, c.mu_audited)
    record = json.loads(json.dumps(a.as_record()))
    for key in ("mechanism", "sigma", "epsilon_claimed", "epsilon_certified", "epsilon_audited", "mu_audited",
                "mu_claimed", "claim_status", "samples"):
        assert key in record
    assert record["epsilon_claimed"] == pytest.approx(tradeoff.gaussian_epsilon(1 / 1.5, 1e-5), rel=1e-3)


def test_nonprivate_is_audited_but_has_no_status():
    result = audit_step(mechanisms.get("nonprivate"), step_spec(1.0, 1e-5), samples=2_000)
    assert result.claim_status is None and result.epsilon_claimed is None
    # a perfect distinguisher, limited only by 1,000 held-out samples: ln(1000 / 8.7) = 4.74 at 0.1% / 6 bounds
    assert result.epsilon_audited > 4.5


def test_bad_sigma_and_delta_are_refused():
    with pytest.raises(ValueError, match="sigma"):  # the step's setting is checked where it is made
        step_spec(-1.0, 1e-5)
    with pytest.raises(ValueError, match="delta"):
        step_spec(1.0, 1.0)
    with pytest.raises(ValueError, match="needs a sigma"):
        audit_step(DPSGD, step_spec(None, 1e-5, epsilon=1.0))
