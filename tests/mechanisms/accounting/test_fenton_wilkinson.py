"""Shuffled DP-SGD's claimed accountant vs the paper's reference implementation and values
(arXiv 2407.15414) and Appendix A), and its reduction to aGM at d = 1."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.accounting import analytic_gaussian as ag
from mechanisms.accounting import fenton_wilkinson as fw

VIT = dict(delta=5e-6, sample_rate=1000 / 50000, steps=500)  # |B| = 1000 assumed, T = 500
D_VIT = 85.8e6


def test_unit_value_of_theorem6():
    assert fw.per_step_delta(1.0, 1.0, 1, 1.0) == pytest.approx(0.12693673750664392, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(sigma=st.floats(0.05, 100), eps=st.floats(0, 30), ratio=st.floats(0.1, 100))
def test_reduces_to_analytic_gaussian_at_d1(sigma, eps, ratio):
    """d = 1: zeta1 = 0, zeta2 = -1/sigma^2, s1 = s2 = 1/sigma; c'/c drops out."""
    assert fw.per_step_delta(sigma, eps, 1, ratio) == pytest.approx(ag.agm_delta(eps, sigma), rel=1e-9, abs=1e-15)


@settings(max_examples=20, deadline=None)
@given(eps_step=st.floats(0.01, 10), log_delta=st.floats(-14, -2))
def test_per_step_sigma_at_d1_is_agm_sigma(eps_step, log_delta):
    delta = math.exp(log_delta)
    assert fw.per_step_sigma(eps_step, delta, 1) == pytest.approx(ag.agm_sigma(eps_step, delta), rel=1e-9)


@pytest.mark.parametrize("eps, eps_step, sigma0, sigma1, sigma16", [
    (0.1, 0.0430, 87.10, 0.274, 0.946), (0.5, 0.1976, 20.72, 0.274, 0.942), (1.0, 0.3604, 11.75, 0.273, 0.938),
])
def test_vit_values_from_the_paper(eps, eps_step, sigma0, sigma1, sigma16):
    budget = fw.step_budget(eps, **VIT)
    assert budget.epsilon_step == pytest.approx(eps_step, abs=1e-4)
    assert budget.delta_step == pytest.approx(2.5e-7, rel=1e-9)
    assert fw.sigma_for_epsilon(eps, **VIT, dim=1, batch_clip_ratio=1) == pytest.approx(sigma0, abs=0.01)
    assert fw.sigma_for_epsilon(eps, **VIT, dim=D_VIT, batch_clip_ratio=1) == pytest.approx(sigma1, abs=1e-3)
    assert fw.sigma_for_epsilon(eps, **VIT, dim=D_VIT, batch_clip_ratio=16) == pytest.approx(sigma16, abs=1e-3)


@pytest.mark.parametrize("dim, sigma1, sigma16", [
    (1e2, 0.540, 1.883), (1e4, 0.384, 1.325), (1e6, 0.315, 1.082), (8.58e7, 0.274, 0.942), (1e9, 0.257, 0.885),
])
def test_sigma_against_dimension_table(dim, sigma1, sigma16):
    assert fw.per_step_sigma(0.1976, 2.5e-7, dim, 1) == pytest.approx(sigma1, abs=1e-3)
    assert fw.per_step_sigma(0.1976, 2.5e-7, dim, 16) == pytest.approx(sigma16, abs=1e-3)


def test_closed_form_approximation_tracks_the_solver():
    """sigma^2 ~ (d/(d-1)) (c'/c) / (ln(d-1) + eps_s) when e^{1/sigma^2} << d."""
    for dim in (1e6, 1e9):
        approx = math.sqrt(dim / (dim - 1) * 16 / (math.log(dim - 1) + 0.1976))
        assert fw.per_step_sigma(0.1976, 2.5e-7, dim, 16) == pytest.approx(approx, rel=0.02)


def test_first_crossing_from_above():
    """h has a cliff and is negative past it: sigma is where it first drops below delta_s."""
    sigma = fw.per_step_sigma(0.1976, 2.5e-7, D_VIT, 1)
    assert fw.per_step_delta(sigma, 0.1976, D_VIT, 1) <= 2.5e-7
    assert fw.per_step_delta(sigma * (1 - 1e-9), 0.1976, D_VIT, 1) > 2.5e-7
    assert fw.per_step_delta(0.266, 0.1976, D_VIT, 1) > 0.2  # before the cliff
    assert fw.per_step_delta(0.3, 0.1976, D_VIT, 1) < 0  # after it


