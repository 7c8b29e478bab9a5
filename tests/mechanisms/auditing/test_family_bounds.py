"""Run-level bounds within the certified family: the f-DP one-run test against DP-SGD's own curves
(`white_box.curve_bound`) and the white-box noise measurement (`white_box.noise_bound`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mechanisms.accounting import epsilon
from mechanisms.auditing import one_run, white_box
from tests.events import poisson_event

Q, T, DELTA = 0.05, 200, 1e-5


def moments_of(noise: np.ndarray) -> np.ndarray:
    sq = noise.ravel() ** 2
    return np.array([sq.size, sq.sum(), (sq * sq).sum()])


def test_profile_curve_is_a_valid_weaker_curve_and_nested_in_sigma():
    """The profile envelope's blow-up inverse is at least the (eps(delta), delta) piece's up to discretisation,
    and a noisier DP-SGD is a stronger claim (larger inverse) everywhere."""
    xs = np.linspace(0.01, 0.99, 25)
    weak = white_box.profile_inverse(*white_box.dpsgd_profile(2.0, Q, T))
    strong = white_box.profile_inverse(*white_box.dpsgd_profile(4.0, Q, T))
    assert all(strong(x) >= weak(x) - 1e-12 for x in xs)
    assert any(strong(x) > weak(x) + 1e-3 for x in xs)
    eps = white_box.dpsgd_epsilon(2.0, Q, T, DELTA)
    piece = one_run._blow_up_inverse("approx-dp", eps * 1.02, DELTA)  # a little pessimistic discretisation slack
    assert all(weak(x) >= piece(x) - 1e-9 for x in xs)


def test_dpsgd_epsilon_is_at_most_the_certified_one():
    for sigma in (0.8, 2.0, 5.0):
        low = white_box.dpsgd_epsilon(sigma, Q, T, DELTA)
        certified = epsilon(poisson_event(sigma, Q, T), DELTA)
        assert 0.9 * certified < low <= certified


def test_dpsgd_epsilon_on_its_adaptive_grid_stays_a_lower_bound_within_1pct_of_the_fine_grid():
    """At large epsilon the grid coarsens with the value (the quickstart's eps 8 geometry and digits' eps 11):
    still under the certified (pessimistic) epsilon, and within 1% of the optimistic value on the fine grid."""
    for sigma, q, steps in ((0.53, 0.00853, 585), (0.6, Q, 100)):
        value = white_box.dpsgd_epsilon(sigma, q, steps, DELTA)
        fine = white_box._optimistic_epsilon(sigma, q, steps, DELTA, 1e-4)
        assert 0.99 * fine <= value <= epsilon(poisson_event(sigma, q, steps), DELTA)


def test_the_coarse_search_grid_rejects_only_what_the_fine_grid_rejects():
    """Both profiles bound the true deltas from above (sound on any grid); the coarse one is the weaker curve
    here: every (guesses, correct) it rejects the fine one rejects too, and it keeps most of the power."""
    coarse = fine = 0
    for r in (20, 60, 150):
        for correct in range(r // 2 + 1, r + 1, max(1, r // 15)):
            for sigma in (0.8, 1.5, 3.0):
                c = white_box.rejects_dpsgd(1000, r, correct, sigma, Q, T, 0.05 / 3)
                f = white_box.rejects_dpsgd(1000, r, correct, sigma, Q, T, 0.05 / 3, discretization=1e-4)
                assert f or not c, (r, correct, sigma)
                coarse, fine = coarse + c, fine + f
    assert fine > 0 and coarse >= 0.9 * fine, (coarse, fine)


def test_noise_bound_on_gaussian_noise_brackets_sigma_and_stays_under_certified():
    rng = np.random.default_rng(0)
    b = white_box.noise_bound(moments_of(2.0 * rng.standard_normal(400_000)), Q, T, DELTA)
    assert b.gaussian and b.sigma_upper >= 2.0 and abs(b.sigma - 2.0) < 0.01
    assert b.epsilon <= epsilon(poisson_event(2.0, Q, T), DELTA)


def test_noise_bound_sound_in_400_measurements():
    """The chi-square bound at 5% fails in about 5% of repetitions (400: 20 +- 4.4), at 0.1% in none."""
    rng = np.random.default_rng(1)
    samples = [moments_of(3.0 * rng.standard_normal(20_000)) for _ in range(400)]
    for significance, most in ((0.05, 30), (0.001, 2)):
        uppers = np.array([white_box.noise_bound(m, Q, T, DELTA, significance=significance,
                                                 with_epsilon=False).sigma_upper for m in samples])
        assert np.sum(uppers < 3.0) <= most


def test_noise_bound_refuses_non_gaussian_noise():
    rng = np.random.default_rng(2)
    b = white_box.noise_bound(moments_of(rng.laplace(size=200_000)), Q, T, DELTA)
    assert not b.gaussian and b.epsilon is None
    assert white_box.noise_bound(np.array([10, 10.0, 30.0]), Q, T, DELTA) is None  # too few samples


def test_noise_bound_catches_half_the_variance_of_the_claim():
    """GReDP's bug: the code adds sigma / sqrt 2 while the claim is DP-SGD at sigma."""
    sigma_claimed = 3.0
    claimed = epsilon(poisson_event(sigma_claimed, Q, T), DELTA)
    rng = np.random.default_rng(3)
    b = white_box.noise_bound(moments_of(sigma_claimed / math.sqrt(2) * rng.standard_normal(100_000)), Q, T, DELTA)
    assert b.epsilon > claimed
    assert b.epsilon <= epsilon(poisson_event(sigma_claimed / math.sqrt(2), Q, T), DELTA)


