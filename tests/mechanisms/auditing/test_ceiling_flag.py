"""The "above the ceiling" finding on correct runs whose ceiling is 0.

With few canaries and much noise, the certified mechanism's simulated run (the ceiling) often audits at 0, and
one standard deviation more right guesses leaves its bound at 0 too: a ceiling noise of 0 then flagged every
positive audit of a correct run (seen: dpsgd at epsilon 1 on digits, audited 0.23 of a certified 1, `violated`).
The noise is now the rise of the bound over `CEILING_FLAG_NOISES` standard deviations, so such a run is judged by
how far above the ceiling chance can reach. The ceiling is the median of several simulated runs, and the spread is
that of one run against their mean: a ceiling of one run drawn low flagged the same trial again.
"""

from __future__ import annotations

import numpy as np

from mechanisms.auditing import white_box as wb
from workers.audit import above_ceiling

STEPS, RATE, SIGMA, DELTA, M = 660, 0.0445, 4.39, 1e-5, 300  # digits / mlp, 30 epochs, epsilon 1


def test_a_correct_run_is_not_flagged_above_a_zero_ceiling():
    flagged, zero_ceilings, positive = 0, 0, 0
    for seed in range(60):
        plan = wb.plan_guesses(M, STEPS, RATE, SIGMA, DELTA, seed=seed)
        scores, included = wb.simulate_scores(M, STEPS, RATE, SIGMA, np.random.default_rng([seed, 7]))
        audited = wb.one_run_bounds(scores, included, DELTA, guess_counts=plan.guess_counts).epsilon_audited
        zero_ceilings += plan.ceiling.epsilon_audited == 0
        positive += audited > 0
        flagged += above_ceiling(audited, plan.ceiling.epsilon_audited, plan.ceiling_noise)
    assert zero_ceilings >= 30 and positive >= 5  # the case exists here (seen: 9 positive audits, 4 flagged before)
    assert flagged == 0


def test_a_zero_ceiling_still_has_a_noise_and_a_far_audit_is_flagged():
    plan = wb.plan_guesses(M, STEPS, RATE, SIGMA, DELTA, seed=1)
    assert plan.ceiling.epsilon_audited == 0 and plan.ceiling_noise > 0
    assert above_ceiling(plan.ceiling_noise * wb.CEILING_FLAG_NOISES * 1.5, 0.0, plan.ceiling_noise)


def test_a_ceiling_drawn_low_no_longer_flags_the_correct_run_it_flagged():
    """The correlated-noise preset's dpsgd trial (digits / mlp hidden 32: 2,410 parameters, 500 canaries, epsilon 1,
    seed 2) audited 0.226 with 68 of its top 100 guesses right, and was `violated`: its ceiling's single simulated
    run had 46 right, 2.5 sd below the certified mechanism's mean of 59. With the median of several runs it is
    not, and a run as far above the certified mechanism's typical bound as a broken one is still flagged."""
    plan = wb.plan_guesses(500, STEPS, 0.04450625869262865, 4.389698267567827, DELTA, seed=2, layout_n=2410)
    assert wb.ceiling_draws(500, STEPS) == wb.CEILING_DRAWS
    assert not above_ceiling(0.2264, plan.ceiling.epsilon_audited, plan.ceiling_noise)
    assert above_ceiling(plan.ceiling.epsilon_audited + 1.5 * wb.CEILING_FLAG_NOISES * plan.ceiling_noise,
                         plan.ceiling.epsilon_audited, plan.ceiling_noise)
