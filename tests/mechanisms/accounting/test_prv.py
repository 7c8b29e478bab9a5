"""The PRV accountant (Gopi et al. 2021, Opacus' port) against the PLD, and its guard: beyond its range or when it
breaks, the PLD value is reported with a note, never a smaller guess."""

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mechanisms.accounting import epsilon, epsilon_report
from mechanisms.accounting import prv as prv_module
from mechanisms.accounting.reference import _pld_epsilon
from tests.events import CIFAR, MNIST, SST2, poisson_event


@pytest.mark.parametrize("setting", [MNIST, CIFAR, SST2, (0.9, 0.01, 1000), (2.0, 0.0625, 10), (1.5, 0.5, 20)])
def test_pld_and_prv_agree_within_two_percent(setting):
    event = poisson_event(*setting)
    pld, report = epsilon(event, 1e-5, "pld"), epsilon_report(event, 1e-5, "prv")
    assert report.epsilon == pytest.approx(pld, rel=0.02)


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(sigma=st.floats(0.8, 4), q=st.floats(1e-3, 0.1), T=st.integers(10, 1500))
@example(sigma=3.0, q=0.0078125, T=10)  # epsilon 0.027: PRV's absolute error (1e-3) is 3.4% of it
def test_pld_and_prv_agree_within_two_percent_random(sigma, q, T):
    """2% relative, or PRV's own stated error (`EPS_ERROR_MIN` absolute) where epsilon is tiny."""
    event = poisson_event(sigma, q, T)
    report = epsilon_report(event, 1e-5, "prv")
    if report.computed_by == "prv":
        assert report.epsilon == pytest.approx(epsilon(event, 1e-5, "pld"), rel=0.02, abs=prv_module.EPS_ERROR_MIN)


def test_prv_guard_falls_back_beyond_its_range():
    event = poisson_event(*CIFAR)
    pld = epsilon(event, 1e-5, "pld")
    guarded = prv_module.PrvAccountant(fallback=_pld_epsilon, max_epsilon=pld / 2).compose(event)
    assert guarded.get_epsilon(1e-5) == pld and "PRV not run" in guarded.note
    assert prv_module.MAX_EPSILON == 50.0


@pytest.mark.slow
def test_prv_guard_falls_back_at_large_epsilon():
    report = epsilon_report(poisson_event(0.25, 0.1, 1000), 1e-5, "prv")
    assert report.computed_by == "pld" and "PRV not run" in report.note
    assert report.epsilon == pytest.approx(epsilon(poisson_event(0.25, 0.1, 1000), 1e-5, "pld"))


@pytest.mark.parametrize("failure", [RuntimeError("Discrete mean differs"), math.inf, math.nan])
def test_prv_guard_falls_back_when_prv_breaks(monkeypatch, failure):
    def broken(self, delta, eps_error=0.01):
        if isinstance(failure, Exception):
            raise failure
        return failure

    monkeypatch.setattr(prv_module.PrvAccountant, "_prv_epsilon", broken)
    event = poisson_event(*CIFAR)
    report = epsilon_report(event, 1e-5, "prv")
    assert report.computed_by == "pld" and "PLD value reported" in report.note
    assert report.epsilon == epsilon(event, 1e-5, "pld")
