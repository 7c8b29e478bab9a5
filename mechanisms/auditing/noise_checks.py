"""Does the noise that ran match the noise the plan declares? Tests on the excluded canaries' residuals.

An excluded Dirac canary never pushes its coordinate, so its residual at step t (the release minus the clipped
sum, in the plan's units) is the mechanism's noise there: under the plan, N(0, sigma^2) and independent across
steps (or correlated across steps exactly as a declared strategy says, e.g. tree aggregation or a matrix
factorisation). The one-run bounds cannot see every way the noise may go wrong: noise that repeats every step
leaves each canary's residual constant, so no guess rule separates the canaries, and a measurement of sigma
that pools steps as independent draws reads the right sigma. These checks test what the bounds assume:

- `scale`: the residuals' variance over the run is not below sigma^2 (one-sided: more noise is not a leak);
- `step scale`: nor is any single step's (Bonferroni over the steps);
- `scale across steps`: the variance of each canary's residuals around its own mean over the run (noise that
  repeats has none);
- `lag k`: the lag-k autocorrelation across steps is 0 (read as 1 - sum (y_t - y_{t-k})^2 / (2 (T-k) var),
  which a canary's own mean, e.g. the pushes of included canaries sharing its coordinate, does not move);
- `partial sums L`: the variance of sums of L consecutive residuals is L sigma^2 (the variance of partial sums:
  correlated noise, such as tree aggregation's, makes it far smaller or larger).

A declared correlation enters through `Correlation.whiten`: the residuals are whitened by it first (default:
independent, the identity), and the same tests then hold for white noise. Every test is at significance
`significance / k` for k tests (Bonferroni), so a correct run is flagged with probability at most
`significance` (tests/mechanisms/auditing/test_noise_checks.py counts the false alarms over 200 seeds).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mechanisms.parts.noise_addition import Correlation  # the declared interface, with the noise parts

LAGS = (1, 2, 4)
BLOCKS = (4, 16, 64)
SIGNIFICANCE = 1e-3  # the family-wise rate of false alarms of one run's checks (claims.AUDIT_SIGNIFICANCE)
MAX_VALUES = 4_000_000  # the residual series kept for the checks: at most this many values (32 MB of float64)


@dataclasses.dataclass(frozen=True)
class Independent:
    """DP-SGD's noise: independent across steps (nothing to whiten)."""

    name: str = "independent"

    def whiten(self, residuals: np.ndarray) -> np.ndarray:
        return residuals


@dataclasses.dataclass(frozen=True)
class Covariance:
    """Noise whose per-step values have covariance `matrix` (steps x steps, in units of sigma^2) at every
    coordinate: whitened by the inverse of its Cholesky factor."""

    matrix: np.ndarray
    name: str = "covariance"

    def whiten(self, residuals: np.ndarray) -> np.ndarray:
        import scipy.linalg  # lazy: heavy (scipy)

        t = residuals.shape[0]
        if self.matrix.shape[0] < t:
            raise ValueError(f"the declared covariance covers {self.matrix.shape[0]} steps, the run has {t}")
        factor = np.linalg.cholesky(self.matrix[:t, :t])
        return scipy.linalg.solve_triangular(factor, residuals, lower=True)


def tree_matrix(steps: int) -> np.ndarray:
    """(steps, nodes): which nodes of a binary tree over the steps sum to each prefix [0, t] (the dyadic
    decomposition of t + 1), as tree aggregation (DP-FTRL) adds them."""
    nodes: dict[tuple[int, int], int] = {}
    rows = []
    for t in range(steps):
        n, start, row = t + 1, 0, []
        for level in range(n.bit_length() - 1, -1, -1):
            if n >> level & 1:
                row.append(nodes.setdefault((level, start >> level), len(nodes)))
                start += 1 << level
        rows.append(row)
    out = np.zeros((steps, len(nodes)))
    for t, row in enumerate(rows):
        out[t, row] = 1.0
    return out


def tree_covariance(steps: int) -> np.ndarray:
    """The covariance (units of sigma^2) of the per-step noise of tree aggregation released as differences of
    prefix noises (the noise each step's update sees under DP-FTRL): D A A^T D^T."""
    a = tree_matrix(steps)
    d = np.diff(np.vstack([np.zeros((1, a.shape[1])), a]), axis=0)
    return d @ d.T


