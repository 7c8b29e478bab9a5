"""The one-run estimators: Steinke et al. (p-value against a naive loop, boundary, soundness with known answers)
and the f-DP estimator of Mahloujifar, Melis & Chaudhuri 2024 (known answers, null scores, soundness)."""

import numpy as np
import pytest
from scipy.special import expit
from scipy.stats import binom, norm

from mechanisms.auditing import CanaryScoreAuditor, Split, tradeoff
from mechanisms.auditing.one_run import epsilon_one_run, epsilon_one_run_fdp, fdp_objective, one_run_p_value


def naive_p_value(m, r, v, eps, delta):
    """The theorem's bound written as a loop (the way the paper states it)."""
    q = expit(eps)
    tail = binom.sf(v - 1, r, q)
    best, acc = 0.0, 0.0
    for i in range(1, v + 1):
        acc += binom.pmf(v - i, r, q)
        best = max(best, acc / i)
    return min(tail + 2 * m * delta * best, 1.0)


@pytest.mark.parametrize("m", [10, 1000])
@pytest.mark.parametrize("r", [1, 10, 100])
@pytest.mark.parametrize("wrong", [0, 1, 10])
@pytest.mark.parametrize("eps", [0.0, 1.0])
@pytest.mark.parametrize("delta", [0.0, 1e-6, 0.1])
def test_p_value_matches_naive_loop(m, r, wrong, eps, delta):
    if not wrong <= r <= m:
        return
    assert one_run_p_value(m, r, r - wrong, eps, delta) == pytest.approx(naive_p_value(m, r, r - wrong, eps, delta))


