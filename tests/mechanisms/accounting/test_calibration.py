"""Calibration: a fake accountant with a known curve (as dp-accounting's mechanism_calibration_test does),
the never-above guarantee, the tolerance grid, published sigma values, caching and bad input."""

import dataclasses
import math

import dp_accounting
import pytest
from dp_accounting import mechanism_calibration
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mechanisms.accounting import DpsgdSetting, calibrate, calibrate_sigma, epsilon, sigma_for
from mechanisms.accounting.calibration import MAX_LEVEL
from mechanisms.accounting.reference import FRESH
from mechanisms.parts.noise_addition import GaussianNoise
from tests.events import poisson_events


def on_grid(sigma: float, rel_tol: float) -> bool:
    """sigma = (1 + rel_tol)^(j / 2^L) for an integer j and some level L <= MAX_LEVEL."""
    exponent = math.log(sigma) / math.log1p(rel_tol) * 2**MAX_LEVEL
    return abs(exponent - round(exponent)) < 1e-6


@settings(max_examples=60, deadline=None)
@given(c=st.floats(0.01, 100), p=st.floats(0.3, 6), target=st.floats(0.01, 100),
       guess=st.floats(1e-3, 1e3), slope=st.floats(-10, -0.1), rel_tol=st.sampled_from([1e-3, 1e-2]))
@example(c=0.010000000000000002, p=1.0, target=0.01, guess=1.0, slope=-1.0, rel_tol=0.001)  # one ulp above: CI
def test_known_curve_smallest_grid_point(c, p, target, guess, slope, rel_tol):
    """eps(sigma) = c / sigma^p has root (c / target)^(1/p); the answer is within rel_tol above it."""
    root = (c / target) ** (1 / p)
    if not 1e-3 < root < 1e5:
        return
    result = calibrate(lambda s: c / s**p, target, rel_tol=rel_tol, guess=guess, slope=slope)
    assert result.epsilon == c / result.sigma**p
    assert result.epsilon <= target  # never above
    assert root * (1 - 1e-12) <= result.sigma <= root * (1 + rel_tol) * (1 + 1e-12)
    assert result.epsilon >= target * (1 - rel_tol)  # the epsilon slack meets the tolerance too
    assert on_grid(result.sigma, rel_tol)


@settings(max_examples=30, deadline=None)
@given(guess=st.floats(1e-2, 1e2), slope=st.floats(-8, -0.2))
def test_answer_does_not_depend_on_the_path(guess, slope):
    """For a fixed start level, the answer is a property of the curve, not of the guess or slope hints."""
    reference = calibrate(lambda s: 3 / s**2.5, 1.7)
    assert calibrate(lambda s: 3 / s**2.5, 1.7, guess=guess, slope=slope).sigma == reference.sigma


def test_step_curve_is_never_exceeded():
    """A coarse, PLD-like staircase: the slack cannot be met, but the target is still never exceeded."""
    def stairs(sigma):
        return math.ceil(4.0 / sigma * 10) / 10

    result = calibrate(stairs, 1.05, rel_tol=1e-3)
    assert result.epsilon <= 1.05 and stairs(result.sigma) == result.epsilon
    assert stairs(result.sigma / (1 + 1e-3) ** (1 / 2**MAX_LEVEL)) > 1.05
    assert "coarser" in result.note


def test_unreachable_and_bad_targets():
    with pytest.raises(ValueError, match="no sigma"):
        calibrate(lambda s: 1.0 + 1.0 / s, 0.5)
    with pytest.raises(ValueError, match="no sigma"):
        calibrate_sigma(lambda s: dp_accounting.NonPrivateDpEvent(), 1.0, 1e-5, "rdp")
    for bad in (0, -1, math.inf, math.nan):
        with pytest.raises(ValueError, match="epsilon"):
            calibrate_sigma(poisson_events(0.01, 100), bad, 1e-5)
    for delta in (0, 1, 1.5):
        with pytest.raises(ValueError, match="delta"):
            calibrate_sigma(poisson_events(0.01, 100), 1.0, delta)
    with pytest.raises(ValueError, match="unknown accountant"):
        calibrate_sigma(poisson_events(0.01, 100), 1.0, 1e-5, "moments")
    with pytest.raises(ValueError, match="cannot analyse"):
        calibrate_sigma(lambda s: dp_accounting.UnsupportedDpEvent(), 1.0, 1e-5, "rdp")


