"""Sound accountants: published/measured values (published values), PLD vs PRV vs RDP, samplers,
the PRV guard, and monotonicity (hypothesis)."""

import math

import dp_accounting
import pytest
from dp_accounting import pld as dp_pld
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mechanisms.accounting import epsilon, epsilon_report
from mechanisms.accounting import prv as prv_module
from mechanisms.accounting.adaptive_pld import discretization_for
from mechanisms.accounting.compare import DpsgdSetting
from mechanisms.accounting.reference import _pld_epsilon, pld_accountant, rdp_accountant
from mechanisms.parts.batch_selection import PoissonRate, batch_selection
from tests.events import poisson_event

MNIST = (1.1, 256 / 60000, 14063)
CIFAR = (3.0, 4096 / 50000, 2500)
SST2 = (0.8, 1024 / 67349, 198)
LONG = (0.6, 256 / 50000, 19532)


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


@pytest.mark.parametrize("setting", [MNIST, CIFAR, SST2, (0.9, 0.01, 1000), (2.0, 0.0625, 10), (1.5, 0.5, 20)])
def test_pld_and_prv_agree_within_two_percent(setting):
    event = poisson_event(*setting)
    pld, report = epsilon(event, 1e-5, "pld"), epsilon_report(event, 1e-5, "prv")
    assert report.epsilon == pytest.approx(pld, rel=0.02)


def test_small_epsilon_is_not_over_reported_by_discretisation():
    """PLD at h = 1e-3 over-reports small epsilons (+12% here); the adaptive interval matches PRV."""
    event = poisson_event(5.0, 0.004, 2000)
    assert discretization_for(event, 1e-5) < 1e-3
    tight = epsilon(event, 1e-5, "pld")
    coarse = dp_pld.PLDAccountant(value_discretization_interval=1e-3).compose(event).get_epsilon(1e-5)
    assert coarse > 1.05 * tight
    assert tight == pytest.approx(epsilon(event, 1e-5, "prv"), rel=0.01)
    assert discretization_for(poisson_event(*CIFAR), 1e-5) == 1e-3  # moderate epsilon keeps the fast interval


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


def test_unsupported_nonprivate_and_bad_input():
    assert epsilon(dp_accounting.NonPrivateDpEvent(), 1e-5) == math.inf
    assert epsilon(dp_accounting.UnsupportedDpEvent(), 1e-5) is None
    laplace = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.LaplaceDpEvent(1.0))
    assert epsilon(laplace, 1e-5, "prv") is None  # PRV adapter says unsupported, never guesses
    assert epsilon(laplace, 1e-5, "pld") is not None
    for delta in (0, 1, -1e-5, 2):
        with pytest.raises(ValueError, match="delta"):
            epsilon(poisson_event(*MNIST), delta)
    with pytest.raises(ValueError, match="unknown accountant"):
        epsilon(poisson_event(*MNIST), 1e-5, "gdp")


@pytest.mark.parametrize("kwargs", [dict(sample_rate=0), dict(sample_rate=1.5), dict(steps=0)])
def test_event_bad_input(kwargs):
    args = dict(sample_rate=0.1, steps=10) | kwargs
    with pytest.raises(ValueError):
        PoissonRate(**args)


@pytest.mark.parametrize("sampler", ["cyclic"])
def test_unknown_sampler(sampler):
    with pytest.raises(ValueError, match="unknown sampler"):
        batch_selection(sampler, 100, 10, 1)


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
