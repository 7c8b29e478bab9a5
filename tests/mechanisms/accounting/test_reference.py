"""The built-in sound accountants' arithmetic: published values, RDP never below PLD, the samplers' events
(fixed-size batches, shuffling), exact pure-Gaussian composition, and monotonicity (hypothesis)."""

import math

import dp_accounting
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.accounting import epsilon, epsilon_report
from mechanisms.accounting.compare import DpsgdSetting
from mechanisms.accounting.reference import pld_accountant, rdp_accountant
from tests.events import CIFAR, LONG, MNIST, SST2, poisson_event


@pytest.mark.parametrize("setting, delta, rdp, pld, prv", [
    (MNIST, 1e-5, 2.597, 2.391, 2.392), (CIFAR, 1e-5, 7.099, 6.580, 6.589),
    (SST2, 1 / (2 * 67349), 3.265, 2.636, 2.646),
])
def test_anchor_values(setting, delta, rdp, pld, prv):
    event = poisson_event(*setting)
    assert epsilon(event, delta, "rdp") == pytest.approx(rdp, abs=2e-3)
    assert epsilon(event, delta, "pld") == pytest.approx(pld, abs=2e-3)
    report = epsilon_report(event, delta, "prv")
    assert report.computed_by == "prv" and report.note == ""
    assert report.epsilon == pytest.approx(prv, abs=3e-3)


@pytest.mark.slow
def test_anchor_long_run():
    event = poisson_event(*LONG)
    assert epsilon(event, 1e-5, "rdp") == pytest.approx(17.31, abs=1e-2)
    assert epsilon(event, 1e-5, "pld") == pytest.approx(15.72, abs=1e-2)
    assert epsilon(event, 1e-5, "prv") == pytest.approx(15.73, abs=1e-2)


def test_design_example_and_gdp_paper_pld_values():
    """The MNIST example (sigma 1.1, q 256/60000, 14063 steps) and arXiv 1911.11607 §7.3 PLD column."""
    assert epsilon(poisson_event(*MNIST), 1e-5) == pytest.approx(2.39, abs=5e-3)
    for sigma, epochs, pld in [(1.3, 20, 1.007), (1.06, 20, 1.408), (0.7, 70, 7.095), (0.638, 70, 9.477)]:
        steps = round(epochs * 60000 / 256)
        assert epsilon(poisson_event(sigma, 256 / 60000, steps), 1e-5) == pytest.approx(pld, abs=1.5e-2)


@settings(max_examples=8, deadline=None)
@given(log_sigma=st.floats(math.log(0.7), math.log(100)), q=st.floats(1e-3, 0.3), T=st.integers(1, 600),
       log_delta=st.floats(-12, -3))
def test_rdp_never_below_pld(log_sigma, q, T, log_delta):
    event = poisson_event(math.exp(log_sigma), q, T)
    delta = math.exp(log_delta)
    assert epsilon(event, delta, "rdp") >= epsilon(event, delta, "pld")


def test_fixed_size_batches_replace_one():
    """Replace-one moves the clipped sum by 2C: sigma/2 against the replace-one sensitivity; PLD uses the
    Poisson dominating pair at rate b/n, RDP the without-replacement analysis."""
    sigma, n, b, epochs = 1.1, 60000, 256, 2
    T = epochs * round(n / b)
    fixed = DpsgdSetting.of("fixed", n, b, epochs, 1e-5).parts().dp_event(sigma)
    half = dp_accounting.GaussianDpEvent(sigma / 2)
    pld_expected = pld_accountant().compose(
        dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(b / n, half), T)).get_epsilon(1e-5)
    rdp_expected = rdp_accountant(dp_accounting.NeighboringRelation.REPLACE_ONE).compose(
        dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(n, b, half), T)
    ).get_epsilon(1e-5)
    report = epsilon_report(fixed, 1e-5, "pld")
    assert report.epsilon == pytest.approx(pld_expected) and "fixed-size" in report.note
    assert epsilon(fixed, 1e-5, "rdp") == pytest.approx(rdp_expected)
    poisson = epsilon(poisson_event(sigma, b / n, T), 1e-5)
    assert report.epsilon > poisson  # replace-one is the stronger relation: never reported below Poisson
    assert epsilon(fixed, 1e-5, "rdp") >= report.epsilon


def test_shuffling_gets_no_amplification():
    """One batch per epoch per record: E Gaussians at sigma / 2 (replace-one), exactly, whatever N / B."""
    sigma, n, b, epochs = 1.1, 60000, 256, 9
    shuffle = DpsgdSetting.of("shuffle", n, b, epochs, 1e-5).parts().dp_event(sigma)
    exact = dp_accounting.gaussian_mechanism.get_epsilon_gaussian(sigma / 2 / math.sqrt(epochs), 1e-5)
    assert epsilon(shuffle, 1e-5) == pytest.approx(exact, rel=1e-6)
    fixed = DpsgdSetting.of("fixed", n, b, epochs, 1e-5).parts().dp_event(sigma)
    assert epsilon(shuffle, 1e-5) > epsilon(fixed, 1e-5)


def test_pure_gaussian_composition_is_exact_and_fast():
    event = poisson_event(0.7, 1.0, 1000)  # full batch: PLD would take ~10 s here
    report = epsilon_report(event, 1e-5, "pld")
    assert report.computed_by == "exact"
    assert report.epsilon == pytest.approx(
        dp_accounting.gaussian_mechanism.get_epsilon_gaussian(0.7 / math.sqrt(1000), 1e-5), rel=1e-9)
    small = poisson_event(2.0, 1.0, 10)
    assert epsilon(small, 1e-5) == pytest.approx(
        pld_accountant().compose(small).get_epsilon(1e-5), rel=2e-3)


@settings(max_examples=4, deadline=None)
@given(s1=st.floats(0.8, 4), s2=st.floats(0.8, 4), q=st.floats(1e-3, 0.2), T=st.integers(1, 400),
       d1=st.floats(-12, -3), d2=st.floats(-12, -3), accountant=st.sampled_from(["pld", "rdp"]))
def test_monotone_in_sigma_q_steps_delta(s1, s2, q, T, d1, d2, accountant):
    lo, hi = sorted((s1, s2))
    small, large = sorted((math.exp(d1), math.exp(d2)))
    base = epsilon(poisson_event(lo, q, T), small, accountant)
    tol = 2e-3 if accountant == "pld" else 1e-9  # PLD's pessimistic discretisation of 1e-3
    assert epsilon(poisson_event(hi, q, T), small, accountant) <= base + tol
    assert epsilon(poisson_event(lo, q / 2, T), small, accountant) <= base + tol
    assert base <= epsilon(poisson_event(lo, q, T + 50), small, accountant) + tol
    assert epsilon(poisson_event(lo, q, T), large, accountant) <= base + tol