def test_simulated_run_noise_moments_count_the_excluded_canaries():
    rng = np.random.default_rng(4)
    moments = np.zeros(3)
    _, included = white_box.simulate_scores(2000, 50, Q, 1.5, rng, noise_moments=moments)
    assert moments[0] == 50 * np.sum(~included)
    assert math.sqrt(moments[1] / moments[0]) == pytest.approx(1.5, rel=0.02)


def test_curve_bound_is_under_certified_and_beats_nothing_on_correct_dpsgd():
    sigma = 1.5
    plan = white_box.plan_guesses(3000, T, Q, sigma, DELTA, seed=1)
    scores, included = white_box.simulate_scores(3000, T, Q, sigma, np.random.default_rng(5))
    b = white_box.curve_bound(scores, included, DELTA, Q, T, sigma, guess_counts=plan.guess_counts)
    assert 0 < b.epsilon <= epsilon(poisson_event(sigma, Q, T), DELTA)
    assert b.sigma > sigma  # the rejected noise multiplier is above the true one
    approx = white_box.one_run_bounds(scores, included, DELTA, guess_counts=plan.guess_counts, with_gdp=False)
    assert b.epsilon >= approx.epsilon_fdp  # the family's own curve is a stronger claim than f_{eps, delta}


def test_curve_bound_under_a_time_budget_is_looser_never_higher():
    """The search stops refining when its budget is spent and reports a rejected noise multiplier: the bound
    is at most the full search's (no budget left before any rejection: no bound)."""
    sigma = 1.5
    plan = white_box.plan_guesses(3000, T, Q, sigma, DELTA, seed=1)
    scores, included = white_box.simulate_scores(3000, T, Q, sigma, np.random.default_rng(5))
    full = white_box.curve_bound(scores, included, DELTA, Q, T, sigma, guess_counts=plan.guess_counts)
    none = white_box.curve_bound(scores, included, DELTA, Q, T, sigma, guess_counts=plan.guess_counts, budget_s=0)
    assert none.epsilon == 0.0 and none.sigma is None  # the truth is not rejected; no time to look further
    white_box.dpsgd_profile.cache_clear()
    some = white_box.curve_bound(scores, included, DELTA, Q, T, sigma, guess_counts=plan.guess_counts,
                                 budget_s=0.5 * full.wall_s)
    assert some.epsilon <= full.epsilon and (some.sigma is None or some.sigma >= full.sigma)


def test_curve_bound_is_zero_without_signal():
    rng = np.random.default_rng(6)
    scores, included = rng.standard_normal(3000), rng.random(3000) < 0.5
    assert white_box.curve_bound(scores, included, DELTA, Q, T, 1.0, guess_counts=(100, 300)).epsilon == 0.0


@pytest.mark.slow
@pytest.mark.parametrize(("sigma", "q", "steps"), [(0.6, 0.05, 100), (1.0, 0.1, 50), (0.5, 1.0, 3)])
def test_family_bounds_sound_on_simulated_dpsgd_in_100_audits(sigma, q, steps):
    """Correct DP-SGD, LR attack: the curve test rejects the true curve, and the noise bound exceeds the
    certified epsilon, each in at most 5 of 100 audits."""
    certified = epsilon(poisson_event(sigma, q, steps), 1e-5)
    plan = white_box.plan_guesses(3000, steps, q, sigma, 1e-5)
    rng = np.random.default_rng(7)
    curve_rejects = noise_over = 0
    for _ in range(100):
        moments = np.zeros(3)
        scores, included = white_box.simulate_scores(3000, steps, q, sigma, rng, noise_moments=moments)
        hits = np.cumsum(included[np.argsort(-scores, kind="stable")])
        curve_rejects += any(white_box.rejects_dpsgd(3000, r, int(hits[r - 1]), sigma, q, steps, 0.05 / 3)
                             for r in plan.guess_counts)
        noise = white_box.noise_bound(moments, q, steps, 1e-5, significance=0.05)
        noise_over += noise is not None and noise.epsilon is not None and noise.epsilon > certified  # None: refused
    assert curve_rejects <= 5 and noise_over <= 5, (curve_rejects, noise_over)
