"""The PLD's adaptive discretisation interval: coarser where a fine grid would not fit in memory (only loosening
epsilon), finer where epsilon is small (no over-report), unchanged at usual settings; against dp-accounting."""

import math

import pytest
from dp_accounting import pld as dp_pld

from mechanisms.accounting import epsilon
from mechanisms.accounting.adaptive_pld import discretization_for
from tests.events import CIFAR, poisson_event


def test_tiny_sigma_gets_a_coarser_grid():
    """At sigma 1e-4, PLD at h = 1e-3 would allocate 373 GiB. Past 2e6 grid points the interval grows (past a
    span of 1e3, epsilon in the thousands, to 1e5 points: 0.8 s instead of 45 s here); that it only loosens
    epsilon against dp-accounting at h = 1e-3 is the slow test below (the reference takes those 45 s)."""
    event = poisson_event(0.025, 0.02, 100)  # a span of 2,400: epsilon 8,089
    h = discretization_for(event, 1e-5)
    assert h == pytest.approx((1 / 0.025**2 + 20 / 0.025) / 1e5) and h > 1e-3
    tiny = epsilon(poisson_event(1e-3, 0.02, 100), 1e-5, "pld")  # h = 10: used to raise MemoryError
    assert math.isfinite(tiny) and tiny > epsilon(event, 1e-5, "pld")
    assert discretization_for(poisson_event(0.05, 0.02, 100), 1e-5) == 1e-3  # usual sigmas: unchanged


@pytest.mark.slow
def test_the_coarser_grid_only_loosens_epsilon():
    """Values are still rounded up on the coarser grid, so epsilon can only be looser than dp-accounting's at
    h = 1e-3 (equal to 2e-10 here); sigma 1e-4 (30 s) is finite too."""
    event = poisson_event(0.025, 0.02, 100)
    reference = dp_pld.PLDAccountant(value_discretization_interval=1e-3).compose(event).get_epsilon(1e-5)
    assert (1 - 1e-6) * reference <= epsilon(event, 1e-5, "pld") <= 1.02 * reference
    assert math.isfinite(epsilon(poisson_event(1e-4, 0.02, 100), 1e-5, "pld"))


def test_small_epsilon_is_not_over_reported_by_discretisation():
    """PLD at h = 1e-3 over-reports small epsilons (+12% here); the adaptive interval matches PRV."""
    event = poisson_event(5.0, 0.004, 2000)
    assert discretization_for(event, 1e-5) < 1e-3
    tight = epsilon(event, 1e-5, "pld")
    coarse = dp_pld.PLDAccountant(value_discretization_interval=1e-3).compose(event).get_epsilon(1e-5)
    assert coarse > 1.05 * tight
    assert tight == pytest.approx(epsilon(event, 1e-5, "prv"), rel=0.01)
    assert discretization_for(poisson_event(*CIFAR), 1e-5) == 1e-3  # moderate epsilon keeps the fast interval
