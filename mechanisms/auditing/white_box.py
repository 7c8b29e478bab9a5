"""The white-box one-run attack on gradient canaries, its bounds, and the ceiling it is measured against.

The auditor of a DP-SGD run sees every privatised update. For a Dirac canary (a coordinate that an
included canary pushes by the clip C whenever it joins a step) the released residual at that
coordinate, in units of C, is at step t

    y_t = b_t + sigma z_t,    b_t ~ Bernoulli(q) if the canary is included, b_t = 0 otherwise,

the subsampled Gaussian mechanism itself. The most powerful test of "included" against "not included"
(Neyman-Pearson) thresholds the likelihood ratio across steps,

    log LR = sum_t log(1 - q + q exp((2 y_t - 1) / (2 sigma^2))),

which for small sigma weights the rare steps where the canary visibly joined far more than the plain
sum of residuals does (the sum is optimal only in the Gaussian, many-steps limit). Any score is a
valid input of the one-run bounds (the guesses may be any function of the output), so the choice of
score affects only tightness, never soundness; sigma is estimated from the residuals of all canaries
at each step (a function of the output, not of which canaries are included).

`one_run_bounds` turns scores into the run-level bounds: Steinke, Nasr & Jagielski (2023, arXiv
2305.08846) and Mahloujifar, Melis & Chaudhuri (2024, arXiv 2410.22235) tested against f_{eps,delta},
each at half the significance, and `epsilon_audited` the larger (a union bound: both hold together
with probability 1 - significance). The guess rule is fixed before the run: guess "in" for the
`r` highest scores, for each `r` of a short list chosen on a simulated run (Bonferroni over the list).

`simulate_scores` draws the same release process in NumPy (the certified mechanism exactly), which
gives the ceiling (the same analysis, canaries and guesses under the optimal attack on a mechanism
exactly as private as certified) and the soundness checks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.stats

from mechanisms.accounting.gaussian_pld import epsilon_for_delta, gaussian_pld, hockey_stick
from mechanisms.auditing import one_run
from mechanisms.auditing.canary import CanaryScoreAuditor, Explicit

SCORES = ("lr", "sum")
CEILING_FLAG_NOISES = 4.0  # an audited epsilon this many ceiling noises above the ceiling is flagged
CEILING_DRAWS = 8  # simulated runs of the certified mechanism the ceiling is the median of (fewer for long runs)
CEILING_WORK = 4_000_000  # canaries x steps those runs may share (at least 2 runs): a deterministic cost cap
SEARCH_DISCRETIZATION = 1e-3  # the PLD grid of the curve search's profiles and of a first epsilon pass
MAD_TO_STD = 1.482602218505602  # 1 / Phi^-1(3/4): the median absolute deviation of N(0, 1) is 1 / this


def ceiling_draws(m: int, steps: int) -> int:
    """How many simulated runs the ceiling takes: `CEILING_DRAWS`, fewer where m x steps makes each one long (a
    function of the run's shape, never of the clock, so that every machine finds the same ceiling)."""
    return max(2, min(CEILING_DRAWS, CEILING_WORK // max(1, m * steps)))


def robust_sigma(residuals: np.ndarray, at_most: int = 4096) -> float:
    """Noise std of one step's residuals across canaries, insensitive to the few that joined.

    The median absolute deviation of (a fixed, evenly spaced subset of at most `at_most` of) them.
    """
    return float(robust_sigmas(np.asarray(residuals, dtype=np.float64)[None, :], at_most)[0])


def robust_sigmas(rows: np.ndarray, at_most: int = 4096) -> np.ndarray:
    """`robust_sigma` of each row of a (steps, canaries) block, in one pass."""
    r = np.asarray(rows, dtype=np.float64)
    if r.shape[1] > at_most:
        r = r[:, :: -(-r.shape[1] // at_most)]
    return MAD_TO_STD * np.median(np.abs(r - np.median(r, axis=1, keepdims=True)), axis=1)


def log_lr_step(y: np.ndarray, sample_rate: float, sigma: float | np.ndarray) -> np.ndarray:
    """log of p(y | included) / p(y | excluded) for one step of the subsampled Gaussian (units of C); `sigma`
    may be one per row of a (steps, canaries) `y`, shaped (steps, 1)."""
    a = (2.0 * np.asarray(y, dtype=np.float64) - 1.0) / (2.0 * sigma * sigma)
    if sample_rate >= 1.0:
        return a
    # log(1 - q + q e^a) = log1p(q expm1(a)) below the overflow of exp, a + log q beyond (relative error < 1e-300)
    big = a > 700.0
    out = np.log1p(sample_rate * np.expm1(np.minimum(a, 700.0)))
    if big.any():
        out[big] = a[big] + math.log(sample_rate)
    return out


class ScoreAccumulator:
    """Scores of m canaries over a run, from one step's residuals at a time."""

    def __init__(self, m: int, sample_rate: float, score: str = "lr") -> None:
        if score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}, got {score!r}")
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate}")
        self.m, self.sample_rate, self.kind = m, sample_rate, score
        self.scores = np.zeros(m)
        self.steps = 0
        self.sigmas: list[float] = []

    def add(self, residuals: np.ndarray) -> None:
        """One step: `residuals` is (m,), or (steps, m) for several steps at once."""
        y = np.atleast_2d(np.asarray(residuals, dtype=np.float64))
        if self.kind == "sum":
            self.scores += y.sum(axis=0)
        else:
            sigmas = robust_sigmas(y) if self.m >= 20 else np.full(y.shape[0], np.nan)
            fallback = ~((sigmas > 1e-6) & np.isfinite(sigmas))  # too few canaries or no noise
            if fallback.any():
                sigmas[fallback] = np.maximum(np.std(y[fallback], axis=1), 1e-3)
            self.sigmas.extend(sigmas.tolist())
            self.scores += log_lr_step(y, self.sample_rate, sigmas[:, None]).sum(axis=0)
        self.steps += y.shape[0]


def simulate_scores(m: int, steps: int, sample_rate: float, sigma: float, rng: np.random.Generator, *,
                    score: str = "lr", included: np.ndarray | None = None, layout: CanaryLayout | None = None,
                    chunk: int = 2_000_000, noise_moments: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scores, included) of m Dirac canaries in the certified release process, drawn directly.

    Exactly what `DiracCanaries` observes (residual score) in a correct DP-SGD run with noise
    multiplier `sigma`, including the cross-talk of canaries that share a coordinate (`layout`),
    scored by the same `ScoreAccumulator`. `noise_moments` (3,), if given, accumulates what
    `DiracCanaries.noise_moments` does: count, sum of squares and of fourth powers of the excluded canaries'
    observations (one per coordinate).
    """
    if included is None:
        included = rng.random(m) < 0.5
    acc = ScoreAccumulator(m, sample_rate, score)
    n = layout.n_coordinates if layout is not None else m
    noise_columns = np.flatnonzero(~included)
    if layout is not None:
        _, first = np.unique(layout.coordinates[noise_columns], return_index=True)
        noise_columns = noise_columns[np.sort(first)]
    per = max(1, chunk // max(n, m, 1))
    done = 0
    while done < steps:
        k = min(per, steps - done)
        joins = included & (rng.random((k, m)) < sample_rate)
        if layout is None:
            observed = joins + sigma * rng.standard_normal((k, m))
        else:
            flat = (np.arange(k)[:, None] * n + layout.coordinates[None, :]).ravel()
            pushed = np.bincount(flat, weights=(joins * layout.signs).ravel(), minlength=k * n).reshape(k, n)
            released = pushed + sigma * rng.standard_normal((k, n))
            observed = released[:, layout.coordinates] * layout.signs
        acc.add(observed)
        if noise_moments is not None:  # one excluded canary per coordinate, as DiracCanaries.noise_columns reads
            sq = observed[:, noise_columns] ** 2
            noise_moments += (sq.size, float(sq.sum()), float((sq * sq).sum()))
        done += k
    return acc.scores, included


@dataclasses.dataclass(frozen=True)
class CanaryLayout:
    """Where m canaries sit among n coordinates, and in which direction each pushes.

    m <= n: distinct coordinates, all pushing +C (pure Dirac canaries). m > n: every coordinate
    carries floor(m/n) or ceil(m/n) canaries with random signs; each is still a vector of norm C
    included independently, so the run is exactly as private towards each one (the others are
    part of the fixed rest of the data), and their pushes only add a little noise to each other's
    observations (variance (m/n - 1) q / 2 per step, against sigma^2).
    """

    coordinates: np.ndarray
    signs: np.ndarray
    n_coordinates: int

    @classmethod
    def draw(cls, n: int, m: int, rng: np.random.Generator) -> CanaryLayout:
        if not 1 <= m:
            raise ValueError(f"need at least one canary, got {m}")
        if m <= n:
            return cls(np.sort(rng.choice(n, size=m, replace=False)), np.ones(m), n)
        reps = -(-m // n)
        coords = np.concatenate([rng.permutation(n) for _ in range(reps)])[:m]
        return cls(coords, rng.choice([-1.0, 1.0], size=m), n)


@dataclasses.dataclass(frozen=True)
class OneRunBounds:
    """The run-level bounds from one set of canary scores (all at `delta`)."""

    epsilon_audited: float  # max of the two below: holds with probability 1 - significance
    epsilon_steinke: float  # Steinke et al. at significance / 2
    epsilon_fdp: float  # f-DP against f_{eps, delta} at significance / 2
    epsilon_fdp_gdp: float | None  # jax_privacy's G_mu family at the full significance: informative only
    guesses: int  # the guess count that gave epsilon_audited
    significance: float
    wall_s: float

    def as_record(self, prefix: str = "audit_") -> dict[str, Any]:
        return {f"{prefix}{k}": v for k, v in dataclasses.asdict(self).items()}


def top(scores: np.ndarray, r: int) -> Explicit:
    """The threshold rule "guess in for the r highest scores", read off the pooled scores (no labels)."""
    scores = np.asarray(scores)
    return Explicit(float(np.partition(scores, scores.size - min(r, scores.size))[scores.size - min(r, scores.size)]))


def guess_counts_around(r: int, m: int) -> tuple[int, ...]:
    """The short list of guess counts tried on a real run: r, r/2 and 2r (clipped to [1, m])."""
    return tuple(sorted({max(1, min(m, int(round(x)))) for x in (r / 2, r, 2 * r)}))


def one_run_bounds(scores: np.ndarray, included: np.ndarray, delta: float, *, significance: float = 0.05,
                   guess_counts: Sequence[int] | None = None, with_gdp: bool = True) -> OneRunBounds:
    """Bounds from guessing "in" for the top-r scores, r in `guess_counts` (all hull thresholds if None).

    `guess_counts` must be fixed before the scores are seen (e.g. by `plan_guesses` on a simulated
    run); the thresholds are then read off the pooled scores, a function of the output alone, and a
    Bonferroni correction over the list pays for taking the best r.
    """
    t0 = time.perf_counter()
    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    m, n_in = scores.size, int(included.sum())
    if n_in in (0, m):  # one side empty: nothing to compare
        return OneRunBounds(0.0, 0.0, 0.0, 0.0 if with_gdp else None, 0, significance, time.perf_counter() - t0)
    auditor = CanaryScoreAuditor(scores[included], scores[~included])
    half = significance / 2
    if guess_counts is None:
        steinke = auditor.epsilon_one_run(half, delta)
        fdp = auditor.epsilon_one_run_fdp(half, delta, family="approx-dp")
        gdp = auditor.epsilon_one_run_fdp(significance, delta) if with_gdp else None
        best_r = 0
    else:
        k = len(guess_counts)
        steinke = fdp = 0.0
        gdp = 0.0 if with_gdp else None
        best_r = 0
        for r in guess_counts:
            strategy = top(scores, r)
            s_r = auditor.epsilon_one_run(half / k, delta, threshold_strategy=strategy)
            f_r = auditor.epsilon_one_run_fdp(half / k, delta, threshold_strategy=strategy, family="approx-dp")
            if max(s_r, f_r) > max(steinke, fdp):
                best_r = r
            steinke, fdp = max(steinke, s_r), max(fdp, f_r)
            if with_gdp:
                gdp = max(gdp, auditor.epsilon_one_run_fdp(significance / k, delta, threshold_strategy=strategy))
    return OneRunBounds(max(steinke, fdp), steinke, fdp, gdp, best_r, significance, time.perf_counter() - t0)


def precision_curve(scores: np.ndarray, included: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fraction of canaries guessed, fraction of guesses right) for the top-r rules, r = 1..m."""
    hits = np.cumsum(np.asarray(included, dtype=bool)[np.argsort(-np.asarray(scores))])
    r = np.arange(1, hits.size + 1)
    return r / hits.size, hits / r


def best_guess_count(fractions: np.ndarray, precision: np.ndarray, m: int, delta: float, significance: float,
                     n_rules: int = 3) -> tuple[int, float]:
    """The top-r guess count for m canaries whose bound is largest at a pessimistic precision.

    The precision at each guessed fraction comes from a simulated run; the bound is evaluated at
    one standard deviation below the expected number of right guesses, so a lucky streak among the
    top few scores of the simulation does not pick a rule that fails on the real run.
    """
    from mechanisms.auditing import one_run  # lazy: heavy (torch)

    best, best_r = 0.0, max(1, m // 10)
    s = significance / (2 * n_rules)
    for r in np.unique(np.geomspace(10, m, 40).astype(int)):
        p = float(np.interp(r / m, fractions, precision))
        v = int(np.floor(p * r - math.sqrt(r * p * (1 - p))))
        if v <= r / 2:
            continue
        eps = max(one_run.epsilon_one_run_fdp(m, int(r), v, s, delta, epsilon_floor=best, family="approx-dp"),
                  one_run.epsilon_one_run(m, int(r), v, s, delta, epsilon_floor=best))  # only a better r is searched
        if eps > best:
            best, best_r = eps, int(r)
    return best_r, best


@dataclasses.dataclass(frozen=True, kw_only=True)
class CanaryDesign:
    """Decided before training: how many canaries, which guess counts, and the ceiling they allow (with the
    spread one run's bound has around it, `ceiling_noise`)."""

    canaries: int
    guess_counts: tuple[int, ...]
    ceiling: OneRunBounds
    score: str
    ceiling_noise: float = 0.0


def ceiling_noise(draws: Sequence[tuple[np.ndarray, np.ndarray]], guess_counts: Sequence[int], delta: float,
                  ceiling: float, significance: float = 0.05) -> float:
    """How far one run's bound may lie above the ceiling by chance, per standard deviation: the bound at
    `CEILING_FLAG_NOISES` sd more right guesses than the ceiling's simulated runs made on average, less the
    ceiling, over `CEILING_FLAG_NOISES`.

    At each guess count r the number of right guesses c of one run is close to Binomial(r, p), p the simulated
    precision (taken as (c + 1/2) / (r + 1), so that a perfect simulated precision still has a spread). The run
    is compared with the mean of K simulated runs, so the sd is that of their difference, sqrt(1 + 1/K) times one
    run's. The bound is evaluated exactly as `one_run_bounds` evaluates it (interpolated between whole counts, at
    most r), and the largest over r is taken. A run of a mechanism exactly as private as certified is flagged
    only beyond `CEILING_FLAG_NOISES` of these (benchmarks/audit_soundness.py measures how often that happens).
    Why several runs: a ceiling of one simulated run flagged correct runs when that run was drawn low (seen:
    dpsgd at epsilon 1 on digits, audited 0.23 of certified 1, `violated`: the ceiling's run had 46 of its top
    100 guesses right, 2.5 sd below the certified mechanism's mean of 59 over 200 runs, and the real run's 68
    lay 4.2 sd above it). The rise is taken over the whole `CEILING_FLAG_NOISES` sd, not one sd times that: at a
    ceiling of 0 the bound stays 0 for a few more right guesses, and one sd would give a noise of 0.
    """
    from mechanisms.auditing import one_run  # lazy: heavy (torch)

    m, k, half = draws[0][0].size, len(guess_counts), significance / 2
    hits = [np.cumsum(np.asarray(included, dtype=bool)[np.argsort(-np.asarray(scores, dtype=np.float64))])
            for scores, included in draws]

    def bound(r: int, c: float) -> float:
        def at(whole: int) -> float:
            whole = min(r, max(0, whole))
            return max(one_run.epsilon_one_run(m, r, whole, half / k, delta),
                       one_run.epsilon_one_run_fdp(m, r, whole, half / k, delta, family="approx-dp"))
        low = math.floor(c)
        return at(low) if c == low else at(low) + (c - low) * (at(low + 1) - at(low))

    upper, spread = 0.0, math.sqrt(1 + 1 / len(draws))
    for r in guess_counts:
        r = int(min(r, m))
        c = float(np.mean([h[r - 1] for h in hits]))
        p = (c + 0.5) / (r + 1)
        sd = spread * math.sqrt(r * p * (1 - p))
        upper = max(upper, bound(r, min(r, c + CEILING_FLAG_NOISES * sd)))
    return max(0.0, upper - ceiling) / CEILING_FLAG_NOISES


def plan_guesses(m: int, steps: int, sample_rate: float, sigma: float, delta: float, *,
                 significance: float = 0.05, score: str = "lr", seed: int = 0,
                 layout_n: int | None = None) -> CanaryDesign:
    """Simulate the certified mechanism once to fix the guess counts, then again for the ceiling.

    Independent simulations: the guess counts are chosen on the first (at most 20,000 canaries:
    the precision at a guessed fraction does not depend on m), the ceiling is the median bound the fixed rule
    reaches on `ceiling_draws` more, each scored exactly as a real run is. `layout_n`: the number of coordinates the
    m canaries share (the trainable parameters), so that their cross-talk is simulated too.
    """
    rng = np.random.default_rng([seed, 0xCE11])
    n = layout_n if layout_n is not None else m
    m_sim = min(m, 20_000)  # the precision curve is a function of the guessed fraction: 20,000 draw it well
    n_sim = max(1, int(round(n * m_sim / m)))
    layout = CanaryLayout.draw(n_sim, m_sim, rng) if m_sim > n_sim else None
    scores, included = simulate_scores(m_sim, steps, sample_rate, sigma, rng, score=score, layout=layout)
    r, _ = best_guess_count(*precision_curve(scores, included), m, delta, significance)
    counts = guess_counts_around(r, m)
    draws = []
    for _ in range(ceiling_draws(m, steps)):
        layout = CanaryLayout.draw(n, m, rng) if m > n else None
        draws.append(simulate_scores(m, steps, sample_rate, sigma, rng, score=score, layout=layout))
    bounds = sorted((one_run_bounds(scores, included, delta, significance=significance, guess_counts=counts)
                     for scores, included in draws), key=lambda b: b.epsilon_audited)
    ceiling = bounds[(len(bounds) - 1) // 2]  # the median run (the lower of the two middle ones)
    return CanaryDesign(canaries=m, guess_counts=counts, ceiling=ceiling, score=score,
                        ceiling_noise=ceiling_noise(draws, counts, delta, float(ceiling.epsilon_audited), significance))


def choose_canaries(n_params: int, steps: int, sample_rate: float, sigma: float, delta: float, *,
                    significance: float = 0.05, score: str = "lr", seed: int = 0, max_canaries: int = 50_000,
                    per_coordinate: tuple[int, ...] = (1, 3, 10, 25)) -> int:
    """The canary count, k canaries per trainable coordinate, whose predicted bound is largest.

    More canaries give more guesses, but canaries sharing a coordinate blur each other: when sigma
    is small a single join is visible, and a neighbour's join looks exactly like one's own. Each k
    is tried on a simulated run of at most 20,000 canaries (the precision at a guessed fraction
    does not depend on m) and the bound is predicted as `best_guess_count` does.
    """
    rng = np.random.default_rng([seed, 0xC0C0])
    best_m, best = min(n_params, max_canaries), -1.0
    for k in per_coordinate:
        m = min(max_canaries, k * n_params)
        if k > 1 and m <= n_params:
            break
        m_sim = min(m, 20_000)
        n_sim = max(1, int(round(m_sim / max(m / n_params, 1.0))))
        layout = CanaryLayout.draw(n_sim, m_sim, rng) if m_sim > n_sim else None
        scores, included = simulate_scores(m_sim, steps, sample_rate, sigma, rng, score=score, layout=layout)
        _, eps = best_guess_count(*precision_curve(scores, included), m, delta, significance)
        if eps > best * 1.02:  # a larger count must earn its cost
            best_m, best = m, eps
        if m >= max_canaries:
            break
    return best_m


# -- the run within its certified family: DP-SGD at the run's (q, T), noise multiplier unknown -----------------


@functools.lru_cache(maxsize=256)
def dpsgd_profile(sigma: float, sample_rate: float, steps: int, *, points: int = 400,
                  discretization: float = 1e-4) -> tuple[np.ndarray, np.ndarray]:
    """(eps_i, delta_i): points of the privacy profile of T Poisson-subsampled Gaussian steps (PLD, add or
    remove one, pessimistic connect-the-dots: every delta_i is an upper bound on the true delta(eps_i)).

    The curve max_i f_{eps_i, delta_i} is a valid trade-off curve of the mechanism and lies (pointwise) at or
    below its exact curve, so testing it instead of the exact one can only make a rejection harder. The
    discretisation must be fine against the per-step privacy loss: at 1e-2 the pessimistic rounding of
    673 steps at sigma 40 (digits) inflates delta(0) several times over and the curve collapses.
    """
    pld = gaussian_pld(sigma, sample_rate, discretization, pessimistic=True).self_compose(steps)
    top = 1.0
    while top < 200 and float(hockey_stick(pld, [top])[0]) > 1e-15:
        top *= 2
    eps = np.concatenate([np.linspace(0.0, top, points), np.geomspace(1e-4, top, points // 4)])
    eps.sort()
    return eps, np.minimum(hockey_stick(pld, eps), 1.0)


def profile_inverse(eps: np.ndarray, deltas: np.ndarray) -> Callable[[float], float]:
    """The blow-up inverse of max_i f_{eps_i, delta_i} (the envelope of `one_run._blow_up_inverse`'s approx-dp
    pieces): the smallest alpha at which every piece's blow-up reaches x."""
    down, up, one = np.exp(-eps), np.exp(np.minimum(eps, 700.0)), 1.0 - deltas

    def inv(x: float) -> float:
        return max(0.0, float(np.max((x - deltas) * down)), float(np.max(one - up * (1.0 - x))))

    return inv


def rejects_dpsgd(m: int, guesses: int, correct: int, sigma: float, sample_rate: float, steps: int,
                  significance: float, *, discretization: float = SEARCH_DISCRETIZATION) -> bool:
    """Do the guesses reject "DP-SGD at noise multiplier `sigma` with respect to every canary"?

    The profile is pessimistic at any `discretization` (its deltas bound the true ones from above, a curve
    under the mechanism's), so the grid trades power for time, never soundness. At 1e-3 the curve search
    found the same noise multiplier as at 1e-4 in 9 of 10 simulated audits (quickstart and digits geometry;
    2.7% higher in the tenth) in a fifth to a seventh of the time.
    """
    if correct == 0:
        return False
    inv = profile_inverse(*dpsgd_profile(round(float(sigma), 6), sample_rate, steps, discretization=discretization))
    return one_run.curve_objective(m, guesses, correct, inv, significance) > 0


@dataclasses.dataclass(frozen=True)
class CurveBound:
    """The run-level bound within the certified event's family (see `curve_bound`)."""

    epsilon: float  # the epsilon at delta of DP-SGD at `sigma`: 0.0 when no noise multiplier is rejected
    sigma: float | None  # the smallest noise multiplier found rejected (None: none)
    guesses: int
    significance: float
    wall_s: float


def curve_bound(scores: np.ndarray, included: np.ndarray, delta: float, sample_rate: float, steps: int,
                sigma_certified: float, *, guess_counts: Sequence[int], significance: float = 0.05,
                rel_tol: float = 0.01, budget_s: float | None = None) -> CurveBound:
    """A lower bound on the run's epsilon when it is T Poisson-subsampled Gaussian steps of rate q, as the sound
    analysis of what runs says (the certified event), with the noise multiplier the unknown.

    For each noise multiplier s the f-DP one-run test (Mahloujifar et al., the recursion of `epsilon_one_run_fdp`)
    checks the guesses against DP-SGD's own curve at (q, T, s) instead of the weakest curve of its (eps, delta)
    pair: much stronger, and sound because the mechanism's curve is one of these (if the run were DP-SGD at
    s_true, every s <= s_true is rejected with probability <= significance; rejection is monotone in s). The
    smallest s found rejected, s*, makes "the noise is below s*" a 1 - significance statement, and the epsilon of
    DP-SGD at s* (PLD, at `delta`) a lower bound on the run's. The search reports the rejected end of its bracket
    (never an interpolation) and the guesses are the top-r rules fixed before the run (Bonferroni over them).

    Each step of the search is a PLD of T steps on the coarse grid of `rejects_dpsgd` (0.1-0.3 s at the
    quickstart's 585 steps; seconds on the fine grid at small noise). With `budget_s` the
    search stops refining once that much time is spent: every bracket end it reports was rejected, so an early
    stop gives a looser bound, never an unsound one (no rejected s yet: no bound).
    """
    t0 = time.perf_counter()

    def spent() -> bool:
        return budget_s is not None and time.perf_counter() - t0 > budget_s

    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    m, n_in = scores.size, int(included.sum())
    if n_in in (0, m) or not guess_counts:
        return CurveBound(0.0, None, 0, significance, time.perf_counter() - t0)
    s = significance / len(guess_counts)
    order = np.argsort(-scores, kind="stable")
    hits = np.cumsum(included[order])
    rules = [(int(r), int(hits[min(r, m) - 1])) for r in guess_counts]

    def rejected(sigma: float) -> tuple[bool, int]:
        for r, v in rules:
            if v > r / 2 and rejects_dpsgd(m, r, v, sigma, sample_rate, steps, s):
                return True, r
        return False, 0

    hi = float(sigma_certified)
    ok, best_r = rejected(hi)
    tries = 0
    while not ok:  # the truth itself not rejected (the usual case): look at more private claims
        hi *= 2
        tries += 1
        if tries > 6 or spent():
            return CurveBound(0.0, None, 0, significance, time.perf_counter() - t0)
        ok, best_r = rejected(hi)
    lo = hi / 2 if tries else 0.0
    if not tries:  # rejected at the certified sigma already: a less private claim may be rejected too
        lo = hi / 2
        while not spent() and rejected(lo)[0] and lo > 1e-3:
            hi, lo = lo, lo / 2
        best_r = rejected(hi)[1]
    while hi - lo > rel_tol * hi and not spent():
        mid = (lo + hi) / 2 if lo > 0 else hi / 2
        ok, r = rejected(mid)
        if ok:
            hi, best_r = mid, r
        else:
            lo = mid
    eps, deltas = dpsgd_profile(round(float(hi), 6), sample_rate, steps, discretization=SEARCH_DISCRETIZATION)
    below = deltas <= delta  # the search's own (pessimistic) profile at hi: an estimate that sets the grid
    epsilon = dpsgd_epsilon(hi, sample_rate, steps, delta, near=float(eps[np.argmax(below)]) if below.any() else None)
    return CurveBound(epsilon, hi, best_r, significance, time.perf_counter() - t0)


def dpsgd_epsilon(sigma: float, sample_rate: float, steps: int, delta: float, *, near: float | None = None) -> float:
    """PLD epsilon at `delta` of DP-SGD (q, T, sigma) with the *optimistic* discretisation (privacy buckets): at
    most the exact value (about 3% under it at digits' q and T), as a lower bound must be.

    Every optimistic value is a lower bound, whatever its grid. The grid's error grows with the privacy loss it
    rounds, so the grid is 1e-4 per 3 units of epsilon (at least 1e-4, at most 1e-3): at epsilon 8 and 585 steps
    0.6% lower than on the 1e-4 grid in a third of the time. `near`, any estimate of the answer (a pessimistic
    one the caller holds, the certified epsilon), picks that grid; without it a first pass on the 1e-3 grid does,
    and the larger of the two values is returned.
    """
    coarse = None
    if near is None:
        near = coarse = _optimistic_epsilon(sigma, sample_rate, steps, delta, SEARCH_DISCRETIZATION)
    grid = min(SEARCH_DISCRETIZATION, 1e-4 * max(1.0, near / 3))
    if coarse is not None and grid >= SEARCH_DISCRETIZATION:
        return coarse
    fine = _optimistic_epsilon(sigma, sample_rate, steps, delta, grid)
    return fine if coarse is None else max(coarse, fine)


def _optimistic_epsilon(sigma: float, sample_rate: float, steps: int, delta: float, grid: float) -> float:
    return epsilon_for_delta(gaussian_pld(sigma, sample_rate, grid, pessimistic=False).self_compose(steps), delta)


TOO_FEW = "fewer than 1,000 observations of the noise (residuals of excluded canaries over steps)"
NO_NOISE = "the excluded canaries' residuals are all zero: no noise was observed where the canaries sit"


def noise_check_gap(moments: Sequence[float], kurtosis_tol: float = 0.1) -> str | None:
    """Why `noise_bound` reads no epsilon off these moments (count, sum of squares, sum of fourth powers), or
    None when it does: too few observations, no noise at all, or noise whose kurtosis is not a Gaussian's (the
    bound rests on the Gaussian model, so it is not read off such noise)."""
    n, ss, s4 = (float(x) for x in moments)
    if n < 1000:
        return TOO_FEW
    if ss <= 0:
        return NO_NOISE
    kurtosis = (s4 / n) / (ss / n) ** 2
    if abs(kurtosis - 3.0) > kurtosis_tol:
        return (f"the measured noise is not Gaussian (kurtosis {kurtosis:.3g}, a Gaussian's is 3 within "
                f"{kurtosis_tol}): the noise bound rests on the Gaussian model, so no epsilon is read off it")
    return None


@dataclasses.dataclass(frozen=True)
class NoiseBound:
    """The white-box noise measurement (see `noise_bound`)."""

    sigma: float  # root mean square of the excluded canaries' residuals, in units of the clip
    sigma_upper: float  # its one-sided (1 - significance) upper confidence bound (chi-square)
    kurtosis: float  # E[y^4] / E[y^2]^2: 3 for Gaussian noise
    gaussian: bool  # kurtosis within `kurtosis_tol` of 3 (otherwise no epsilon is read off sigma)
    epsilon: float | None  # DP-SGD (q, T, sigma_upper) at delta, optimistic PLD; None when not gaussian
    samples: int
    significance: float


def noise_bound(moments: Sequence[float], sample_rate: float, steps: int, delta: float, *,
                significance: float = 0.001, kurtosis_tol: float = 0.1, with_epsilon: bool = True,
                near: float | None = None) -> NoiseBound | None:
    """The run's epsilon read off the noise it really added, measured where the auditor sees it.

    An excluded canary's residual is the mechanism's noise at its coordinate (in units of C; included canaries
    sharing the coordinate add variance, which can only raise sigma). With N such observations, sum of squares
    S, the chi-square bound sigma^2 <= S / chi2_{significance}(N) holds with probability 1 - significance if the
    noise is N(0, sigma^2) i.i.d. over steps (taking squares around 0, not the sample mean, also only raises it).
    When the certified event says the run is T Poisson-subsampled Gaussian steps of rate q with sensitivity C,
    the run is then at least as leaky as DP-SGD at sigma_upper, whose epsilon (optimistic PLD) is a lower bound.

    Unlike the one-run bounds this rests on the noise model (Gaussian, independent across steps), so it is
    reported only when the measured kurtosis is that of a Gaussian, and only for DP-SGD-shaped certified events.
    It measures the noise the code really adds, not the noise its parts declare (what `epsilon_certified`
    reads): a noise part adding less than it declares shows here first. `near` (the certified epsilon, say) only
    picks the grid of the epsilon (`dpsgd_epsilon`).
    """
    n, ss, s4 = (float(x) for x in moments)
    if noise_check_gap(moments, kurtosis_tol) in (TOO_FEW, NO_NOISE):
        return None
    sigma = math.sqrt(ss / n)
    kurtosis = (s4 / n) / (ss / n) ** 2
    sigma_upper = math.sqrt(ss / float(scipy.stats.chi2.ppf(significance, n)))
    gaussian = abs(kurtosis - 3.0) <= kurtosis_tol
    eps = dpsgd_epsilon(sigma_upper, sample_rate, steps, delta, near=near) if gaussian and with_epsilon else None
    return NoiseBound(sigma, sigma_upper, kurtosis, gaussian, eps, int(n), significance)
