"""Scores in, estimates out: `CanaryScoreAuditor`, a NumPy/SciPy mirror of jax_privacy's auditor.

The auditor takes two 1-D score arrays, scores where the canary was present (`held_in`) and
where it was not (`held_out`), higher meaning "present", and offers each estimator as a method
with its confidence explicit. How the scores were made (one mechanism step
sampled many times, or m canaries in one training run) is not its concern.

Thresholds: every estimate is a statement about a decision rule "score >= t means present". Only
thresholds on the upper convex hull of the empirical ROC curve are considered (the others are
dominated for every estimator here); `threshold_strategy` says how the multiple comparisons over
thresholds are paid for: `Bonferroni()` (significance / #thresholds, the default, as jax_privacy),
`Split(frac, seed)` (choose on one part, bound on the other) or `Explicit(t)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import scipy.special
import scipy.stats
from numpy.typing import ArrayLike

from mechanisms.accounting.validation import require_delta
from mechanisms.auditing import one_run, tradeoff
from mechanisms.auditing.binomial import clopper_pearson_upper


@dataclasses.dataclass(frozen=True)
class CanaryScores:
    """Attack scores of one audit, higher = "canary present"."""

    held_in: np.ndarray  # scores where the canary was present
    held_out: np.ndarray  # scores where it was not

    def __post_init__(self) -> None:
        for name in ("held_in", "held_out"):
            arr = np.asarray(getattr(self, name), dtype=np.float64).ravel()
            if arr.size == 0:
                raise ValueError(f"{name} scores must be non-empty")
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"{name} scores must be finite")
            object.__setattr__(self, name, arr)


class ThresholdStrategy:
    """How an estimate pays for choosing among many thresholds."""


@dataclasses.dataclass(frozen=True)
class Bonferroni(ThresholdStrategy):
    """Every hull threshold is tested, each at significance / #thresholds."""


@dataclasses.dataclass(frozen=True)
class Split(ThresholdStrategy):
    """Choose the threshold on a random `threshold_estimation_frac` of each side, bound on the rest."""

    threshold_estimation_frac: float = 0.5
    seed: int | None = None


@dataclasses.dataclass(frozen=True)
class Explicit(ThresholdStrategy):
    """One threshold fixed in advance."""

    threshold: float


def _hull(points: np.ndarray) -> np.ndarray:
    """Indices of the vertices of the upper concave hull of points sorted by x (ties allowed).

    Points that lie on or below a segment joining two others are dropped, repeatedly, until the
    remaining chain turns strictly clockwise; a threshold there is dominated by randomising
    between its neighbours.
    """
    idx = np.arange(len(points))
    while len(idx) > 2:
        d = np.diff(points[idx].astype(np.float64), axis=0)
        cross = d[:-1, 1] * d[1:, 0] - d[1:, 1] * d[:-1, 0]
        drop = cross <= 0
        if not drop.any():
            break
        idx = idx[np.r_[True, ~drop, True]]
    return idx


