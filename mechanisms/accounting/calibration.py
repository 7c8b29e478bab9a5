"""One generic, cached root-finder: the smallest sigma whose epsilon stays at or below a target.

Answers live on a fixed geometric grid, sigma = exp(k log(1 + rel_tol) / 2^L), so the result is a
well-defined number, the smallest grid sigma with epsilon <= target, whatever path the search took:
two processes calibrating the same setting agree exactly. The achieved epsilon is never above the target
(only evaluated, private points are ever returned) and, unless the accountant is too coarse, within
`rel_tol` below it: epsilon moves 1-5x faster than sigma, so the search starts on level
L = ceil(log2 |slope|) (the slope from the bracketing stage, itself deterministic) and refines L while
the slack exceeds `rel_tol`, up to `MAX_LEVEL`.

Why not `dp_accounting.calibrate_dp_mechanism` with PLD: its bracket search starts at small sigma, where
PLD evaluations are very slow (the shipped calibration spent 360 s on eps 8, q 256/60000, 702 steps),
and Brent's method then needs ~10 more. Here a cheap accountant brackets first (RDP for PLD, PLD for
PRV): its answer is private or nearly so under the tighter one, and its slope d log(eps)/d log(sigma)
predicts where the tighter root is. The refinement interpolates log epsilon against log sigma (secant,
then inverse quadratic) on grid indices, with bisection as a safeguard: typically 4-5 evaluations of the
expensive accountant.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Hashable

import dp_accounting

from mechanisms.accounting.reference import poisson_dominating
from mechanisms.accounting.sound import epsilon_report, sound_accountants
from mechanisms.accounting.validation import require_delta, require_positive
from mechanisms.framework.registry import ACCOUNTANTS

EventFamily = Callable[[float], dp_accounting.DpEvent]

MAX_LEVEL = 6  # grid refinements for epsilon slack: the finest step is rel_tol / 64
SIGMA_MIN, SIGMA_MAX = 1e-4, 1e6
DEFAULT_SLOPE = -2.0  # d log(eps) / d log(sigma) when nothing better is known (DP-SGD: -1 to -5)
COARSE_REL_TOL = 1e-2


@dataclasses.dataclass(frozen=True, kw_only=True)
class Calibration:
    sigma: float
    epsilon: float  # achieved; never above the target
    evaluations: int = 0  # epsilon evaluations of the calibrated accountant
    slope: float = DEFAULT_SLOPE  # local d log(eps) / d log(sigma) at the answer, a hint for neighbours
    note: str = ""


class _Search:
    """Bisection-with-interpolation on grid indices; remembers every evaluation."""

    def __init__(self, epsilon_of: Callable[[float], float], target: float, rel_tol: float) -> None:
        self.epsilon_of = epsilon_of
        self.target = target
        self.rel_tol = rel_tol
        self.step0 = math.log1p(rel_tol)
        self.level = 0
        self.memo: dict[float, float] = {}

    def step(self) -> float:
        return self.step0 / 2**self.level

    def log_sigma(self, k: int) -> float:
        return k * self.step()

    def eps(self, k: int) -> float:
        key = k / 2**self.level  # the same sigma at every level shares one evaluation
        if key not in self.memo:
            value = self.epsilon_of(math.exp(self.log_sigma(k)))
            self.memo[key] = math.nan if value is None else float(value)
        return self.memo[key]

    def gap(self, k: int) -> float:
        """log(eps / target): > 0 not private enough, <= 0 private; inf/-inf at the extremes."""
        e = self.eps(k)
        if math.isnan(e):
            raise ValueError("the accountant cannot analyse this event")
        return self.gap_of(e)

    def gap_of(self, e: float) -> float:
        """log(e / target), with the sign of e - target: the logs can round a hair above the target to a gap of
        0 (Hypothesis found epsilon 0.010000000000000002 returned for a target of 0.01), and a calibrator must
        never return an epsilon above its target."""
        if e <= 0:
            return -math.inf
        g = math.log(e) - math.log(self.target)
        return max(g, 5e-324) if e > self.target else min(g, 0.0)

    def nearest(self, lo: int, hi: int) -> list[tuple[float, float]]:
        """lo, hi and the evaluated point closest to the root (smallest |gap|), in current grid units."""
        scale = 2**self.level
        others = [(key * scale, self.gap_of(value)) for key, value in self.memo.items()
                  if key * scale not in (lo, hi) and not math.isnan(value)]
        best = sorted(others, key=lambda point: abs(point[1]))[:1]
        return [(lo, self.gap(lo)), (hi, self.gap(hi))] + best

    def index(self, log_sigma: float) -> int:
        return math.floor(log_sigma / self.step())


def _predict(points: list[tuple[float, float]]) -> float | None:
    """Root of g(k) by inverse quadratic interpolation through <= 3 points (secant with 2); None if undefined."""
    points = [(k, g) for k, g in points if math.isfinite(g)]
    if len(points) < 2 or len({g for _, g in points}) < len(points):
        return None
    root = 0.0
    for i, (k_i, g_i) in enumerate(points):
        weight = 1.0
        for j, (_, g_j) in enumerate(points):
            if j != i:
                weight *= g_j / (g_j - g_i)
        root += k_i * weight
    return root


def level_for_slope(slope: float) -> int:
    """Grid level whose step keeps the epsilon slack within rel_tol at this slope: ceil(log2 |slope|)."""
    if not math.isfinite(slope) or abs(slope) <= 1:
        return 0
    return min(MAX_LEVEL, math.ceil(math.log2(abs(slope))))


def calibrate(epsilon_of: Callable[[float], float | None], target: float, *, rel_tol: float = 1e-3,
              guess: float = 1.0, slope: float = DEFAULT_SLOPE, level: int = 0) -> Calibration:
    """Smallest sigma with epsilon_of(sigma) <= target on the grid exp(k log(1 + rel_tol) / 2^L).

    epsilon_of must decrease in sigma. The search starts on level L = `level` and refines (L + 1, ...)
    while the achieved epsilon is more than rel_tol below the target; the answer is the grid point of the
    first level that meets that slack. `guess` and `slope` (d log eps / d log sigma, negative) only speed
    the search up. Raises ValueError when no sigma up to SIGMA_MAX reaches the target.
    """
    require_positive("epsilon", target)
    require_positive("rel_tol", rel_tol)
    if not rel_tol < 0.5:
        raise ValueError(f"rel_tol must be < 0.5, got {rel_tol}")
    slope = slope if slope < 0 and math.isfinite(slope) else DEFAULT_SLOPE
    s = _Search(epsilon_of, target, rel_tol)
    s.level = min(max(0, level), MAX_LEVEL)
    k = s.index(math.log(min(max(guess, SIGMA_MIN), SIGMA_MAX)))
    lo, hi = (k, None) if s.gap(k) > 0 else (None, k)
    k_min, k_max = s.index(math.log(SIGMA_MIN)), s.index(math.log(SIGMA_MAX)) + 1

    # 1. Bracket: step from the known side to just past the predicted root (from `slope` at first, then
    #    a secant through the last two points), growing the step at least 1.5x each time that falls short.
    distance, previous = 0, None
    while lo is None or hi is None:
        known = hi if lo is None else lo
        g = s.gap(known)
        predicted = abs(g / slope) / s.step() if math.isfinite(g) else 0.0
        if previous is not None and math.isfinite(g) and math.isfinite(previous[1]) and g != previous[1]:
            predicted = abs(g * (known - previous[0]) / (g - previous[1]))
        distance = max(math.ceil(1.1 * predicted) + 1, math.ceil(1.5 * distance), 2)
        previous = (known, g)
        if lo is None:
            k = max(hi - distance, k_min)
            if s.gap(k) > 0:
                lo = k
            elif k == k_min:
                raise ValueError(f"epsilon {target} is met at every sigma >= {SIGMA_MIN:g}")
            else:
                hi = k
        else:
            k = min(lo + distance, k_max)
            if s.gap(k) <= 0:
                hi = k
            elif k == k_max:
                raise ValueError(f"no sigma <= {SIGMA_MAX:g} reaches epsilon {target}")
            else:
                lo = k

    # 2. Refine: interpolate on the grid, bisect when interpolation stalls; refine the grid for slack.
    stalls = 0
    while True:
        while hi - lo > 1:
            width = hi - lo
            k_star = _predict(s.nearest(lo, hi))
            if k_star is None or not lo < k_star < hi + 1 or stalls >= 2:
                candidate, stalls = (lo + hi) // 2, 0
            else:
                candidate = min(max(math.ceil(k_star - 1e-9), lo + 1), hi - 1)
            if s.gap(candidate) > 0:
                lo = candidate
            else:
                hi = candidate
            stalls = stalls + 1 if hi - lo > width / 2 else 0
        if s.eps(hi) >= target * (1 - rel_tol) or s.level >= MAX_LEVEL:
            break
        s.level += 1
        lo, hi = 2 * lo, 2 * hi

    local_slope = slope
    g_lo, g_hi = s.gap(lo), s.gap(hi)
    if math.isfinite(g_lo) and math.isfinite(g_hi) and g_lo != g_hi:
        local_slope = (g_hi - g_lo) / (s.log_sigma(hi) - s.log_sigma(lo))
    note = ""
    if s.eps(hi) == 0:
        note = "epsilon is 0 from this sigma on: delta covers the whole privacy-loss tail"
    elif s.eps(hi) < target * (1 - rel_tol):
        note = (f"achieved epsilon {s.eps(hi):.6g} is more than rel_tol below the target: the accountant's "
                "resolution is coarser than the requested tolerance")
    return Calibration(sigma=math.exp(s.log_sigma(hi)), epsilon=s.eps(hi), evaluations=len(s.memo),
                       slope=local_slope, note=note)


def accounting_relation(events: EventFamily | Hashable) -> dp_accounting.NeighboringRelation:
    """The relation a family's events are accounted under: its own `accounting_relation` (privbench's
    `Parts`), else add-or-remove-one (dp-accounting's default)."""
    return getattr(events, "accounting_relation", dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)


def _epsilon_function(events: EventFamily, delta: float, accountant: str) -> Callable[[float], float | None]:
    relation = accounting_relation(events)

    def epsilon_of(sigma: float) -> float | None:
        return epsilon_report(events(sigma), delta, accountant, relation).epsilon
    return epsilon_of


@dataclasses.dataclass(frozen=True)
class _AsPldSees:
    """The event family PLD/PRV actually analyse (fixed-size batches -> their Poisson dominating pair),
    so that the RDP bracket is computed for the same mechanism, and with cheap add/remove RDP."""

    events: Hashable

    def __call__(self, sigma: float) -> dp_accounting.DpEvent:
        return poisson_dominating(self.events(sigma))


@functools.lru_cache(maxsize=1024)
def calibrate_sigma(
    events: EventFamily | Hashable, epsilon: float, delta: float, accountant: str = "pld",
    rel_tol: float = 1e-3,
) -> Calibration:
    """Smallest sigma on the rel_tol grid with epsilon(events(sigma)) <= epsilon. `events` must be hashable.

    Cached: a sweep calibrates each distinct (events, epsilon, delta, accountant) once per process.
    PLD is bracketed by a coarse RDP calibration, PRV by a PLD one; RDP searches on its own. The events are
    accounted under the family's own relation (`accounting_relation`), the one its certification uses.
    """
    require_positive("epsilon", epsilon)
    require_delta(delta)
    if accountant not in sound_accountants():
        raise ValueError(f"unknown accountant {accountant!r}; known: {', '.join(sound_accountants())}")
    guess, slope, level = 1.0, DEFAULT_SLOPE, 0
    # The cheap bracket is only asked about families accounted under add-or-remove-one: dp-accounting's RDP
    # reads replace-one Gaussians at another sensitivity than PLD (reference.py), so it is not used for them.

    add_or_remove = accounting_relation(events) == dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    cheap = ACCOUNTANTS.get(accountant).bracket  # a cheaper accountant that brackets the search
    if cheap is not None and (add_or_remove or cheap != "rdp"):
        if cheap == "rdp":
            coarse = calibrate_sigma(_AsPldSees(events), epsilon, delta, cheap, COARSE_REL_TOL)
        else:
            coarse = calibrate_sigma(events, epsilon, delta, cheap, rel_tol)
        guess, slope, level = coarse.sigma, coarse.slope, level_for_slope(coarse.slope)
    return calibrate(_epsilon_function(events, delta, accountant), epsilon, rel_tol=rel_tol,
                     guess=guess, slope=slope, level=level)
