"""Generic composition and amplification rules against published numbers and dp-accounting (arXiv 2407.15414,
2309.06746)."""

import math

import dp_accounting
import pytest
from dp_accounting.pld import common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.accounting import composition as comp


def test_advanced_composition_formula():
    eps, delta = comp.advanced_composition(0.1, 100, 1e-6, delta_step=1e-8)
    assert eps == pytest.approx(100 * 0.01 / 2 + math.sqrt(2 * math.log(1e6) * 100 * 0.01))
    assert delta == pytest.approx(100 * 1e-8 + 1e-6)
    # large per-step epsilon: basic composition wins the min
    assert comp.advanced_composition(5.0, 3, 1e-6)[0] == pytest.approx(15.0)


@pytest.mark.parametrize(("eps", "T", "slack"),
                         [(0.1, 100, 1e-6), (0.5, 20, 1e-5), (0.01, 1000, 1e-6), (1.0, 10, 1e-3)])
def test_advanced_composition_bounds_the_optimal_composition(eps, T, slack):
    """Never below the exact T-fold composition of an epsilon-DP mechanism's worst case (dp-accounting's PLD of
    it, independent of the theorem), and not far above it at these settings (at most 26% here)."""
    worst = pld_lib.from_privacy_parameters(common.DifferentialPrivacyParameters(eps, 0.0),
                                            value_discretization_interval=1e-4)
    optimal = worst.self_compose(T).get_epsilon_for_delta(slack)
    assert optimal <= comp.advanced_composition(eps, T, slack)[0] <= 1.3 * optimal


@settings(max_examples=50, deadline=None)
@given(eps=st.floats(1e-3, 50), T=st.integers(1, 100_000), log_slack=st.floats(-14, -2))
def test_advanced_composition_inverse(eps, T, log_slack):
    slack = math.exp(log_slack)
    step = comp.advanced_composition_step(eps, T, slack)
    assert comp.advanced_composition(step, T, slack)[0] == pytest.approx(eps, rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(eps=st.floats(0, 20), delta=st.floats(0, 1e-3), q=st.floats(1e-5, 1))
def test_amplification_round_trip_and_gain(eps, delta, q):
    amp_eps, amp_delta = comp.amplify(eps, delta, q)
    assert amp_eps <= eps + 1e-12 and amp_delta <= delta
    back = comp.deamplify(amp_eps, amp_delta, q)
    assert back[0] == pytest.approx(eps, rel=1e-9, abs=1e-12)
    assert back[1] == pytest.approx(delta, rel=1e-12, abs=1e-300)


def test_randomized_response():
    assert comp.rr_epsilon(0.9, 2) == pytest.approx(math.log(9))  # DP-Forward's label RR
    for k in (2, 5, 100):
        assert comp.rr_keep_probability(comp.rr_epsilon(0.7, k), k) == pytest.approx(0.7)
    # independent: dp-accounting's PLD of K-ary randomized response (replace-one), p = 1 - nu + nu / K
    for p, k in [(0.9, 2), (0.5, 4)]:
        nu = (1 - p) * k / (k - 1)
        acc = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE,
                                              value_discretization_interval=1e-4)
        acc.compose(dp_accounting.RandomizedResponseDpEvent(nu, k))
        assert acc.get_epsilon(1e-12) == pytest.approx(comp.rr_epsilon(p, k), abs=2e-3)


def test_basic_composition_theorem4():
    """DP-Forward Thm 4: aGM (eps1, delta) on f(X) plus RR eps2 on y is (eps1 + eps2, delta)."""
    assert comp.basic_composition([8.0, math.log(9)], [1e-5, 0.0]) == pytest.approx((8 + math.log(9), 1e-5))
    with pytest.raises(ValueError):
        comp.basic_composition([])
    with pytest.raises(ValueError):
        comp.basic_composition([1.0], [1e-5, 1e-5])


@pytest.mark.parametrize("call", [
    lambda: comp.advanced_composition(-1, 10, 1e-5), lambda: comp.advanced_composition(1, 0, 1e-5),
    lambda: comp.advanced_composition(1, 10, 0), lambda: comp.amplify(1, 0, 0), lambda: comp.rr_epsilon(1.0, 2),
    lambda: comp.rr_epsilon(0.9, 1),
])
def test_bad_input(call):
    with pytest.raises(ValueError):
        call()