def roc_counts(held_in: np.ndarray, held_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(thresholds, false-negative counts, true-negative counts) on the ROC hull, thresholds increasing.

    A threshold t classifies "present" when score >= t: fn = #held_in < t, tn = #held_out < t.
    """
    thresholds = np.append(np.union1d(held_in, held_out), np.inf)
    fn = np.searchsorted(np.sort(held_in), thresholds, side="left")
    tn = np.searchsorted(np.sort(held_out), thresholds, side="left")
    keep = _hull(np.stack([fn, tn], axis=1))
    return thresholds[keep], fn[keep], tn[keep]


class CanaryScoreAuditor:
    """Epsilon and mu lower bounds, TPR at FPR and AUROC from held-in / held-out canary scores.

    Mirrors `jax_privacy.auditing.CanaryScoreAuditor` (same method names, arguments and semantics
    for `epsilon_clopper_pearson`, `epsilon_from_gdp`, `epsilon_one_run`, `tpr_at_given_fpr`,
    `attack_auroc`).
    """

    def __init__(self, in_canary_scores: ArrayLike, out_canary_scores: ArrayLike) -> None:
        scores = CanaryScores(np.asarray(in_canary_scores), np.asarray(out_canary_scores))
        self.scores = scores
        self._in, self._out = scores.held_in, scores.held_out
        self._thresholds, self._fn, self._tn = roc_counts(self._in, self._out)

    @property
    def n_in(self) -> int:
        return self._in.size

    @property
    def n_out(self) -> int:
        return self._out.size

    def error_counts(self, threshold: float) -> tuple[int, int]:
        """(false positives among held-out, false negatives among held-in) for "present iff >= t"."""
        return int(np.sum(self._out >= threshold)), int(np.sum(self._in < threshold))

    # -- threshold strategies -------------------------------------------------------------------

    def _with_strategy(self, strategy: ThresholdStrategy,
                       all_thresholds: Callable[[CanaryScoreAuditor, float], tuple[float, float]],
                       one_threshold: Callable[[CanaryScoreAuditor, float, float], float],
                       significance: float) -> float:
        if isinstance(strategy, Explicit):
            return one_threshold(self, significance, strategy.threshold)
        if isinstance(strategy, Split):
            rng = np.random.default_rng(strategy.seed)
            (in_a, in_b), (out_a, out_b) = (_partition(s, rng, strategy.threshold_estimation_frac)
                                            for s in (self._in, self._out))
            _, threshold = all_thresholds(CanaryScoreAuditor(in_a, out_a), significance)
            return one_threshold(CanaryScoreAuditor(in_b, out_b), significance, threshold)
        if isinstance(strategy, Bonferroni):
            return all_thresholds(self, significance / len(self._thresholds))[0]
        raise ValueError(f"unsupported threshold strategy {strategy!r}")

    # -- Clopper-Pearson epsilon ------------------------------------------------------------------

    def _cp_eps(self, fn: np.ndarray, fp: np.ndarray, significance: float, delta: float,
                one_sided: bool) -> np.ndarray:
        fnr_ub = clopper_pearson_upper(fn, self.n_in, significance / 2)
        fpr_ub = clopper_pearson_upper(fp, self.n_out, significance / 2)
        if one_sided:  # only ln((TPR - delta) / FPR), as jax_privacy's one_sided=True
            with np.errstate(divide="ignore", invalid="ignore"):
                tpr_lb = 1 - fnr_ub
                eps = np.where(tpr_lb > delta, np.log(tpr_lb - delta) - np.log(fpr_ub), 0.0)
            return np.maximum(eps, 0.0)
        return tradeoff.epsilon_from_errors(fpr_ub, fnr_ub, delta)

    def epsilon_clopper_pearson(self, significance: float, delta: float = 0.0, one_sided: bool = True,
                                *, threshold_strategy: ThresholdStrategy = Bonferroni()) -> float:
        """Epsilon lower bound from Clopper-Pearson bounds on both error rates (Jagielski et al. 2020).

        `one_sided=False` is the paper's Eq. 45 (both pieces of f_{eps,delta}).
        """
        _check_significance(significance, upper=0.5)
        require_delta(delta, zero=True, one=True)

        def all_t(a: CanaryScoreAuditor, s: float) -> tuple[float, float]:
            eps = a._cp_eps(a._fn, a.n_out - a._tn, s, delta, one_sided)
            i = int(np.argmax(eps))
            return float(eps[i]), float(a._thresholds[i])

        def one_t(a: CanaryScoreAuditor, s: float, t: float) -> float:
            fp, fn = a.error_counts(t)
            return float(a._cp_eps(np.array([fn]), np.array([fp]), s, delta, one_sided)[0])

        return self._with_strategy(threshold_strategy, all_t, one_t, significance)

    # -- GDP ------------------------------------------------------------------------------------

    def mu_clopper_pearson(self, significance: float) -> float:
        """Lower bound on the GDP mu: the largest Phi^-1(1 - FPR_ub) - Phi^-1(FNR_ub) over hull thresholds.

        Bonferroni over the 2 x #thresholds bounds, as jax_privacy's `epsilon_from_gdp`. Only the
        stated orientation (high score = present) counts: flipping it would need lower bounds on
        the error rates, not upper ones.
        """
        _check_significance(significance, upper=0.5)
        s = significance / (2 * len(self._thresholds))
        fnr_ub = clopper_pearson_upper(self._fn, self.n_in, s)
        fpr_ub = clopper_pearson_upper(self.n_out - self._tn, self.n_out, s)
        return float(np.max(tradeoff.mu_from_errors(fpr_ub, fnr_ub)))

    def epsilon_from_gdp(self, significance: float, delta: float) -> float:
        """The epsilon at `delta` of the mu lower bound (Nasr et al. 2023; jax_privacy's method).

        Rests on the mechanism being Gaussian-like (its curve a G_mu); `epsilon_clopper_pearson`
        needs no such assumption.
        """
        require_delta(delta)
        return tradeoff.gaussian_epsilon(self.mu_clopper_pearson(significance), delta)

    # -- one run --------------------------------------------------------------------------------

    def epsilon_one_run(self, significance: float, delta: float, one_sided: bool = True, *,
                        threshold_strategy: ThresholdStrategy = Bonferroni()) -> float:
        """Steinke et al. 2023 lower bound: guess "in" above a threshold, abstain below.

        The held-in and held-out scores are the m = n_in + n_out canaries of one run. As in
        jax_privacy only one-sided guessing (k_- = 0) is supported.
        """
        _check_significance(significance, upper=1.0)
        require_delta(delta, one=True)
        if not one_sided:
            raise ValueError("one_sided must be True")
        return self._one_run(one_run.epsilon_one_run, significance, delta, threshold_strategy)

    def epsilon_one_run_fdp(self, significance: float, delta: float, one_sided: bool = True, *,
                            threshold_strategy: ThresholdStrategy = Bonferroni(), family: str = "gdp") -> float:
        """Mahloujifar, Melis & Chaudhuri (2024, arXiv 2410.22235): the same guesses tested against a curve.

        With `family="gdp"` (jax_privacy's `epsilon_one_run_fdp`, same name, arguments and numbers)
        the rejected claim is "G_mu-DP with respect to every canary" for the mu whose Gaussian
        (epsilon, delta) profile passes through (epsilon, delta): a lower bound on the epsilon of a
        Gaussian-shaped mechanism, and on any mechanism whose own curve lies above that G_mu (checked
        for a trial's certified event before it is used, `gaussian_envelope`). `family="approx-dp"`
        tests the curve f_{epsilon, delta} itself: sound for every (epsilon, delta)-DP mechanism.
        """
        _check_significance(significance, upper=1.0)
        require_delta(delta)
        if not one_sided:
            raise ValueError("one_sided must be True")
        if family not in one_run.FDP_FAMILIES:
            raise ValueError(f"family must be one of {one_run.FDP_FAMILIES}, got {family!r}")

        def audit(m: int, r: int, v: int, s: float, d: float, epsilon_floor: float = 0.0) -> float:
            return one_run.epsilon_one_run_fdp(m, r, v, s, d, epsilon_floor=epsilon_floor, family=family)

        return self._one_run(audit, significance, delta, threshold_strategy)

    def _one_run(self, audit: Callable[..., float], significance: float, delta: float,
                 threshold_strategy: ThresholdStrategy) -> float:
        """Threshold search shared by both one-run estimators (m counts every canary of the auditor)."""

        def all_t(a: CanaryScoreAuditor, s: float) -> tuple[float, float]:
            m = a.n_in + a.n_out
            tp = a.n_in - a._fn
            guesses = tp + (a.n_out - a._tn)
            # Visit thresholds by decreasing precision lower bound: later ones rarely beat the best.
            with np.errstate(divide="ignore", invalid="ignore"):
                precision_lb = 1 - clopper_pearson_upper(guesses - tp, np.maximum(guesses, 1), s)
            best_eps, best_t = 0.0, float(a._thresholds[-1])
            for i in np.argsort(-np.where(guesses > 0, precision_lb, -1.0), kind="stable"):
                r, v = int(guesses[i]), int(tp[i])
                if r == 0 or v / r <= float(scipy.special.expit(best_eps)):
                    continue
                eps = audit(m, r, v, s, delta, epsilon_floor=best_eps)
                if eps > best_eps:
                    best_eps, best_t = eps, float(a._thresholds[i])
            return best_eps, best_t

        def one_t(a: CanaryScoreAuditor, s: float, t: float) -> float:
            fp, fn = a.error_counts(t)
            tp = a.n_in - fn
            return audit(a.n_in + a.n_out, tp + fp, tp, s, delta)

        return self._with_strategy(threshold_strategy, all_t, one_t, significance)

    # -- descriptive ----------------------------------------------------------------------------

    def tpr_at_given_fpr(self, fpr: ArrayLike) -> np.ndarray | float:
        """Largest TPR at FPR, randomising between hull thresholds (linear interpolation)."""
        fpr = np.asarray(fpr, dtype=np.float64)
        if np.any((fpr < 0) | (fpr > 1)):
            raise ValueError(f"fpr must lie in [0, 1], got {fpr}")
        x = ((self.n_out - self._tn) / self.n_out)[::-1]  # increasing FPR
        y = ((self.n_in - self._fn) / self.n_in)[::-1]
        out = _max_interp(fpr, x, y)
        return float(out) if out.ndim == 0 else out

    def attack_auroc(self) -> float:
        """Area under the hull ROC curve (trapezoids)."""
        x = ((self.n_out - self._tn) / self.n_out)[::-1]
        y = ((self.n_in - self._fn) / self.n_in)[::-1]
        return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2))


def _max_interp(xq: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Interpolate y(x) on a chain whose x may repeat (vertical steps): take the top of each step."""
    keep = np.r_[x[1:] != x[:-1], True]  # last point of every run of equal x has the largest y
    xs, ys = x[keep], y[keep]
    return np.asarray(np.interp(xq, xs, ys, left=ys[0]))


def _partition(scores: np.ndarray, rng: np.random.Generator, frac: float) -> tuple[np.ndarray, np.ndarray]:
    if not 0 < frac < 1:
        raise ValueError(f"threshold_estimation_frac must lie in (0, 1), got {frac}")
    perm = rng.permutation(scores.size)
    cut = int(scores.size * frac)
    return scores[perm[:cut]], scores[perm[cut:]]


def _check_significance(significance: float, upper: float) -> None:
    if not 0 < significance < upper:
        raise ValueError(f"significance must lie in (0, {upper}), got {significance}")


def epsilon_lower_bound(scores: CanaryScores, delta: float, significance: float = 0.05) -> float:
    """Eq. 45 epsilon at `delta` with Clopper-Pearson bounds at the best threshold (Bonferroni).

    0.0 when nothing is significant.
    """
    auditor = CanaryScoreAuditor(scores.held_in, scores.held_out)
    return auditor.epsilon_clopper_pearson(significance, delta, one_sided=False)
