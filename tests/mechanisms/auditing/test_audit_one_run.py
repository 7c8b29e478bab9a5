"""Steinke et al. one-run estimator: p-value against a naive loop, boundary, soundness with known answers."""

import numpy as np
import pytest
from scipy.special import expit
from scipy.stats import binom

from mechanisms.auditing import CanaryScoreAuditor, tradeoff
from mechanisms.auditing.one_run import epsilon_one_run, one_run_p_value


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
