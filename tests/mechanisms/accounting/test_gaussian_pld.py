"""`gaussian_pld` and `hockey_stick` against dp-accounting, the library they speed up: the same pmfs (every
delta on a dense epsilon grid, before and after composition) on both algorithms and both adjacencies, and
the same hockey-stick divergence, including where dp-accounting's private layout is not there."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from mechanisms.accounting.gaussian_pld import epsilon_for_delta, gaussian_pld, hockey_stick, inverse_privacy_loss

EPS = np.concatenate([np.linspace(-3.0, 40.0, 900), [np.inf]])


def reference(sigma: float, q: float, h: float, pessimistic: bool):
    return pld_lib.from_gaussian_mechanism(standard_deviation=sigma, sampling_prob=q, pessimistic_estimate=pessimistic,
                                           use_connect_dots=pessimistic, value_discretization_interval=h)


@pytest.mark.parametrize("pessimistic", [True, False], ids=["connect-dots", "buckets"])
@pytest.mark.parametrize("sigma,q,h", [(0.3, 0.0085, 1e-3), (0.53, 0.0085, 2.7e-4), (1.09, 0.1, 1e-3),
                                       (0.8, 0.9, 5e-4), (3.0, 1.0, 1e-3), (20.0, 0.02, 1e-3)])
def test_the_same_distribution_as_dp_accounting(sigma, q, h, pessimistic):
    ours, theirs = gaussian_pld(sigma, q, h, pessimistic=pessimistic), reference(sigma, q, h, pessimistic)
    np.testing.assert_allclose(ours.get_delta_for_epsilon(EPS), theirs.get_delta_for_epsilon(EPS), rtol=0, atol=1e-15)
    composed = ours.self_compose(60).get_epsilon_for_delta(1e-5)
    assert composed == pytest.approx(theirs.self_compose(60).get_epsilon_for_delta(1e-5), rel=1e-12, abs=1e-12)


def test_the_inverse_is_dp_accountings_on_an_array():
    from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType, GaussianPrivacyLoss

    for adjacency, eps in ((AdjacencyType.REMOVE, np.linspace(-0.009, 30, 301)),
                           (AdjacencyType.ADD, np.linspace(-30, 0.0094, 301))):
        loss = GaussianPrivacyLoss(0.7, sampling_prob=0.01, adjacency_type=adjacency)
        expected = [loss.inverse_privacy_loss(e) for e in eps]
        np.testing.assert_allclose(inverse_privacy_loss(loss, eps), expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="range"):
        inverse_privacy_loss(GaussianPrivacyLoss(0.7, sampling_prob=0.01, adjacency_type=AdjacencyType.ADD), [1.0])


@pytest.mark.parametrize("sigma,q", [(0.53, 0.0085), (1.0, 0.3), (2.0, 1.0)])
def test_hockey_stick_is_dp_accountings_divergence(sigma, q):
    composed = reference(sigma, q, 1e-3, True).self_compose(200)
    np.testing.assert_allclose(hockey_stick(composed, EPS), composed.get_delta_for_epsilon(EPS), rtol=0, atol=1e-15)


@pytest.mark.parametrize("pessimistic", [True, False], ids=["connect-dots", "buckets"])
@pytest.mark.parametrize("sigma,q,steps", [(0.53, 0.0085, 585), (1.09, 0.0085, 585), (0.8, 0.2, 50), (30.0, 0.01, 10),
                                           (0.3, 1.0, 50), (2.0, 1.0, 1)])
def test_epsilon_for_delta_is_dp_accountings(sigma, q, steps, pessimistic):
    """Equal up to the rounding of dp-accounting's own loss grid, which it builds by repeated subtraction."""
    composed = reference(sigma, q, 1e-3, pessimistic).self_compose(steps)
    for delta in (1e-10, 1e-5, 0.3, 0.999):
        assert epsilon_for_delta(composed, delta) == pytest.approx(composed.get_epsilon_for_delta(delta), rel=1e-9,
                                                                   abs=1e-12)


def test_both_ask_dp_accounting_when_the_layout_is_unknown():
    composed = reference(1.0, 0.05, 1e-3, True).self_compose(50)

    class PublicOnly:  # a PLD that exposes only dp-accounting's public methods
        def get_delta_for_epsilon(self, eps):
            return composed.get_delta_for_epsilon(eps)

        def get_epsilon_for_delta(self, delta):
            return composed.get_epsilon_for_delta(delta)

    np.testing.assert_array_equal(hockey_stick(PublicOnly(), EPS), composed.get_delta_for_epsilon(EPS))
    assert epsilon_for_delta(PublicOnly(), 1e-5) == composed.get_epsilon_for_delta(1e-5)


def test_bad_parameters_raise():
    for args in ((0.0, 0.1, 1e-3), (1.0, 0.0, 1e-3), (1.0, 1.5, 1e-3), (1.0, 0.1, 0.0)):
        with pytest.raises(ValueError):
            gaussian_pld(*args, pessimistic=True)