def test_pure_dp_bound_is_the_binomial_tail_and_the_estimate_sits_on_the_boundary():
    m, r, v = 1000, 100, 100  # 100 guesses, all right
    eps = epsilon_one_run(m, r, v, 0.05, 0.0)
    assert expit(eps) ** 100 == pytest.approx(0.05, rel=1e-4)  # P[Bin(100, q) >= 100] = q^100
    with_delta = epsilon_one_run(m, r, v, 0.05, 1e-5)
    assert one_run_p_value(m, r, v, with_delta, 1e-5) == pytest.approx(0.05, rel=1e-3)
    assert with_delta <= eps
    assert epsilon_one_run(m, r, r // 2, 0.05, 1e-5) == 0.0  # a coin's accuracy proves nothing


def _randomized_response_audit(eps, m, rng):
    """m canaries, each in w.p. 1/2; the mechanism reports membership truthfully w.p. e^eps/(1+e^eps):
    exactly eps-DP per canary, the known answer."""
    included = rng.random(m) < 0.5
    truthful = rng.random(m) < expit(eps)
    reported = np.where(truthful, included, ~included).astype(float)
    scores = reported + 1e-9 * rng.random(m)  # break ties without changing the order of the two groups
    return CanaryScoreAuditor(scores[included], scores[~included]).epsilon_one_run(0.05, 1e-6)


def test_sound_on_randomized_response_with_known_epsilon():
    rng = np.random.default_rng(7)
    eps_true = 2.0
    estimates = np.array([_randomized_response_audit(eps_true, 1000, rng) for _ in range(100)])
    assert np.sum(estimates <= eps_true) >= 95
    assert np.median(estimates) > 0.5 * eps_true  # and not vacuous


def test_sound_on_gaussian_scores_with_known_epsilon():
    """Score = canary's Gaussian release: mu-GDP per canary, so eps(delta) of G_mu is the answer."""
    rng = np.random.default_rng(11)
    mu, delta, m = 3.0, 1e-5, 1000
    eps_true = tradeoff.gaussian_epsilon(mu, delta)
    estimates = []
    for _ in range(100):
        included = rng.random(m) < 0.5
        scores = rng.standard_normal(m) + mu * included
        estimates.append(CanaryScoreAuditor(scores[included], scores[~included]).epsilon_one_run(0.05, delta))
    estimates = np.array(estimates)
    assert np.sum(estimates <= eps_true) >= 95
    assert np.median(estimates) > 1.0
    assert np.all(np.isfinite(estimates))


def quantile_normal(mu: float, n: int) -> np.ndarray:
    """jax_privacy's `_deterministic_normal`: n scores at the mid-quantiles of N(mu, 1)."""
    return norm.ppf(np.linspace(0, 1, n, endpoint=False) + 1 / (2 * n)) + mu


@pytest.mark.parametrize(("shift", "steinke", "fdp"), [(0, 0.0, 0.0), (1, 1.13346, 2.164749),
                                                       (2, 2.311945, 4.7218075), (4, 4.395568, 9.133752)])
def test_matches_jax_privacy_known_answers(shift, steinke, fdp):
    """jax_privacy tests/auditing_test.py `test_epsilon_one_run_close`: 10,000 + 10,000, 0.05, 1e-6."""
    auditor = CanaryScoreAuditor(quantile_normal(shift, 10_000), quantile_normal(0, 10_000))
    assert auditor.epsilon_one_run(0.05, 1e-6) == pytest.approx(steinke, rel=1e-5, abs=1e-9)
    assert auditor.epsilon_one_run_fdp(0.05, 1e-6) == pytest.approx(fdp, rel=1e-5, abs=1e-9)


def test_approx_dp_family_sits_between_steinke_and_the_gaussian_family():
    auditor = CanaryScoreAuditor(quantile_normal(1, 10_000), quantile_normal(0, 10_000))
    approx = auditor.epsilon_one_run_fdp(0.05, 1e-6, family="approx-dp")
    assert 1.13346 < approx < 2.164749


@pytest.mark.parametrize("family", ["gdp", "approx-dp"])
@pytest.mark.parametrize("seed", range(5))
def test_null_scores_give_zero(family, seed):
    """In and out canaries from one distribution: nothing to find (the bug jax_privacy fixed in epsilon_from_gdp)."""
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal(4000)
    included = rng.random(4000) < 0.5
    auditor = CanaryScoreAuditor(scores[included], scores[~included])
    assert auditor.epsilon_one_run_fdp(0.05, 1e-5, family=family) == 0.0
    assert auditor.epsilon_one_run(0.05, 1e-5) == 0.0
    same = CanaryScoreAuditor(quantile_normal(0, 5000), quantile_normal(0, 5000))
    assert same.epsilon_one_run_fdp(0.05, 1e-5, family=family) == 0.0


def test_objective_is_monotone_in_epsilon_and_rejects_only_strong_evidence():
    m, r, v = 20_000, 1000, 900
    values = [fdp_objective(m, r, v, e, 1e-5, 0.05, "approx-dp") for e in (0.0, 0.5, 1.0, 2.0, 4.0)]
    assert np.all(np.diff(values) <= 0)
    assert epsilon_one_run_fdp(m, r, r // 2, 0.05, 1e-5, family="approx-dp") == 0.0  # coin-flip accuracy
    assert epsilon_one_run_fdp(m, r, v, 0.05, 1e-5, family="approx-dp") > 1.0


def _randomized_response(eps: float, m: int, rng: np.random.Generator) -> CanaryScoreAuditor:
    """Each canary's membership reported truthfully w.p. e^eps / (1 + e^eps): exactly eps-DP, the worst
    case of the f_{eps, delta} family (its trade-off curve IS f_{eps, 0})."""
    included = rng.random(m) < 0.5
    truthful = rng.random(m) < expit(eps)
    scores = np.where(truthful, included, ~included).astype(float) + 1e-9 * rng.random(m)
    return CanaryScoreAuditor(scores[included], scores[~included])


def test_approx_dp_family_is_sound_on_its_worst_case_and_the_gaussian_family_is_not():
    """Why `epsilon_audited` uses the approx-dp family: on a pure eps-DP mechanism the G_mu family
    claims more than eps almost always (it rejects a Gaussian curve, not the (eps, delta) claim)."""
    rng = np.random.default_rng(3)
    eps, delta = 2.0, 1e-6
    approx, gdp = [], []
    for _ in range(100):
        auditor = _randomized_response(eps, 1000, rng)
        approx.append(auditor.epsilon_one_run_fdp(0.05, delta, family="approx-dp"))
        gdp.append(auditor.epsilon_one_run_fdp(0.05, delta))
    assert np.sum(np.array(approx) <= eps) >= 95
    assert np.median(approx) > 0.6 * eps  # and not vacuous
    assert np.sum(np.array(gdp) > eps) > 50


def test_split_strategy_and_invalid_arguments():
    auditor = CanaryScoreAuditor(quantile_normal(2, 4000), quantile_normal(0, 4000))
    split = auditor.epsilon_one_run_fdp(0.05, 1e-6, family="approx-dp", threshold_strategy=Split(seed=0))
    assert 0 < split < auditor.epsilon_one_run_fdp(0.05, 1e-6)
    for kwargs, match in [({"significance": 0.0}, "significance"), ({"delta": 0.0}, "delta"),
                          ({"one_sided": False}, "one_sided"), ({"family": "rdp"}, "family")]:
        args = {"significance": 0.05, "delta": 1e-6} | kwargs
        with pytest.raises(ValueError, match=match):
            auditor.epsilon_one_run_fdp(**args)
