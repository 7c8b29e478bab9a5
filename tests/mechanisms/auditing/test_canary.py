"""CanaryScoreAuditor against jax_privacy's known-answer cases (tests/auditing_test.py) and its semantics."""

import dp_accounting
import numpy as np
import pytest
from scipy.stats import norm

from mechanisms.auditing import Bonferroni, CanaryScoreAuditor, CanaryScores, Explicit, Split, epsilon_lower_bound
from mechanisms.auditing.binomial import clopper_pearson_upper
from mechanisms.auditing.canary import _hull, roc_counts


def deterministic_normal(mu: float, n: int) -> np.ndarray:
    """n scores whose empirical distribution is N(mu, 1) quantile for quantile."""
    return norm.ppf(np.linspace(0, 1, n, endpoint=False) + 1 / (2 * n)) + mu


@pytest.mark.parametrize(("shift", "expected"), [(0, 0.0), (1, 1.13346), (2, 2.311945), (4, 4.395568)])
def test_epsilon_one_run_matches_jax_privacy(shift, expected):
    auditor = CanaryScoreAuditor(deterministic_normal(shift, 10_000), deterministic_normal(0, 10_000))
    assert auditor.epsilon_one_run(0.05, 1e-6) == pytest.approx(expected, rel=1e-5, abs=1e-9)


@pytest.mark.parametrize("mu", [pytest.param(0.3, marks=pytest.mark.slow), 1.0, 1.5])
@pytest.mark.parametrize("strategy", [Bonferroni(), Split(seed=0)])
@pytest.mark.parametrize("one_sided", [True, False])
def test_epsilon_clopper_pearson_is_tight_and_below_truth(mu, strategy, one_sided):
    delta, n = 0.1, (2_000_000 if mu < 0.5 else 400_000)  # a weak signal needs jax_privacy's 2M
    auditor = CanaryScoreAuditor(deterministic_normal(mu, n), deterministic_normal(0, n))
    eps = auditor.epsilon_clopper_pearson(0.2, delta, one_sided, threshold_strategy=strategy)
    true_eps = dp_accounting.get_epsilon_gaussian(1 / mu, delta)
    assert eps < true_eps
    assert eps == pytest.approx(true_eps, rel=0.2)


@pytest.mark.parametrize("threshold", [0.0, 0.5, 1.0])
def test_explicit_threshold_is_the_clopper_pearson_formula(threshold):
    held_in, held_out = deterministic_normal(1, 1000), deterministic_normal(0, 1500)
    auditor = CanaryScoreAuditor(held_in, held_out)
    eps = auditor.epsilon_clopper_pearson(0.1, threshold_strategy=Explicit(threshold))
    fn, fp = np.sum(held_in < threshold), np.sum(held_out >= threshold)
    tpr_lb = 1 - clopper_pearson_upper(fn, 1000, 0.05)
    fpr_ub = clopper_pearson_upper(fp, 1500, 0.05)
    assert eps == pytest.approx(max(0.0, np.log(tpr_lb / fpr_ub)))


@pytest.mark.parametrize("mu", [0.3, 1.0, 3.0])
def test_epsilon_from_gdp_is_close_to_truth(mu):
    rng = np.random.default_rng(0xBAD5EED)
    auditor = CanaryScoreAuditor(rng.normal(mu, 1, 500_000), rng.normal(0, 1, 500_000))
    true_eps = dp_accounting.get_epsilon_gaussian(1 / mu, 5e-2)
    assert auditor.epsilon_from_gdp(0.1, 5e-2) == pytest.approx(true_eps, rel=0.05)
    assert auditor.mu_clopper_pearson(0.1) < mu


def test_roc_counts_and_hull_known_cases():
    thresholds, fn, tn = roc_counts(np.array([1.5, 2.5, 0.5, 3.5]), np.array([0.0, 3, 2, 1]))
    assert thresholds.tolist() == [0, 0.5, 3.5, np.inf]
    assert tn.tolist() == [0, 1, 4, 4] and fn.tolist() == [0, 0, 3, 4]
    assert _hull(np.array([[0, 0], [0, 2], [3, 2], [3, 5], [5, 5]])).tolist() == [0, 1, 3, 4]
    assert _hull(np.array([[0, 0], [0, 2], [2, 2], [2, 3], [3, 3], [3, 5], [5, 5]])).tolist() == [0, 1, 5, 6]
    assert _hull(np.stack([np.arange(50), np.arange(50)], axis=1)).tolist() == [0, 49]


def test_tpr_at_fpr_and_auroc_known_cases():
    auditor = CanaryScoreAuditor([1, 3], [0, 2])
    assert auditor.tpr_at_given_fpr([0, 0.25, 0.5, 0.75, 1.0]) == pytest.approx([0.5, 0.75, 1, 1, 1])
    assert CanaryScoreAuditor([0, 4, 6, 7], [1, 2, 3, 5]).attack_auroc() == pytest.approx(13 / 16)
    assert CanaryScoreAuditor(np.zeros(30), np.ones(30)).attack_auroc() == pytest.approx(0.5)
    assert CanaryScoreAuditor(np.ones(30), np.zeros(30)).attack_auroc() == pytest.approx(1.0)


def test_identical_scores_give_nothing():
    scores = np.random.default_rng(1).normal(size=5000)
    auditor = CanaryScoreAuditor(scores, scores.copy())
    assert auditor.epsilon_clopper_pearson(0.05, 1e-5) == 0.0
    assert auditor.epsilon_one_run(0.05, 1e-5) == 0.0
    assert epsilon_lower_bound(CanaryScores(scores, scores.copy()), 1e-5) == 0.0


def test_invalid_arguments_raise():
    auditor = CanaryScoreAuditor([1, 2, 3], [0, 1, 2])
    with pytest.raises(ValueError, match="significance"):
        auditor.epsilon_one_run(0.0, 0.1)
    with pytest.raises(ValueError, match="delta"):
        auditor.epsilon_one_run(0.1, 1.1)
    with pytest.raises(ValueError, match="one_sided"):
        auditor.epsilon_one_run(0.1, 0.1, one_sided=False)
    with pytest.raises(ValueError, match="non-empty"):
        CanaryScores(np.array([]), np.array([1.0]))
    with pytest.raises(ValueError, match="finite"):
        CanaryScores(np.array([np.nan]), np.array([1.0]))