@pytest.mark.parametrize("dim, ratio", [(1, 1.0), (1e4, 16.0), (D_VIT, 1.0), (D_VIT, 16.0)])
def test_epsilon_round_trip(dim, ratio):
    for eps in (0.1, 0.5, 2.0):
        sigma = fw.sigma_for_epsilon(eps, **VIT, dim=dim, batch_clip_ratio=ratio)
        claimed = fw.epsilon(sigma, VIT["sample_rate"], VIT["steps"], VIT["delta"], dim, batch_clip_ratio=ratio)
        assert claimed == pytest.approx(eps, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(s1=st.floats(1.0, 50), s2=st.floats(1.0, 50), dim=st.sampled_from([1, 100, 1e4]),
       r1=st.floats(1, 64), r2=st.floats(1, 64))
def test_claim_monotone_in_sigma_and_ratio(s1, s2, dim, r1, r2):
    lo, hi = sorted((s1, s2))
    small, large = sorted((r1, r2))
    q, T, delta = 0.02, 500, 1e-5

    def claim(sigma, ratio):
        return fw.epsilon(sigma, q, T, delta, dim, batch_clip_ratio=ratio)

    assert claim(hi, small) <= claim(lo, small) * (1 + 1e-9) + 1e-12
    assert claim(lo, small) <= claim(lo, large) * (1 + 1e-9) + 1e-12


def test_batch_size_stands_in_for_ratio_and_one_is_required():
    with_size = fw.epsilon(2.0, 0.02, 500, 1e-5, 1e6, batch_size=64)
    assert with_size == fw.epsilon(2.0, 0.02, 500, 1e-5, 1e6, batch_clip_ratio=64)
    with pytest.raises(ValueError, match="batch_clip_ratio"):
        fw.epsilon(2.0, 0.02, 500, 1e-5, 1e6)


def test_claim_collapses_to_zero_past_the_cliff():
    """At sigma = 1 the condition holds for every per-step epsilon: the paper's accountant claims 0."""
    assert fw.epsilon(1.0, **{"sample_rate": 0.02, "steps": 500, "delta": 5e-6}, dim=D_VIT,
                      batch_clip_ratio=1) == 0.0


def test_numerically_stable_at_extremes():
    for sigma in (1e-3, 0.01, 0.1, 1e3):
        for dim in (1, 2, 1e9):
            h = fw.per_step_delta(sigma, 0.5, dim, 16)
            assert math.isfinite(h) and -1 <= h <= 1


def test_algorithm1_fallback():
    result = fw.calibrate(0.5, **VIT, dim=D_VIT, batch_clip_ratio=16)
    assert result.shuffled and result.sigma == result.sigma_shuffled < result.sigma_unshuffled
    tiny = fw.calibrate(0.5, **VIT, dim=2, batch_clip_ratio=1000)  # huge c'/c: shuffling barely helps
    assert tiny.sigma == min(tiny.sigma_shuffled, tiny.sigma_unshuffled)
    assert tiny.shuffled == (tiny.sigma_shuffled < tiny.sigma_unshuffled)
    assert tiny.sigma_shuffled > 0.95 * tiny.sigma_unshuffled


@pytest.mark.parametrize("call", [
    lambda: fw.per_step_delta(0, 1, 10), lambda: fw.per_step_delta(1, 1, 0.5),
    lambda: fw.step_budget(0, 1e-5, 0.1, 10), lambda: fw.step_budget(1, 1e-5, 0.1, 10, delta_split=1),
    lambda: fw.step_budget(1, 1e-5, 0, 10), lambda: fw.step_budget(1, 2, 0.1, 10),
    lambda: fw.epsilon(1, 0.1, 0, 1e-5, 10, batch_size=4), lambda: fw.epsilon(1, 1e-9, 1, 0.5, 10, batch_size=4),
])
def test_bad_input(call):
    with pytest.raises(ValueError):
        call()
