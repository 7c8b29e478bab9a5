"""mu-GDP CLT accountant vs published tables (arXiv 1911.11607), Opacus' independent GDP
analysis, and PLD (the CLT is a claim, not a bound)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants.analysis import gdp as opacus_gdp

from mechanisms.accounting import epsilon, gdp
from tests.events import poisson_event

Q = 256 / 60000


def steps(epochs: float) -> int:
    return round(epochs * 60000 / 256)


# mu -> (eps at 1e-5, eps at 1e-6, delta(eps=1), delta(eps=2))
MU_TABLE = {
    0.10: (0.341, 0.397, 1.2e-25, 3.7e-91), 0.25: (0.926, 1.061, 2.92e-6, 5.1e-17),
    0.35: (1.341, 1.527, 3.57e-4, 8.6e-10), 0.50: (1.993, 2.254, 6.83e-3, 9.44e-6),
    1.00: (4.377, 4.887, 0.127, 2.09e-2), 1.78: (8.668, 9.561, 0.429, 0.245),
    2.00: (9.997, 10.997, 0.510, 0.332), 3.00: (16.675, 18.163, 0.788, 0.686),
}


@pytest.mark.parametrize("mu", sorted(MU_TABLE))
def test_mu_conversions_match_published_tables(mu):
    e5, e6, d1, d2 = MU_TABLE[mu]
    assert gdp.epsilon_from_mu(mu, 1e-5) == pytest.approx(e5, abs=1e-3)
    assert gdp.epsilon_from_mu(mu, 1e-6) == pytest.approx(e6, abs=1e-3)
    assert gdp.delta_from_mu(1.0, mu) == pytest.approx(d1, rel=2e-2)
    assert gdp.delta_from_mu(2.0, mu) == pytest.approx(d2, rel=2e-2)


@pytest.mark.parametrize("eps, mu", [(0.5, 0.1422), (1, 0.2681), (2, 0.5016), (4, 0.9249), (8, 1.6660)])
def test_mu_for_target(eps, mu):
    assert gdp.mu_from_epsilon(eps, 1e-5) == pytest.approx(mu, abs=1e-4)
    assert gdp.delta_from_mu(eps, gdp.mu_from_epsilon(eps, 1e-5)) <= 1e-5 * (1 + 1e-9)


def test_paper_numbers():
    """Figure 4 (MNIST, q = 256/60000): sigma 1.06 / 20 epochs and 0.638 / 70 epochs; Table 4 (MovieLens)."""
    assert gdp.mu_poisson(1.06, Q, steps(20)) == pytest.approx(0.350, abs=1e-3)
    assert gdp.epsilon(1.06, Q, steps(20), 1e-5) == pytest.approx(1.341, abs=1e-3)
    assert gdp.mu_poisson(0.638, Q, steps(70)) == pytest.approx(1.785, abs=1e-3)
    assert gdp.epsilon(0.638, Q, steps(70), 1e-5) == pytest.approx(8.697, abs=1e-3)
    assert gdp.epsilon_from_mu(1.94, 1e-6) == pytest.approx(10.600, abs=1e-3)
    # TF-Privacy MNIST tutorial settings
    for sigma, epochs, eps in [(1.1, 60, 2.324), (0.7, 45, 5.066), (1.3, 15, 0.834), (1.3, 20, 0.977)]:
        assert gdp.epsilon(sigma, Q, steps(epochs), 1e-5) == pytest.approx(eps, abs=2e-3)


@pytest.mark.parametrize("epochs, eps, sigma_poisson, sigma_uniform", [
    (20, 0.5, 2.168, 2.459), (20, 1, 1.279, 1.499), (20, 2, 0.853, 0.998), (20, 4, 0.645, 0.734),
    (20, 8, 0.534, 0.590), (60, 1, 2.011, 2.293), (60, 8, 0.636, 0.722),
])
def test_sigma_for_target_matches_published(epochs, eps, sigma_poisson, sigma_uniform):
    T = round(epochs * 60000 / 256)
    assert gdp.sigma_for_epsilon(eps, 1e-5, Q, T) == pytest.approx(sigma_poisson, abs=2e-3)
    assert gdp.sigma_for_epsilon(eps, 1e-5, Q, T, "uniform") == pytest.approx(sigma_uniform, abs=2e-3)


def test_uniform_mu_examples_and_ordering():
    assert gdp.mu_uniform(1.3, Q, steps(20)) == pytest.approx(0.329, abs=1e-3)
    assert gdp.mu_poisson(1.3, Q, steps(20)) == pytest.approx(0.262, abs=1e-3)
    assert gdp.mu_uniform(0.7, Q, steps(70)) == pytest.approx(1.938, abs=1e-3)
    assert gdp.mu_poisson(0.7, Q, steps(70)) == pytest.approx(1.414, abs=1e-3)


@settings(max_examples=25, deadline=None)
@given(sigma=st.floats(0.4, 10), q=st.floats(1e-4, 0.5), T=st.integers(1, 50_000),
       log_delta=st.floats(-12, -3))
def test_matches_opacus_gdp(sigma, q, T, log_delta):
    delta = math.exp(log_delta)
    assert gdp.mu_poisson(sigma, q, T) == pytest.approx(
        opacus_gdp.compute_mu_poisson(steps=T, noise_multiplier=sigma, sample_rate=q), rel=1e-9)
    assert gdp.mu_uniform(sigma, q, T) == pytest.approx(
        opacus_gdp.compute_mu_uniform(steps=T, noise_multiplier=sigma, sample_rate=q), rel=1e-9)
    ours = gdp.epsilon(sigma, q, T, delta)
    if 0 < ours < 400:  # Opacus brackets epsilon in (0, 500) and raises outside
        reference = opacus_gdp.compute_eps_poisson(steps=T, noise_multiplier=sigma, sample_rate=q, delta=delta)
        assert ours == pytest.approx(reference, rel=1e-6, abs=1e-9)


@settings(max_examples=25, deadline=None)
@given(eps=st.floats(0.05, 30), q=st.floats(1e-4, 1), T=st.integers(1, 50_000),
       sampler=st.sampled_from(gdp.SAMPLERS))
def test_sigma_round_trip_never_above(eps, q, T, sampler):
    sigma = gdp.sigma_for_epsilon(eps, 1e-5, q, T, sampler)
    achieved = gdp.epsilon(sigma, q, T, 1e-5, sampler)
    assert achieved <= eps * (1 + 1e-9)
    assert achieved == pytest.approx(eps, rel=1e-6)


@settings(max_examples=25, deadline=None)
@given(s1=st.floats(0.3, 10), s2=st.floats(0.3, 10), q=st.floats(1e-3, 1), T=st.integers(1, 20_000),
       d1=st.floats(-12, -2), d2=st.floats(-12, -2))
def test_monotone_in_sigma_q_steps_delta(s1, s2, q, T, d1, d2):
    lo, hi = sorted((s1, s2))
    assert gdp.epsilon(hi, q, T, 1e-5) <= gdp.epsilon(lo, q, T, 1e-5) + 1e-12
    assert gdp.epsilon(lo, q / 2, T, 1e-5) <= gdp.epsilon(lo, q, T, 1e-5) + 1e-12
    assert gdp.epsilon(lo, q, T, 1e-5) <= gdp.epsilon(lo, q, 2 * T, 1e-5) + 1e-12
    small, large = sorted((math.exp(d1), math.exp(d2)))
    assert gdp.epsilon(lo, q, T, large) <= gdp.epsilon(lo, q, T, small) + 1e-12


@pytest.mark.parametrize("sigma, q, T", [(0.8, 0.004, 10), (0.8, 0.05, 10), (1.0, 0.05, 100), (2.0, 0.2, 10)])
def test_clt_under_reports_for_few_steps(sigma, q, T):
    """paper: the CLT is not a bound; with few steps it is far below the tight PLD epsilon."""
    claimed = gdp.epsilon(sigma, q, T, 1e-5)
    certified = epsilon(poisson_event(sigma, q, T), 1e-5, "pld")
    assert claimed < 0.85 * certified


def test_clt_over_reports_at_full_batch():
    """q = 1: exact composition is G_{sqrt(T)/sigma}; the CLT formula is larger."""
    assert gdp.epsilon(2.0, 1.0, 10, 1e-5) == pytest.approx(8.112, abs=2e-3)
    assert epsilon(poisson_event(2.0, 1.0, 10), 1e-5) == pytest.approx(7.511, abs=2e-3)


@pytest.mark.parametrize("call", [
    lambda: gdp.mu_poisson(0, 0.1, 10), lambda: gdp.mu_poisson(1, 0, 10), lambda: gdp.mu_poisson(1, 1.1, 10),
    lambda: gdp.mu_poisson(1, 0.1, 0), lambda: gdp.epsilon_from_mu(1, 0), lambda: gdp.epsilon_from_mu(0, 1e-5),
    lambda: gdp.mu_from_epsilon(-1, 1e-5), lambda: gdp.sigma_for_epsilon(1, 1e-5, 0.1, 10, "shuffle"),
])
def test_bad_input(call):
    with pytest.raises(ValueError):
        call()


def test_tiny_sigma_is_infinite_not_an_overflow():
    assert gdp.mu_poisson(0.01, 0.1, 10) == math.inf
    assert gdp.epsilon(0.01, 0.1, 10, 1e-5) == math.inf