def tree_noise(steps: int, n: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Per-step tree-aggregation noise (differences of prefix noises), (steps, n): what tests feed the checks."""
    a = tree_matrix(steps)
    prefix = a @ (sigma * rng.standard_normal((a.shape[1], n)))
    return np.diff(np.vstack([np.zeros((1, n)), prefix]), axis=0)


INDEPENDENT = Independent()


@dataclasses.dataclass(frozen=True)
class NoiseSummary:
    """What the checks need of a run's residual series (after whitening), small enough to store with the run:
    per-step sums of squares, and the pooled sums behind the scale, lag and partial-sum tests."""

    canaries: int  # excluded canaries observed (columns)
    steps: int
    step_ss: np.ndarray  # (steps,): sum over the canaries of y_t^2
    sum_y4: float  # sum of y^4 over everything (kurtosis)
    demeaned_ss: float  # sum over canaries of sum_t (y_t - mean)^2
    lags: tuple[int, ...]
    lag_ss: tuple[float, ...]  # sum over canaries of sum_t (y_t - y_{t-k})^2
    blocks: tuple[int, ...]
    block_ss: tuple[float, ...]  # sum over canaries of sum_b (B_b - mean B)^2, B_b the sums of L consecutive y
    block_counts: tuple[int, ...]  # complete blocks of each length
    correlation: str = "independent"

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["step_ss"] = [float(x) for x in self.step_ss]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NoiseSummary:
        values = dict(data)
        values["step_ss"] = np.asarray(values["step_ss"], dtype=np.float64)
        for key in ("lags", "lag_ss", "blocks", "block_ss", "block_counts"):
            values[key] = tuple(values[key])
        return cls(**values)


def summarize(residuals: np.ndarray, correlation: Correlation | None = None, *, lags: Sequence[int] = LAGS,
              blocks: Sequence[int] = BLOCKS) -> NoiseSummary:
    """The summary of a (steps, canaries) block of excluded canaries' residuals (in the plan's units),
    whitened by `correlation` first."""
    corr = correlation or INDEPENDENT
    y = corr.whiten(np.asarray(residuals, dtype=np.float64))
    t, n = y.shape
    mean = y.mean(axis=0) if t else np.zeros(n)
    sq = y * y
    lag_ss = tuple(float(np.sum((y[k:] - y[:-k]) ** 2)) if t > k else 0.0 for k in lags)
    block_ss, counts = [], []
    for size in blocks:
        nb = t // size
        if nb < 2:
            block_ss.append(0.0)
            counts.append(nb)
            continue
        sums = y[: nb * size].reshape(nb, size, n).sum(axis=1)
        block_ss.append(float(np.sum((sums - sums.mean(axis=0)) ** 2)))
        counts.append(nb)
    return NoiseSummary(n, t, sq.sum(axis=1), float(np.sum(sq * sq)), float(np.sum((y - mean) ** 2)),
                        tuple(int(k) for k in lags), lag_ss, tuple(int(b) for b in blocks), tuple(block_ss),
                        tuple(counts), corr.name)


@dataclasses.dataclass(frozen=True)
class NoiseFinding:
    """One check's result: `failed` when it refutes the declared noise at its share of the significance;
    `words` say what was measured against what was declared."""

    check: str
    statistic: float  # the measured ratio (1 under the declared noise)
    z: float  # its standard score under the declared noise
    p_value: float  # one test's p-value (before the Bonferroni correction)
    failed: bool
    words: str
    adjusted: float = 1.0  # the p-value after the Bonferroni correction over the checks (and the steps)

    @property
    def label(self) -> str:
        """The finding in a few words (a leaderboard cell): what is wrong with the noise."""
        if self.check in ("scale", "step scale"):
            return "noise below declared"
        if self.check == "scale across steps":
            return "noise repeats across steps"
        return "noise correlated across steps"


@dataclasses.dataclass(frozen=True)
class NoiseReport:
    findings: tuple[NoiseFinding, ...]
    significance: float
    skipped: str | None = None  # why no check ran (too few observations)

    @property
    def failed(self) -> tuple[NoiseFinding, ...]:
        return tuple(f for f in self.findings if f.failed)

    @property
    def violated(self) -> bool:
        return bool(self.failed)

    def reasons(self) -> list[str]:
        return [f.words for f in self.failed]

    def labels(self) -> list[str]:
        return list(dict.fromkeys(f.label for f in self.failed))

    @property
    def p_value(self) -> float:
        """The family's p-value: the smallest Bonferroni-adjusted one (failed iff <= significance)."""
        return min((f.adjusted for f in self.findings), default=1.0)


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def check_noise(summary: NoiseSummary, sigma: float, *, significance: float = SIGNIFICANCE,
                min_values: int = 1000) -> NoiseReport:
    """Test the residuals' noise against N(0, sigma^2) i.i.d. across steps (after the declared whitening).

    One-sided where only one side leaks (less noise than declared), two-sided for the independence tests
    (correlation of either sign changes what the accounting composed). The scale tests use the measured
    kurtosis for the spread of a variance (so noise that is not Gaussian is still tested, not set aside), the
    lag tests the spread 1/N of a white series' autocorrelation, the partial-sum tests the chi-square spread of
    the blocks' variance. Each test runs at significance / (number of tests); `step scale` at a further
    1/steps share per step.
    """
    n, t = summary.canaries, summary.steps
    if n * t < min_values or t < 2:
        return NoiseReport((), significance, f"fewer than {min_values:,} residuals of excluded canaries "
                                             f"({n} canaries x {t} steps)")
    lags = [(k, ss) for k, ss in zip(summary.lags, summary.lag_ss, strict=True) if t > k + 1]
    blocks = [(size, ss, nb) for size, ss, nb in zip(summary.blocks, summary.block_ss, summary.block_counts,
                                                     strict=True) if nb >= 2]
    tests = 3 + len(lags) + len(blocks)
    alpha = significance / tests
    var0 = sigma * sigma
    total = float(np.sum(summary.step_ss))
    v = total / (n * t)
    kurt = (summary.sum_y4 / (n * t)) / v**2 if v > 0 else 3.0
    spread = math.sqrt(max(kurt - 1.0, 2.0))  # the std of y^2 / E[y^2]: sqrt(2) for a Gaussian
    findings = []

    def scale(name: str, var: float, count: float, words: str, per: int = 1) -> None:
        z = (var / var0 - 1.0) / (spread / math.sqrt(count))
        p = 1.0 - _normal_sf(z)  # lower tail
        failed = p * per < alpha
        findings.append(NoiseFinding(name, var / var0, z, p, failed, words.format(
            measured=math.sqrt(max(var, 0.0)), declared=sigma, ratio=math.sqrt(max(var, 0.0)) / sigma),
            min(1.0, p * per * tests)))

    scale("scale", v, n * t, "the noise measured at the excluded canaries is {measured:.3g} (in units of the plan's "
          "clip bound), below the {declared:.3g} the plan declares ({ratio:.2f} of it)")
    per_step = summary.step_ss / n
    worst = int(np.argmin(per_step))
    scale("step scale", float(per_step[worst]), n, f"step {worst + 1}'s noise is {{measured:.3g}}, below the "
          "{declared:.3g} the plan declares ({ratio:.2f} of it)", per=t)
    vd = summary.demeaned_ss / (n * (t - 1))
    scale("scale across steps", vd, n * (t - 1), "the noise varies across steps by {measured:.3g} only, against "
          "the {declared:.3g} declared ({ratio:.2f} of it): the steps' noise repeats")
    if vd <= 0:  # nothing varies across steps: the independence tests have no scale to read
        return NoiseReport(tuple(findings), significance)
    for k, ss in lags:
        r = 1.0 - ss / (2.0 * n * (t - k) * vd)  # the lag-k autocorrelation
        z = r * math.sqrt(n * (t - k))
        p = 2.0 * _normal_sf(abs(z))
        findings.append(NoiseFinding(f"lag {k}", r, z, p, p < alpha,
                                     f"the noise of steps {k} apart is correlated (autocorrelation {r:.3g}, "
                                     f"{abs(z):.1f} standard errors from 0){_declared(summary)}", min(1.0, p * tests)))
    for size, ss, nb in blocks:
        q = ss / (n * (nb - 1) * size * vd)
        dof = n * (nb - 1)
        z = (q - 1.0) / math.sqrt((2.0 + max(kurt - 3.0, 0.0) / size) / dof)
        p = 2.0 * _normal_sf(abs(z))
        findings.append(NoiseFinding(f"partial sums {size}", q, z, p, p < alpha,
                                     f"sums of {size} consecutive steps' noise have {q:.3g} times the variance "
                                     f"independent noise gives ({abs(z):.1f} standard errors off){_declared(summary)}",
                                     min(1.0, p * tests)))
    return NoiseReport(tuple(findings), significance)


