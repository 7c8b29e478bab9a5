"""Trade-off toolkit: G_mu, f_{eps,delta}, Eq. 45, GDP conversions (known values from seed_003 section 4)."""

import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from mechanisms.auditing import tradeoff
from mechanisms.auditing.tradeoff import ApproxDP, Envelope, Gaussian


@pytest.mark.parametrize(("mu", "delta", "expected"), [
    (0.10, 1e-5, 0.341), (0.25, 1e-5, 0.926), (0.35, 1e-5, 1.341), (0.50, 1e-5, 1.993), (1.00, 1e-5, 4.377),
    (1.78, 1e-5, 8.668), (2.00, 1e-5, 9.997), (3.00, 1e-5, 16.675), (1.00, 1e-6, 4.887), (0.50, 1e-6, 2.254),
])
def test_gaussian_epsilon_matches_seed_003_table(mu, delta, expected):
    assert tradeoff.gaussian_epsilon(mu, delta) == pytest.approx(expected, abs=1.5e-3)


@pytest.mark.parametrize(("epsilon", "mu"), [(0.5, 0.1422), (1, 0.2681), (2, 0.5016), (4, 0.9249), (8, 1.6660)])
def test_gaussian_mu_matches_seed_003_table(epsilon, mu):
    assert tradeoff.gaussian_mu(epsilon, 1e-5) == pytest.approx(mu, abs=2e-4)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 5.0])
def test_gaussian_epsilon_agrees_with_dp_accounting(sigma):
    assert tradeoff.gaussian_epsilon(1 / sigma, 1e-5) == pytest.approx(
        dp_accounting.get_epsilon_gaussian(sigma, 1e-5), rel=1e-6)


def test_gaussian_curve_values_and_symmetry():
    g = Gaussian(1.0)
    alpha = np.array([0.0, 1e-6, 0.05, 0.5, 0.9, 1.0])
    beta = g(alpha)
    assert beta[0] == pytest.approx(1.0) and beta[-1] == pytest.approx(0.0)
    assert beta[3] == pytest.approx(norm.cdf(-1.0))
    assert np.all(np.diff(beta) <= 0)
    assert g(beta[1:-1]) == pytest.approx(alpha[1:-1], rel=1e-6, abs=1e-12)  # G_mu is its own inverse
    assert Gaussian(0.0)(alpha) == pytest.approx(1 - alpha)


def test_approx_dp_curve_pieces():
    f = ApproxDP(1.0, 0.01)
    assert f(0.0) == pytest.approx(0.99)
    assert f(0.1) == pytest.approx(max(0.99 - math.e * 0.1, math.exp(-1) * 0.89))
    assert f(0.5) == pytest.approx(math.exp(-1) * 0.49)  # the second piece takes over
    assert f(0.995) == 0.0
    assert f(1.0) == pytest.approx(0.0)
    assert ApproxDP(math.inf, 0.0)(0.3) == pytest.approx(0.0)


def test_envelope_is_pointwise_max_and_below_gaussian():
    mu = 1.0
    curves = tuple(ApproxDP(tradeoff.gaussian_epsilon(mu, d), d) for d in (1e-1, 1e-2, 1e-3, 1e-5))
    env = Envelope(curves)
    alpha = np.linspace(0, 1, 101)
    assert env(alpha) == pytest.approx(np.max([c(alpha) for c in curves], axis=0))
    # every (eps(delta), delta) of G_mu is implied by G_mu, so the envelope lies below it
    assert np.all(env(alpha) <= Gaussian(mu)(alpha) + 1e-9)
    assert env.mu is None and Gaussian(mu).mu == mu


@settings(max_examples=60, deadline=None)
@given(eps=st.floats(0.05, 8), delta=st.floats(1e-8, 0.2), alpha=st.floats(1e-6, 0.5))
def test_eq45_inverts_f_eps_delta(eps, delta, alpha):
    beta = float(ApproxDP(eps, delta)(alpha))
    if beta > 1e-9:  # on the curve, Eq. 45 gives back eps; a bit above it, less
        assert tradeoff.epsilon_from_errors(alpha, beta, delta) == pytest.approx(eps, rel=1e-6, abs=1e-9)
        assert tradeoff.epsilon_from_errors(alpha, min(1.0, beta * 1.01 + 1e-6), delta) < eps + 1e-9


@settings(max_examples=60, deadline=None)
@given(mu=st.floats(0.01, 5), alpha=st.floats(1e-6, 1 - 1e-6))
def test_mu_from_errors_inverts_gaussian(mu, alpha):
    beta = float(Gaussian(mu)(alpha))
    if 1e-12 < beta < 1 - 1e-12:
        assert tradeoff.mu_from_errors(alpha, beta) == pytest.approx(mu, rel=1e-5)
        assert not tradeoff.lies_below(Gaussian(mu), alpha, beta * (1 + 1e-9) + 1e-15)
        assert tradeoff.lies_below(Gaussian(mu), alpha, beta * 0.99)


def test_eq45_examples_and_edges():
    # a perfect test measured with 1e-4 upper bounds
    assert tradeoff.epsilon_from_errors(1e-4, 1e-4, 1e-5) == pytest.approx(math.log((1 - 1e-4 - 1e-5) / 1e-4))
    assert tradeoff.epsilon_from_errors(0.5, 0.5, 1e-5) == 0.0  # coin flip: nothing
    assert tradeoff.epsilon_from_errors(0.0, 0.3, 0.0) == math.inf
    assert tradeoff.mu_from_errors(0.6, 0.6) == 0.0


def test_invalid_parameters_raise():
    with pytest.raises(ValueError):
        Gaussian(-1.0)
    with pytest.raises(ValueError):
        ApproxDP(1.0, 1.5)
    with pytest.raises(ValueError):
        Envelope(())
    with pytest.raises(ValueError):
        tradeoff.gaussian_epsilon(1.0, 0.0)