def test_issue_setting_is_fast_and_matches_dp_accounting():
    """The shipped calibration took 360 s here (eps 8, delta 1e-5, q 256/60000, 702 steps)."""
    events = poisson_events(256 / 60000, 702)
    result = calibrate_sigma(events, 8.0, 1e-5, "pld")
    assert result.evaluations <= 8
    assert result.epsilon <= 8.0 and result.epsilon >= 8.0 * (1 - 1e-3)
    assert epsilon(events(result.sigma), 1e-5, "pld") == result.epsilon
    theirs = mechanism_calibration.calibrate_dp_mechanism(
        FRESH["pld"], events, 8.0, 1e-5, tol=2e-4,
        bracket_interval=mechanism_calibration.ExplicitBracketInterval(0.95 * result.sigma, 1.05 * result.sigma))
    assert result.sigma == pytest.approx(theirs, rel=1e-3)


@pytest.mark.parametrize("q, steps, target, pld, rdp", [
    (0.082, 2500, 8.0, 2.580, 2.731),  # anchors §2.3 calibration table
    (1024 / 67349, 198, 3.0, 0.758, 0.818),
    (256 / 60000, round(20 * 60000 / 256), 2.0, 0.890, 0.943),  # arXiv 1911.11607 §6 table
])
def test_published_sigmas(q, steps, target, pld, rdp):
    events = poisson_events(q, steps)
    # the grid answer lies up to rel_tol = 1e-3 above the root, the published ones are rounded
    assert calibrate_sigma(events, target, 1e-5, "pld").sigma == pytest.approx(pld, rel=1.5e-3)
    assert calibrate_sigma(events, target, 1e-5, "rdp").sigma == pytest.approx(rdp, rel=1.5e-3)


@settings(max_examples=4, deadline=None)
@given(log_q=st.floats(math.log(1e-3), math.log(0.1)), steps=st.integers(10, 1500), target=st.floats(0.5, 10),
       accountant=st.sampled_from(["pld", "rdp"]))
def test_round_trip_never_above_with_small_slack(log_q, steps, target, accountant):
    events = poisson_events(math.exp(log_q), steps)
    result = calibrate_sigma(events, target, 1e-5, accountant)
    recomputed = epsilon(events(result.sigma), 1e-5, accountant)
    assert recomputed == result.epsilon
    assert recomputed <= target
    assert recomputed >= target * (1 - 1e-3)


def test_cached_across_a_sweep():
    events = poisson_events(0.02, 200)
    first = calibrate_sigma(events, 3.0, 1e-5, "rdp")
    hits = calibrate_sigma.cache_info().hits
    assert calibrate_sigma(poisson_events(0.02, 200), 3.0, 1e-5, "rdp") is first
    assert calibrate_sigma.cache_info().hits == hits + 1


def test_fixed_sampler_and_sigma_scale():
    fixed = DpsgdSetting.of("fixed", 10000, 100, 1, 1e-5).parts()  # q = 0.01, 100 steps
    result = calibrate_sigma(fixed, 3.0, 1e-5, "pld")
    assert epsilon(fixed(result.sigma), 1e-5, "pld") <= 3.0
    poisson = calibrate_sigma(poisson_events(0.01, 100), 3.0, 1e-5, "pld")
    assert result.sigma > poisson.sigma  # replace-one needs more noise
    rdp = calibrate_sigma(poisson_events(0.01, 100), 3.0, 1e-5, "rdp")
    setting = DpsgdSetting.poisson(0.01, 100, 1e-5)
    scaled_noise = dataclasses.replace(setting.parts(), noise=GaussianNoise(1 / math.sqrt(2)))
    scaled = calibrate_sigma(scaled_noise, 3.0, 1e-5, "rdp")
    assert scaled.sigma / math.sqrt(2) == pytest.approx(rdp.sigma, rel=2e-3)


@pytest.mark.parametrize("accountant", ["gdp", "ma_classic", "fenton_wilkinson"])
def test_claimed_accountants_share_the_contract(accountant):
    setting = DpsgdSetting.poisson(256 / 60000, 4688, 1e-5, dim=1e6, batch_clip_ratio=16)
    result = sigma_for(setting, 2.0, accountant)
    assert result.epsilon <= 2.0 and result.epsilon >= 2.0 * (1 - 1e-3)
    if accountant == "gdp":
        from mechanisms.accounting import gdp
        closed = gdp.sigma_for_epsilon(2.0, 1e-5, 256 / 60000, 4688)
        assert closed <= result.sigma <= closed * (1 + 1e-3)