def _declared(summary: NoiseSummary) -> str:
    if summary.correlation == "independent":
        return "; the plan declares noise independent across steps"
    return f"; the plan declares the noise's correlation as {summary.correlation}"


@dataclasses.dataclass(frozen=True)
class PushCheck:
    """How far the canaries were pushed, in the plan's units (see `push_check`)."""

    push: float  # the estimated push of a joining canary (1 for a canary clipped at the plan's bound)
    std_error: float
    z: float  # (push - 1) / std_error
    p_value: float  # one-sided: above 1
    failed: bool
    words: str
    label: str = "canaries pushed beyond the bound"


def push_check(scores: np.ndarray, included: np.ndarray, sample_rate: float, steps: int, *,
               significance: float = SIGNIFICANCE) -> PushCheck | None:
    """Test that a joining canary moved the release by at most one plan unit.

    A canary example enters the step before clipping with a gradient far above the plan's bound, so the
    engine's clipping leaves at most the plan's bound of it: an included canary's summed residual over the run
    has mean q T (push) and an excluded one's 0 (the data's sum and the neighbours' random-signed pushes are
    the same for both in expectation). The push estimate is their difference over q T, with the standard error
    read off the two groups' spread; a push significantly above 1 (one-sided z-test) means the step gave the
    canaries, and so every example, more weight than the plan accounts for (a bound changed after planning, a
    sum scaled before the noise). None when a group is empty or the run had no steps.
    """
    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    n_in, n_out = int(included.sum()), int((~included).sum())
    if n_in < 2 or n_out < 2 or steps < 1 or not sample_rate > 0:
        return None
    scale = sample_rate * steps
    inside, outside = scores[included], scores[~included]
    push = (inside.mean() - outside.mean()) / scale
    se = math.sqrt(inside.var(ddof=1) / n_in + outside.var(ddof=1) / n_out) / scale
    z = (push - 1.0) / se if se > 0 else (math.inf if push > 1.0 + 1e-9 else 0.0)
    p = _normal_sf(z)
    return PushCheck(push, se, z, p, p < significance,
                     f"each joining canary moved the release by {push:.3g} times the plan's bound (standard error "
                     f"{se:.2g}), where the plan's clipping allows at most 1: the step weighs an example more than "
                     "the plan accounts for")


class SeriesKeeper:
    """The residual series of up to `MAX_VALUES / steps` excluded canaries, kept as a run's steps arrive (on the
    host, from blocks of steps the canaries score anyway: no extra synchronisation), then summarised."""

    def __init__(self, columns: np.ndarray, steps: int, correlation: Correlation | None = None) -> None:
        keep = max(1, MAX_VALUES // max(steps, 1))
        self.columns = np.asarray(columns)[:keep]
        self.correlation = correlation
        self.rows: list[np.ndarray] = []

    def add(self, observed: np.ndarray) -> None:
        self.rows.append(np.asarray(observed)[:, self.columns].copy())

    def summary(self) -> NoiseSummary | None:
        if not self.rows or not self.columns.size:
            return None
        return summarize(np.concatenate(self.rows), self.correlation)


__all__ = ["BLOCKS", "INDEPENDENT", "LAGS", "Correlation", "Covariance", "Independent", "NoiseFinding",
           "NoiseReport", "NoiseSummary", "PushCheck", "SeriesKeeper", "check_noise", "push_check", "summarize",
           "tree_covariance", "tree_noise"]
