"""Tuning accountant: dp-accounting's RepeatAndSelectDpEvent against Papernot & Steinke's closed forms
(arXiv 2110.03620: Theorem 2, its geometric and logarithmic cases, Theorem 6 for Poisson), written here
from the paper as an independent reference; the budget-total calibration; the exact K = 1 reduction; and
the draws (reproducible, and distributed as accounted)."""

import math

import dp_accounting
import numpy as np
import pytest
from scipy.optimize import brentq

from mechanisms.accounting.compare import DpsgdSetting
from mechanisms.accounting.sound import epsilon as pld_epsilon
from mechanisms.accounting.tuning_cost import (
    ORDERS,
    Choice,
    LogRange,
    RunCount,
    TuneSpec,
    account,
    draw_candidates,
    fixed_runs_epsilon,
    rdp_to_epsilon,
    run_rdp,
    selection_rdp,
    tuned_epsilon,
)

DELTA = 1e-5
LAMBDAS = np.asarray(ORDERS, dtype=float)
# A DP-SGD run shaped like the digits example (1,438 training records, batch 64, 5 epochs) and, as a base
# whose RDP curve is known in closed form, 20 full-batch Gaussian releases (RDP = 20 lambda / (2 sigma^2)).
DIGITS = DpsgdSetting.poisson(64 / 1438, 5 * (1438 // 64), DELTA).parts()
FULL_BATCH = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(8.0), 20)


# --- The reference, from the paper -------------------------------------------------------------

def ref_mean(gamma: float, eta: float) -> float:
    """Definition 1: E[K] = eta (1 - gamma) / (gamma (1 - gamma^eta)); (1/gamma - 1) / log(1/gamma) at eta = 0."""
    if eta == 0:
        return (1 - gamma) / (gamma * math.log(1 / gamma))
    return eta * (1 - gamma) / (gamma * (1 - gamma**eta))


def ref_gamma(mean: float, eta: float) -> float:
    return brentq(lambda g: ref_mean(g, eta) - mean, 1e-15, 1 - 1e-15, xtol=1e-15, rtol=1e-14)


def ref_tnb_pmf(k: np.ndarray, gamma: float, eta: float) -> np.ndarray:
    """Definition 1: P[K = k] = (1 - gamma)^k / (gamma^-eta - 1) prod_{l<k} (l + eta) / (l + 1); eta = 0:
    (1 - gamma)^k / (k log(1 / gamma))."""
    k = np.asarray(k, dtype=float)
    if eta == 0:
        return (1 - gamma) ** k / (k * math.log(1 / gamma))
    from scipy.special import gammaln
    log_prod = gammaln(k + eta) - gammaln(eta) - gammaln(k + 1)
    return np.exp(k * math.log(1 - gamma) + log_prod) / (gamma**-eta - 1)


def monotone_envelope(rdp: np.ndarray) -> np.ndarray:
    """RDP is non-decreasing in the order, so the bound at lambda is also the least bound at any order >= lambda."""
    return np.minimum.accumulate(rdp[::-1])[::-1]


def ref_theorem2(rdp: np.ndarray, mean: float, eta: float) -> np.ndarray:
    """Theorem 2: eps'(lambda) = eps(lambda) + (1 + eta)(1 - 1/lhat) eps(lhat) + (1 + eta) log(1/gamma) / lhat
    + log(E[K]) / (lambda - 1), minimised over lhat (any order of the grid)."""
    gamma = 1.0 if mean == 1 else ref_gamma(mean, eta)
    term = (1 + eta) * np.min((1 - 1 / LAMBDAS) * rdp + math.log(1 / gamma) / LAMBDAS)
    return monotone_envelope(rdp + term + math.log(mean) / (LAMBDAS - 1))


def ref_geometric(rdp: np.ndarray, mean: float) -> np.ndarray:
    """The geometric corollary (eta = 1, gamma = 1 / E[K]):
    eps' = eps(lambda) + 2 (1 - 1/lhat) eps(lhat) + 2 log(E[K]) / lhat + log(E[K]) / (lambda - 1)."""
    term = np.min(2 * (1 - 1 / LAMBDAS) * rdp + 2 * math.log(mean) / LAMBDAS)
    return monotone_envelope(rdp + term + math.log(mean) / (LAMBDAS - 1))


def ref_logarithmic(rdp: np.ndarray, mean: float) -> np.ndarray:
    """The logarithmic case (eta = 0):
    eps' = eps(lambda) + (1 - 1/lhat) eps(lhat) + log(1/gamma) / lhat + log(E[K]) / (lambda - 1)."""
    gamma = ref_gamma(mean, 0)
    term = np.min((1 - 1 / LAMBDAS) * rdp + math.log(1 / gamma) / LAMBDAS)
    return monotone_envelope(rdp + term + math.log(mean) / (LAMBDAS - 1))


def ref_delta(rdp: np.ndarray, eps_hat: float) -> float:
    """(eps_hat, delta_hat)-DP from RDP: Canonne, Kamath & Steinke 2020 Prop. 12,
    delta = exp((a - 1)(eps_a - eps_hat)) / a * (1 - 1/a)^(a - 1), and delta <= sqrt(1 - exp(-eps_a)) (KL)."""
    finite = np.isfinite(rdp)
    a, r = LAMBDAS[finite], rdp[finite]
    cks = (a - 1) * (r - eps_hat) - np.log(a) + (a - 1) * np.log1p(-1 / a)
    kl = 0.5 * np.log1p(-np.exp(-r))
    return float(min(1.0, np.exp(np.minimum(cks, kl)).min()))


def ref_poisson(rdp: np.ndarray, mean: float) -> np.ndarray:
    """Theorem 6: Q is (lambda, eps)-RDP and (eps_hat, delta_hat)-DP with e^eps_hat <= 1 + 1/(lambda - 1), so
    eps'(lambda) = eps(lambda) + mu delta_hat + log(mu) / (lambda - 1); eps_hat at that largest value."""
    out = np.empty_like(rdp)
    for i, lam in enumerate(LAMBDAS):
        delta_hat = ref_delta(rdp, math.log1p(1 / (lam - 1)))
        out[i] = rdp[i] + mean * delta_hat + math.log(mean) / (lam - 1)
    return out


def ref_epsilon(rdp: np.ndarray, delta: float) -> float:
    """Canonne, Kamath & Steinke Prop. 12: eps = min over orders of eps_a + log(1 - 1/a) - log(delta a) / (a - 1);
    0 where the KL bound already gives delta."""
    finite = np.isfinite(rdp)
    a, r = LAMBDAS[finite], rdp[finite]
    eps = np.where(delta**2 + np.expm1(-r) > 0, 0.0, r + np.log1p(-1 / a) - np.log(delta * a) / (a - 1))
    return float(max(0.0, eps.min()))


def reference(rdp: np.ndarray, runs: RunCount) -> np.ndarray:
    if runs.distribution == "poisson":
        return ref_poisson(rdp, runs.mean)
    if runs.distribution == "geometric":
        return ref_geometric(rdp, runs.mean)
    if runs.distribution == "logarithmic":
        return ref_logarithmic(rdp, runs.mean)
    return ref_theorem2(rdp, runs.mean, runs.shape)


def assert_close(ours: np.ndarray, ref: np.ndarray, rel: float) -> None:
    assert np.array_equal(np.isfinite(ours), np.isfinite(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(ours[finite], ref[finite], rtol=rel, atol=1e-12)


RUNS = [RunCount("geometric", 4), RunCount("geometric", 16), RunCount("logarithmic", 8),
        RunCount("negative-binomial", 8, 0.5), RunCount("negative-binomial", 4, 3.0),
        RunCount("poisson", 2), RunCount("poisson", 8), RunCount("poisson", 16)]


# --- dp-accounting against the closed forms ----------------------------------------------------

def test_base_curve_of_the_closed_form_case():
    """The full-batch base: dp-accounting's curve is 20 lambda / (2 * 64), so the comparisons below rest on
    a base curve known exactly."""
    np.testing.assert_allclose(run_rdp(FULL_BATCH), 20 * LAMBDAS / (2 * 64.0), rtol=1e-12)


@pytest.mark.parametrize("runs", RUNS, ids=lambda r: r.label())
@pytest.mark.parametrize("base", ["full-batch", "dp-sgd"])
def test_selection_rdp_matches_the_paper(runs, base):
    event = FULL_BATCH if base == "full-batch" else DIGITS(1.2)
    rdp = 20 * LAMBDAS / (2 * 64.0) if base == "full-batch" else run_rdp(event)
    ours = selection_rdp([event], runs)
    ref = reference(rdp, runs)
    # gamma: dp-accounting bisects to a relative 1e-9 (rounding down), the reference solves to 1e-14
    assert_close(ours, ref, rel=1e-6)
    assert math.isclose(tuned_epsilon([event], runs, DELTA), ref_epsilon(ref, DELTA), rel_tol=1e-6)
    assert tuned_epsilon([event], runs, DELTA) > rdp_to_epsilon(rdp, DELTA)  # tuning is never free


def test_theorem2_reduces_to_its_corollaries():
    """The reference is self-consistent: Theorem 2 at eta = 1 and eta = 0 equals the corollaries."""
    rdp = run_rdp(DIGITS(1.0))
    assert_close(ref_theorem2(rdp, 8, 1.0), ref_geometric(rdp, 8), rel=1e-9)
    assert_close(ref_theorem2(rdp, 8, 0.0), ref_logarithmic(rdp, 8), rel=1e-9)


def test_poisson_point_by_hand():
    """One order worked through by hand for the full-batch base (rho = 20 / 128 zCDP), Poisson mean 8."""
    lam = 8.0
    i = int(np.argmin(abs(LAMBDAS - lam)))
    rdp = 20 * LAMBDAS / 128
    eps_hat = math.log(1 + 1 / 7)
    # delta_hat: the best order's CKS conversion, in logs (large orders overflow otherwise)
    log_deltas = [(a - 1) * (r - eps_hat) - math.log(a) + (a - 1) * math.log1p(-1 / a)
                  for a, r in zip(LAMBDAS, rdp, strict=True)]
    delta_hat = min(math.exp(min(log_deltas)), min(math.sqrt(1 - math.exp(-r)) for r in rdp))
    expected = 20 * lam / 128 + 8 * delta_hat + math.log(8) / 7
    assert math.isclose(selection_rdp([FULL_BATCH], RunCount("poisson", 8))[i], expected, rel_tol=1e-9)


def test_mixture_of_settings_uses_the_worst_curve():
    """Candidates with different batch sizes: Q's curve is the pointwise maximum of theirs."""
    small = DpsgdSetting.poisson(32 / 1438, 5 * (1438 // 32), DELTA).parts()(1.2)
    large = DpsgdSetting.poisson(128 / 1438, 5 * (1438 // 128), DELTA).parts()(1.2)
    runs = RunCount("negative-binomial", 8, 0.5)
    worst = np.maximum(run_rdp(small), run_rdp(large))
    assert_close(selection_rdp([small, large], runs), ref_theorem2(worst, 8, 0.5), rel=1e-6)
    for one in (small, large):
        assert tuned_epsilon([small, large], runs, DELTA) >= tuned_epsilon([one], runs, DELTA)
    # the curve-level path equals dp-accounting's event path where both apply
    assert_close(selection_rdp([small, small, small], runs), selection_rdp([small], runs), rel=0)


# --- K = 1 ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("runs", [RunCount("geometric", 1), RunCount("logarithmic", 1),
                                  RunCount("negative-binomial", 1, 2.0)], ids=lambda r: r.label())
def test_single_run_is_the_run(runs):
    """K = 1 always (a truncated count with mean 1): the selection is one run, its epsilon the run's (PLD)."""
    event = DIGITS(1.1)
    assert runs.single and {runs.draw(seed) for seed in range(50)} == {1}
    assert tuned_epsilon([event], runs, DELTA) == pld_epsilon(event, DELTA)
    assert tuned_epsilon([event], runs, DELTA) < rdp_to_epsilon(selection_rdp([event], runs), DELTA)


def test_what_dp_accounting_does_at_mean_one():
    """dp-accounting's geometric at mean 1 (gamma = 1) adds exactly 2 min_lhat (1 - 1/lhat) eps(lhat) to every
    order: Theorem 2's term, which vanishes only at lhat = 1, an order its grid (from 1.1) does not hold.
    That is why `tuned_epsilon` answers a deterministic single run with the run's own epsilon."""
    rdp = run_rdp(DIGITS(1.1))
    ours = selection_rdp([DIGITS(1.1)], RunCount("geometric", 1))
    finite = np.isfinite(rdp)
    added = 2 * np.min((1 - 1 / LAMBDAS[finite]) * rdp[finite])
    assert added > 0
    np.testing.assert_allclose(ours[finite] - rdp[finite], added, rtol=1e-9)
    assert_close(ours, ref_geometric(rdp, 1), rel=1e-12)


def test_poisson_mean_one_is_not_one_run():
    """Poisson(1) can give 0, 1, 2, ... runs: no reduction, and RDP accounting throughout."""
    runs = RunCount("poisson", 1)
    assert not runs.single and {runs.draw(seed) for seed in range(200)} >= {0, 1, 2}
    assert tuned_epsilon([DIGITS(1.1)], runs, DELTA) > pld_epsilon(DIGITS(1.1), DELTA)


# --- Budgets -------------------------------------------------------------------------------------

@pytest.mark.parametrize("runs, target", [(RunCount("poisson", 8), 1.0), (RunCount("geometric", 16), 2.0),
                                          (RunCount("logarithmic", 4), 8.0),
                                          (RunCount("negative-binomial", 8, 0.5), 2.0)], ids=str)
def test_budget_total_meets_the_target(runs, target):
    result = account((DIGITS,), runs, target, DELTA, "total")
    assert target * (1 - 1e-3) <= result.epsilon_tuned <= target
    # checked independently: the reference's epsilon for the calibrated noise
    ref = ref_epsilon(reference(run_rdp(DIGITS(result.sigmas[0])), runs), DELTA)
    assert math.isclose(ref, result.epsilon_tuned, rel_tol=1e-6) and ref <= target * (1 + 1e-6)
    per_run = account((DIGITS,), runs, target, DELTA, "per-run")
    assert result.sigmas[0] > per_run.sigmas[0]
    assert result.epsilon_run < target


def test_budget_per_run_reports_the_cost_on_top():
    runs = RunCount("poisson", 8)
    result = account((DIGITS,), runs, 2.0, DELTA, "per-run")
    assert 2.0 * (1 - 1e-3) <= result.epsilon_run <= 2.0
    assert result.epsilon_run_rdp > result.epsilon_run  # RDP is looser than PLD for the same run
    assert result.epsilon_tuned == tuned_epsilon([DIGITS(result.sigmas[0])], runs, DELTA) > result.epsilon_run_rdp


def test_budget_total_single_run_is_the_ordinary_calibration():
    result = account((DIGITS,), RunCount("geometric", 1), 2.0, DELTA, "total")
    assert 2.0 * (1 - 1e-3) <= result.epsilon_tuned == result.epsilon_run <= 2.0


def test_fixed_grid_is_composition():
    """Best of a fixed N runs: bounded by their composition only."""
    event = DIGITS(1.2)
    assert fixed_runs_epsilon([event], DELTA) == pld_epsilon(event, DELTA)
    assert math.isclose(fixed_runs_epsilon([event] * 6, DELTA),
                        pld_epsilon(dp_accounting.SelfComposedDpEvent(event, 6), DELTA), rel_tol=1e-3)


# --- Draws ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("runs", RUNS[:5] + [RunCount("poisson", 8)], ids=lambda r: r.label())
def test_draws_follow_the_accounted_distribution(runs):
    """The executed K has the accounted law: the empirical mean and P[K = 1] over 3,000 seeds."""
    draws = np.array([runs.draw(seed) for seed in range(3000)])
    assert draws.min() >= (0 if runs.distribution == "poisson" else 1)
    assert abs(draws.mean() - runs.mean) < 5 * draws.std() / math.sqrt(len(draws))
    if runs.distribution == "poisson":
        p1 = runs.mean * math.exp(-runs.mean)
    else:
        eta = runs.dp_shape
        p1 = float(ref_tnb_pmf(np.array([1]), ref_gamma(runs.mean, eta), eta)[0])
    assert abs((draws == 1).mean() - p1) < 5 * math.sqrt(p1 * (1 - p1) / len(draws)) + 1e-3


def test_draws_are_reproducible_and_prefix_stable():
    space = (Choice("lr", (0.05, 0.1, 0.2)), LogRange("clip", 0.01, 1.0), LogRange("batch_size", 32, 128, True))
    spec = TuneSpec(space, RunCount("poisson", 8))
    assert spec.draw(7) == spec.draw(7) and spec.draw(7) != spec.draw(8)
    assert len(spec.draw(7)) == spec.runs.draw(7)
    assert draw_candidates(space, 3, 7) == draw_candidates(space, 20, 7)[:3]
    for c in draw_candidates(space, 200, 1):
        params = c.as_dict()
        assert params["lr"] in (0.05, 0.1, 0.2) and 0.01 <= params["clip"] <= 1.0
        assert isinstance(params["batch_size"], int) and 32 <= params["batch_size"] <= 128
    clips = np.log([c.as_dict()["clip"] for c in draw_candidates(space, 2000, 2)])
    assert abs(clips.mean() - math.log(0.1)) < 0.1  # log-uniform on [0.01, 1]: centred on 0.1


def test_privacy_support_covers_every_setting():
    spec = TuneSpec((Choice("lr", (0.1, 0.2)), Choice("batch_size", (64, 128)), LogRange("epochs", 2, 4, True)),
                    RunCount("geometric", 8))
    assert len(spec.privacy_support()) == 6
    assert {"batch_size": 64, "epochs": 3} in spec.privacy_support()
    assert TuneSpec((Choice("lr", (0.1,)),), RunCount("geometric", 8)).privacy_support() == ({},)
    with pytest.raises(ValueError, match="continuous range"):
        TuneSpec((LogRange("batch_size", 32, 64),), RunCount("geometric", 8)).privacy_support()


@pytest.mark.parametrize("args, message", [
    (("poisson", -1), "mean number of runs"), (("uniform", 8), "unknown run-count distribution"),
    (("negative-binomial", 8), "shape in"), (("geometric", 8, 2.0), "no shape"), (("poisson", 0.5), ">= 1"),
])
def test_bad_run_counts(args, message):
    with pytest.raises(ValueError, match=message):
        RunCount(*args)


def test_noisy_validation_score_is_part_of_each_run():
    """A noised validation count composes into Q: its Gaussian RDP (lambda / (2 s^2)) adds to the run's curve."""
    from mechanisms.accounting.tuning_cost import noisy_score

    run = DIGITS(1.2)
    with_score = dp_accounting.ComposedDpEvent([run, noisy_score(20.0)])
    assert_close(run_rdp(with_score), run_rdp(run) + LAMBDAS / (2 * 400.0), rel=1e-12)
    runs = RunCount("poisson", 8)
    assert tuned_epsilon([with_score], runs, DELTA) > tuned_epsilon([run], runs, DELTA)
    with pytest.raises(ValueError, match="val_noise"):
        noisy_score(0)


def test_fixed_size_batches_are_tuned_under_replace_one():
    """A fixed-batch run (replace-one) keeps its relation inside the selection, as its own RDP does."""
    fixed = DpsgdSetting.of("fixed", 1258, 64, 5, DELTA).parts()(1.5)  # 5 epochs of 20 steps
    runs = RunCount("geometric", 8)
    assert_close(selection_rdp([fixed], runs), ref_geometric(run_rdp(fixed), 8), rel=1e-6)
    poisson = DpsgdSetting.poisson(64 / 1258, 100, DELTA).parts()(1.5)
    assert tuned_epsilon([fixed], runs, DELTA) > tuned_epsilon([poisson], runs, DELTA)


def test_given_per_run_sigma_is_kept_or_scaled():
    """A mechanism that picked its own per-run sigma: per-run keeps it, total scales it to the target."""
    runs = RunCount("geometric", 8)
    per_run = account((DIGITS,), runs, 2.0, DELTA, "per-run", base_sigmas=(1.1,))
    assert per_run.sigmas == (1.1,) and per_run.epsilon_tuned == tuned_epsilon([DIGITS(1.1)], runs, DELTA)
    total = account((DIGITS,), runs, 2.0, DELTA, "total", base_sigmas=(1.1,))
    assert 2.0 * (1 - 1e-3) <= total.epsilon_tuned <= 2.0
    assert math.isclose(total.sigmas[0], account((DIGITS,), runs, 2.0, DELTA, "total").sigmas[0], rel_tol=2e-3)
    with pytest.raises(ValueError, match="base sigmas"):
        account((DIGITS,), runs, 2.0, DELTA, "total", base_sigmas=(1.1, 1.2))


def test_candidates_train_with_independent_seeds():
    from mechanisms.accounting.tuning_cost import candidate_seed

    seeds = [candidate_seed(0, i) for i in range(100)] + [candidate_seed(1, i) for i in range(100)]
    assert len(set(seeds)) == 200 and all(0 <= s < 2**31 for s in seeds)
    assert candidate_seed(0, 3) == candidate_seed(0, 3)


def test_runs_without_a_sound_rdp_analysis_are_refused():
    """Label randomized response needs replace-one, where dp-accounting's RDP reads Gaussians differently
    from PLD: no tuned epsilon rather than a wrong one."""
    run = dp_accounting.ComposedDpEvent([DIGITS(1.0), dp_accounting.RandomizedResponseDpEvent(0.5, 2)])
    with pytest.raises(ValueError, match="cannot analyse"):
        tuned_epsilon([run], RunCount("poisson", 8), DELTA)
