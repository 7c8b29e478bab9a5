"""White-box one-run attack: LR statistic, simulation, canary layout, combined bounds, soundness."""

import numpy as np
import pytest

from mechanisms.accounting import epsilon
from mechanisms.auditing import CanaryScoreAuditor, white_box
from tests.events import poisson_event


def test_log_lr_step_is_the_subsampled_gaussian_likelihood_ratio():
    y = np.linspace(-5, 30, 200)
    q, sigma = 0.05, 0.4
    log_in = np.logaddexp(np.log(1 - q) - y**2 / (2 * sigma**2), np.log(q) - (y - 1) ** 2 / (2 * sigma**2))
    direct = log_in + y**2 / (2 * sigma**2)  # minus log p(y | out)
    assert white_box.log_lr_step(y, q, sigma) == pytest.approx(direct, rel=1e-9, abs=1e-9)
    huge = white_box.log_lr_step(np.array([1e4]), q, 0.1)  # beyond exp's range: a + log q
    assert np.isfinite(huge).all() and huge[0] == pytest.approx((2e4 - 1) / 0.02 + np.log(q))
    assert white_box.log_lr_step(y, 1.0, sigma) == pytest.approx((2 * y - 1) / (2 * sigma**2))


def test_robust_sigma_ignores_the_few_canaries_that_joined():
    rng = np.random.default_rng(0)
    y = 0.7 * rng.standard_normal(20_000) + (rng.random(20_000) < 0.02) * 5.0
    assert white_box.robust_sigma(y) == pytest.approx(0.7, rel=0.05)


def test_simulated_sum_scores_have_the_release_process_moments():
    rng = np.random.default_rng(1)
    scores, included = white_box.simulate_scores(4000, 50, 0.2, 1.0, rng, score="sum")
    assert scores[included].mean() == pytest.approx(0.2 * 50, abs=0.4)
    assert scores[~included].mean() == pytest.approx(0.0, abs=0.4)
    assert scores[~included].std() == pytest.approx(np.sqrt(50), rel=0.08)


def test_layout_spreads_canaries_over_coordinates_with_random_signs():
    rng = np.random.default_rng(2)
    distinct = white_box.CanaryLayout.draw(100, 40, rng)
    assert len(set(distinct.coordinates)) == 40 and np.all(distinct.signs == 1)
    shared = white_box.CanaryLayout.draw(100, 250, rng)
    counts = np.bincount(shared.coordinates, minlength=100)
    assert counts.min() >= 2 and counts.max() <= 3 and set(np.unique(shared.signs)) == {-1.0, 1.0}
    with pytest.raises(ValueError):
        white_box.CanaryLayout.draw(10, 0, rng)


def test_cross_talk_of_shared_coordinates_is_simulated():
    """k canaries per coordinate: an out canary also sums its k-1 neighbours' pushes, each s_j Bin(T, q) when
    included (w.p. 1/2): variance T sigma^2 + (k-1) (T q (1-q) + (T q)^2) / 2."""
    rng = np.random.default_rng(3)
    layout = white_box.CanaryLayout.draw(500, 5000, rng)  # 10 per coordinate
    scores, included = white_box.simulate_scores(5000, 40, 0.5, 1.0, rng, score="sum", layout=layout)
    assert scores[~included].var() == pytest.approx(40 + 9 * (40 * 0.25 + 20**2) / 2, rel=0.15)


def test_combined_bound_is_the_larger_of_two_half_significance_bounds():
    rng = np.random.default_rng(4)
    included = rng.random(6000) < 0.5
    scores = rng.standard_normal(6000) + 1.5 * included
    counts = (300, 600, 1200)
    b = white_box.one_run_bounds(scores, included, 1e-5, guess_counts=counts)
    auditor = CanaryScoreAuditor(scores[included], scores[~included])
    steinke = max(auditor.epsilon_one_run(0.025 / 3, 1e-5, threshold_strategy=white_box.top(scores, r)) for r in counts)
    fdp = max(auditor.epsilon_one_run_fdp(0.025 / 3, 1e-5, family="approx-dp",
                                          threshold_strategy=white_box.top(scores, r)) for r in counts)
    assert b.epsilon_steinke == pytest.approx(steinke) and b.epsilon_fdp == pytest.approx(fdp)
    assert b.epsilon_audited == max(steinke, fdp) > 0.5 and b.guesses in counts
    null = white_box.one_run_bounds(rng.standard_normal(6000), included, 1e-5, guess_counts=counts)
    assert null.epsilon_audited == 0.0


def test_top_rule_guesses_exactly_r_canaries():
    scores = np.arange(100.0)
    t = white_box.top(scores, 7).threshold
    assert np.sum(scores >= t) == 7


def test_likelihood_ratio_beats_the_sum_when_single_joins_are_visible():
    """sigma 0.6: the ceiling of the same analysis is far higher with the LR statistic."""
    args = dict(m=5000, steps=100, sample_rate=0.05, sigma=0.6, delta=1e-5, seed=0)
    lr = white_box.plan_guesses(args["m"], args["steps"], args["sample_rate"], args["sigma"], args["delta"], score="lr")
    total = white_box.plan_guesses(args["m"], args["steps"], args["sample_rate"], args["sigma"], args["delta"],
                                   score="sum")
    assert lr.ceiling.epsilon_audited > 1.5 * total.ceiling.epsilon_audited
    assert lr.ceiling.epsilon_audited < epsilon(poisson_event(0.6, 0.05, 100), 1e-5)


def test_choose_canaries_prefers_one_per_coordinate_when_joins_are_visible():
    m = white_box.choose_canaries(2000, 100, 0.05, 0.6, 1e-5, per_coordinate=(1, 10))
    assert m == 2000


@pytest.mark.slow
@pytest.mark.parametrize(("sigma", "q", "steps"), [(0.6, 0.05, 100), (1.0, 0.1, 50), (0.5, 1.0, 3)])
def test_sound_on_simulated_dpsgd_in_100_audits(sigma, q, steps):
    """Correct DP-SGD, optimal (LR) attack: epsilon_audited <= certified in >= 95 of 100 audits."""
    certified = epsilon(poisson_event(sigma, q, steps), 1e-5)
    plan = white_box.plan_guesses(3000, steps, q, sigma, 1e-5)
    rng = np.random.default_rng(5)
    audited = [white_box.one_run_bounds(*white_box.simulate_scores(3000, steps, q, sigma, rng), 1e-5,
                                        guess_counts=plan.guess_counts, with_gdp=False).epsilon_audited
               for _ in range(100)]
    assert np.sum(np.array(audited) <= certified) >= 95
    assert np.median(audited) > 0.1 * certified  # and not vacuous
