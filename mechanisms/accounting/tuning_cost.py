"""Honest hyperparameter tuning: how many runs, which candidates, and what picking the best one costs.

Trying many settings on the private data and keeping the best run leaks more than one run does (Liu &
Talwar, STOC 2019). Papernot & Steinke ("Hyperparameter Tuning with Renyi Differential Privacy", ICLR
2022, arXiv 2110.03620) bound that leak when the *number of runs is random*: run a Renyi-DP algorithm Q
K times, K drawn from a truncated negative binomial (Theorem 2; geometric and logarithmic are shapes 1
and 0) or a Poisson distribution (Theorem 6), and release only the best run's output. dp-accounting
implements both as `RepeatAndSelectDpEvent(event, mean, shape)` in its RDP accountant; this module maps
privbench's run counts onto it, draws K and the candidates reproducibly, and calibrates noise so that the
whole selection meets a target epsilon (`budget: total`) or reports the selection's cost on top of one
run's (`budget: per-run`).

What the guarantee assumes (the caller must keep all of it, or the number is not a bound):

* Q is one whole run *including its hyperparameter draw*: every candidate is drawn independently and
  uniformly from a space fixed before the data is touched, so the K runs are i.i.d. copies of Q. Q's RDP
  curve is the pointwise maximum over every setting the space can produce (a mixture is no less private
  than its worst component), not only over the drawn ones.
* K is drawn from the stated distribution and not changed after seeing results: no early stop, no
  re-draw. A Poisson K can be 0; then nothing is selected (re-drawing would change the distribution).
* Only the selected run's output (its model and its score) is released, and the score is part of Q's
  private output: selecting on a validation split of private records is only covered when that score
  is itself noised (`noisy_score`), otherwise the validation records are outside the guarantee. Never
  the test set.
* A fixed number N of runs is *not* covered: a deterministic count only has N-fold composition
  (`fixed_runs_epsilon`). The one exception is exactly one run, which is the run itself.

Everything here is pure (numpy and dp-accounting, no torch): phase-2 callers pass the run's event family
(sigma -> DpEvent, e.g. a plan's `Parts`) and get frozen records back.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting.dp_event import RepeatAndSelectDpEvent
from dp_accounting.rdp import rdp_privacy_accountant

from mechanisms.accounting.calibration import calibrate, calibrate_sigma
from mechanisms.accounting.reference import poisson_dominating
from mechanisms.accounting.sound import epsilon as certified_epsilon
from mechanisms.accounting.validation import require_delta, require_positive

DISTRIBUTIONS = ("poisson", "geometric", "logarithmic", "negative-binomial")
BUDGETS = ("total", "per-run")
TUNABLE = ("lr", "clip", "batch_size", "epochs")  # training settings a space may vary, besides mechanism options
INTEGER_SETTINGS = frozenset({"batch_size", "epochs"})
MAX_SUPPORT = 512  # distinct privacy-relevant settings a space may produce (each is accounted for)
ORDERS = tuple(rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
_COUNT_STREAM, _CANDIDATE_STREAM, _TRAINING_STREAM = 0, 1, 2  # independent streams per (seed, purpose)

EventFamily = Callable[[float], dp_accounting.DpEvent]


# --- How many runs -------------------------------------------------------------------------------

def tnb_mean(gamma: float, shape: float) -> float:
    """E[K] of the truncated negative binomial D_{shape, gamma} (Papernot & Steinke, Definition 1).

    shape > 0: shape (1/gamma - 1) / (1 - gamma^shape); shape = 0 (logarithmic): (1/gamma - 1) / log(1/gamma).
    Written with expm1/log1p so that gamma close to 1 (mean close to 1) stays accurate.
    """
    if gamma == 1:
        return 1.0
    log_gamma = math.log(gamma)
    if shape == 0:
        return (1 / gamma - 1) / -log_gamma
    return shape * (1 / gamma - 1) / -math.expm1(shape * log_gamma)


def tnb_gamma(mean: float, shape: float) -> float:
    """The halting parameter gamma in (0, 1] whose truncated negative binomial has this mean.

    Geometric (shape 1): exactly 1/mean. Otherwise bisection on the decreasing map gamma -> E[K], returning
    the upper end of a bracket of relative width 1e-12: the executed distribution's mean is at most the
    accounted one (dp-accounting rounds its own gamma down, which only adds to the bound).
    """
    if mean == 1:
        return 1.0
    if shape == 1:
        return 1.0 / mean
    lo, hi = 0.0, min(1.0, 2 * (shape + 1) / mean)  # E[K] <= 2 (shape + 1) / gamma bounds gamma from above
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        if tnb_mean(mid, shape) > mean:
            lo = mid
        else:
            hi = mid
    return hi


@dataclasses.dataclass(frozen=True)
class RunCount:
    """The distribution of the number K of candidate runs: `distribution` with E[K] = `mean`.

    `shape` is only for `negative-binomial` (0 < shape < inf); the other three fix it (Poisson: inf,
    geometric: 1, logarithmic: 0), as dp-accounting's `RepeatAndSelectDpEvent` reads it.
    """

    distribution: str
    mean: float
    shape: float | None = None

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"unknown run-count distribution {self.distribution!r}; known: {', '.join(DISTRIBUTIONS)}")
        if isinstance(self.mean, bool) or not isinstance(self.mean, (int, float)) or not math.isfinite(self.mean) \
                or self.mean < 1:
            raise ValueError(f"the mean number of runs must be a finite number >= 1, got {self.mean!r}")
        if self.distribution == "negative-binomial":
            if isinstance(self.shape, bool) or not isinstance(self.shape, (int, float)) \
                    or not 0 < self.shape < math.inf:
                raise ValueError(f"negative-binomial needs a shape in (0, inf), got {self.shape!r}")
        elif self.shape is not None:
            raise ValueError(f"{self.distribution} has no shape parameter (only negative-binomial takes one)")

    @property
    def dp_shape(self) -> float:
        """The `shape` argument of dp-accounting's `RepeatAndSelectDpEvent`."""
        return {"poisson": math.inf, "geometric": 1.0, "logarithmic": 0.0}.get(self.distribution, self.shape)

    @property
    def single(self) -> bool:
        """K = 1 always: a truncated distribution (K >= 1) with mean 1. The selection is then the run itself."""
        return self.distribution != "poisson" and self.mean == 1

    @property
    def gamma(self) -> float | None:
        """The truncated negative binomial's halting parameter (None for Poisson)."""
        return None if self.distribution == "poisson" else tnb_gamma(self.mean, self.dp_shape)

    def label(self) -> str:
        """e.g. "poisson(mean 8)", "negative-binomial(mean 8, shape 0.5)": how records name the distribution."""
        extra = f", shape {self.shape:g}" if self.distribution == "negative-binomial" else ""
        return f"{self.distribution}(mean {self.mean:g}{extra})"

    def draw(self, seed: int) -> int:
        """K for this seed: the same seed always gives the same K (a resumed sweep keeps its draws).

        Poisson may give 0 (then nothing is selected). The truncated negative binomial is numpy's negative
        binomial (failures before `shape` successes of probability gamma) conditioned on K >= 1 by rejection,
        the logarithmic one numpy's log-series with p = 1 - gamma, the geometric one trials until a success.
        """
        if self.single:
            return 1
        rng = np.random.default_rng([seed, _COUNT_STREAM])
        if self.distribution == "poisson":
            return int(rng.poisson(self.mean))
        if self.distribution == "geometric":
            return int(rng.geometric(1.0 / self.mean))
        gamma = self.gamma
        if self.distribution == "logarithmic":
            return int(rng.logseries(1.0 - gamma))
        while True:
            k = int(rng.negative_binomial(self.shape, gamma))
            if k >= 1:
                return k


# --- Which candidates ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Choice:
    """A parameter drawn uniformly from a list of values."""

    name: str
    values: tuple[Any, ...]

    def draw(self, rng: np.random.Generator) -> Any:
        return self.values[int(rng.integers(len(self.values)))]

    def support(self) -> tuple[Any, ...]:
        return tuple(dict.fromkeys(self.values))


@dataclasses.dataclass(frozen=True)
class LogRange:
    """A parameter drawn log-uniformly from [low, high]; integer settings are rounded (and stay in range)."""

    name: str
    low: float
    high: float
    integer: bool = False

    def draw(self, rng: np.random.Generator) -> Any:
        value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        if self.integer:
            return int(min(max(round(value), math.ceil(self.low)), math.floor(self.high)))
        return float(value)

    def support(self) -> tuple[Any, ...] | None:
        """Every value a draw can take, or None for a continuum."""
        return tuple(range(math.ceil(self.low), math.floor(self.high) + 1)) if self.integer else None


Param = Choice | LogRange


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One drawn setting: `index` is its place in the draw order, `params` sorted by name."""

    index: int
    params: tuple[tuple[str, Any], ...]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.params)


def draw_candidates(space: Sequence[Param], count: int, seed: int) -> tuple[Candidate, ...]:
    """`count` candidates drawn independently and uniformly from `space`, reproducibly from `seed`.

    Prefix-stable: the first k candidates are the same whatever `count` is, so a resumed or extended
    selection never changes a candidate it already trained.
    """
    rng = np.random.default_rng([seed, _CANDIDATE_STREAM])
    ordered = sorted(space, key=lambda p: p.name)
    return tuple(Candidate(i, tuple((p.name, p.draw(rng)) for p in ordered)) for i in range(count))


def candidate_seed(seed: int, index: int) -> int:
    """The training seed of candidate `index`: the K runs must be independent copies of Q, so two candidates
    that drew the same setting must still train with different randomness (never the cell's own seed)."""
    return int(np.random.SeedSequence([seed, _TRAINING_STREAM, index]).generate_state(1)[0] & 0x7FFFFFFF)


@dataclasses.dataclass(frozen=True)
class TuneSpec:
    """A parsed `tune:` block. `val_noise`: standard deviation of the Gaussian added to the count of correct
    validation predictions before selecting (None: the validation records are outside the guarantee)."""

    space: tuple[Param, ...]
    runs: RunCount
    select: str = "val_accuracy"
    budget: str = "total"
    val_noise: float | None = None

    def __post_init__(self) -> None:
        if not self.space:
            raise ValueError("a tuning space needs at least one parameter")
        if self.budget not in BUDGETS:
            raise ValueError(f"unknown budget {self.budget!r}; known: {', '.join(BUDGETS)}")

    def draw(self, seed: int) -> tuple[Candidate, ...]:
        """The candidates this seed trains: K from `runs`, then K draws from `space` (both from `seed`)."""
        return draw_candidates(self.space, self.runs.draw(seed), seed)

    def privacy_support(self, names: Sequence[str] = ("batch_size", "epochs")) -> tuple[dict[str, Any], ...]:
        """Every combination of the parameters in `names` (those that change the run's privacy event) that
        the space can produce: the accountant must cover all of them, drawn or not. ({} if none varies.)"""
        varying = [p for p in self.space if p.name in names]
        supports = []
        for p in varying:
            values = p.support()
            if values is None:
                raise ValueError(f"tune.space.{p.name}: a continuous range changes the privacy event; use a list "
                                 "or an integer range")
            supports.append(values)
        combos = math.prod(len(s) for s in supports)
        if combos > MAX_SUPPORT:
            raise ValueError(f"tune.space: {combos} distinct privacy settings (at most {MAX_SUPPORT}); narrow "
                             + ", ".join(p.name for p in varying))
        names_ = [p.name for p in varying]
        return tuple(dict(zip(names_, values, strict=True)) for values in itertools.product(*supports))


# --- What the selection costs --------------------------------------------------------------------

def noisy_score(count_noise: float) -> dp_accounting.DpEvent:
    """The release of a validation score: the count of correct predictions (sensitivity 1 under both
    add/remove and replace-one) plus Gaussian noise of this standard deviation. Compose it with the
    training event (`ComposedDpEvent([train, noisy_score(s)])`) to make the score part of Q's output."""
    require_positive("val_noise", count_noise)
    return dp_accounting.GaussianDpEvent(count_noise)


def _distinct(events: Sequence[dp_accounting.DpEvent]) -> list[dp_accounting.DpEvent]:
    """Events without repeats, by equality (a `ComposedDpEvent` holds a list, so it cannot be hashed)."""
    out: list[dp_accounting.DpEvent] = []
    for event in events:
        if event not in out:
            out.append(event)
    return out


def _relation(event: dp_accounting.DpEvent) -> dp_accounting.NeighboringRelation:
    """Fixed-size batches are analysed under replace-one, as `sound.epsilon_report` does for RDP."""
    if poisson_dominating(event) != event:
        return dp_accounting.NeighboringRelation.REPLACE_ONE
    return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def _rdp_accountant(event: dp_accounting.DpEvent, relation: dp_accounting.NeighboringRelation | None = None,
                    ) -> rdp_privacy_accountant.RdpAccountant:
    """dp-accounting's RDP accountant at `ORDERS` after composing `event` (under the run event's relation)."""
    accountant = rdp_privacy_accountant.RdpAccountant(ORDERS, relation or _relation(event))
    if not accountant.supports(event):
        raise ValueError(f"dp-accounting's RDP accountant cannot analyse {type(event).__name__} for tuning")
    logger = logging.getLogger("absl")  # one warning per fractional order it drops (harmless: excluded)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return accountant.compose(event)
    finally:
        logger.setLevel(level)


def run_rdp(event: dp_accounting.DpEvent) -> np.ndarray:
    """One run's RDP at `ORDERS` (dp-accounting)."""
    return _rdp_accountant(event).rdp


def selection_rdp(events: Sequence[dp_accounting.DpEvent], runs: RunCount) -> np.ndarray:
    """RDP at `ORDERS` of K ~ `runs` runs of Q, releasing the best, where Q is a uniform draw among `events`.

    One event: dp-accounting's `RepeatAndSelectDpEvent(event, mean, shape)` through its RDP accountant.
    Several (the space varies batch size or epochs): Q's curve is bounded by their pointwise maximum and
    the same dp-accounting transform is applied to that curve (its public event takes one event only).
    """
    distinct = _distinct(events)
    if not distinct:
        raise ValueError("a selection needs at least one run event")
    if len(distinct) == 1:
        selection = RepeatAndSelectDpEvent(distinct[0], float(runs.mean), runs.dp_shape)
        return _rdp_accountant(selection, _relation(distinct[0])).rdp
    if len({_relation(e) for e in distinct}) > 1:
        raise ValueError("the candidates' events assume different neighbouring relations (mixed samplers)")
    base = np.max([run_rdp(e) for e in distinct], axis=0)
    return np.asarray(rdp_privacy_accountant._compute_rdp_repeat_and_select(
        ORDERS, base, float(runs.mean), runs.dp_shape))


def rdp_to_epsilon(rdp: np.ndarray, delta: float) -> float:
    """(epsilon, delta) from an RDP curve at `ORDERS` (dp-accounting's conversion, Canonne et al. 2020)."""
    require_delta(delta)
    return float(rdp_privacy_accountant.compute_epsilon(ORDERS, rdp, delta)[0])


def run_epsilon(events: Sequence[dp_accounting.DpEvent], delta: float, accountant: str = "pld") -> float:
    """The certified epsilon of one candidate run: the worst over the events a candidate can have."""
    values = [certified_epsilon(e, delta, accountant) for e in _distinct(events)]
    if any(v is None for v in values):
        raise ValueError(f"{accountant} cannot analyse a candidate's event")
    return max(values)


def tuned_epsilon(events: Sequence[dp_accounting.DpEvent], runs: RunCount, delta: float) -> float:
    """Epsilon of the whole selection at `delta`.

    K = 1 always (`runs.single`) is exactly one run of Q, so its epsilon is the run's certified (PLD)
    epsilon. dp-accounting does not reduce exactly there: its Theorem 2 term
    (1 + shape) min over orders of (1 - 1/order) eps(order) only vanishes at order 1, which its grid
    (from 1.1) lacks, so it would add that term to a single run. Every other count goes through RDP, the
    only accountant with the analysis.
    """
    if runs.single:
        return run_epsilon(events, delta)
    return rdp_to_epsilon(selection_rdp(events, runs), delta)


def fixed_runs_epsilon(events: Sequence[dp_accounting.DpEvent], delta: float) -> float:
    """What picking the best of a *fixed* set of runs certifies: their composition (PLD), one event per run.

    A fixed N is not a random count, so `RepeatAndSelectDpEvent` does not apply; N-fold composition is the
    sound bound (releasing all N runs costs that much, and the best one is a function of them). This is the
    leaderboard's figure for a grid that compares several settings of a training knob without `tune:`.
    """
    if not events:
        raise ValueError("fixed_runs_epsilon needs at least one run event")
    return run_epsilon([dp_accounting.ComposedDpEvent(list(events))], delta)


@dataclasses.dataclass(frozen=True)
class TuningAccount:
    """The privacy of one tuned cell: each candidate's noise and the two epsilons the records carry.

    `sigmas[i]` is the noise multiplier of a candidate with the i-th privacy setting; `epsilon_run` one
    candidate's certified (PLD) epsilon; `epsilon_run_rdp` the same by RDP, so that the tuning overhead can
    be told apart from RDP's looseness against PLD; `epsilon_tuned` the selection's (never above the target
    under `budget: total`).
    """

    budget: str
    runs: RunCount
    delta: float
    sigmas: tuple[float, ...]
    epsilon_run: float
    epsilon_run_rdp: float
    epsilon_tuned: float
    evaluations: int = 0


@functools.lru_cache(maxsize=256)
def account(families: tuple[Hashable, ...], runs: RunCount, epsilon: float, delta: float, budget: str = "total",
            rel_tol: float = 1e-3, base_sigmas: tuple[float, ...] | None = None) -> TuningAccount:
    """Noise for every candidate and the resulting epsilons, for a target `epsilon` at `delta`.

    `families`: one hashable sigma -> DpEvent per privacy setting the space can produce (one when only lr
    and clip vary). Each is first calibrated to the target for one run (PLD, as a trial with certified
    calibration is), unless `base_sigmas` gives the per-run sigmas the mechanism chose itself (e.g. from
    its claimed accountant): the epsilons are certified either way.
    `per-run` keeps those sigmas and reports the selection's epsilon on top. `total` scales all of them by
    the smallest factor s (on calibrate's 1 + rel_tol grid) with which the whole selection meets the
    target: achieved epsilon <= target, within rel_tol of it.
    """
    require_positive("epsilon", epsilon)
    require_delta(delta)
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; known: {', '.join(BUDGETS)}")
    if not families:
        raise ValueError("account needs at least one event family")
    if base_sigmas is not None and len(base_sigmas) != len(families):
        raise ValueError(f"{len(base_sigmas)} base sigmas for {len(families)} event families")
    base = base_sigmas or tuple(calibrate_sigma(f, epsilon, delta, "pld", rel_tol).sigma for f in families)

    def events_at(scale: float) -> list[dp_accounting.DpEvent]:
        return [f(scale * s) for f, s in zip(families, base, strict=True)]

    scale, evaluations = 1.0, 0
    if budget == "total":
        found = calibrate(lambda s: tuned_epsilon(events_at(s), runs, delta), epsilon, rel_tol=rel_tol,
                          guess=1.0 if runs.single else 1.5, slope=-1.0)
        scale, evaluations = found.sigma, found.evaluations
    events = events_at(scale)
    return TuningAccount(budget=budget, runs=runs, delta=delta, sigmas=tuple(scale * s for s in base),
                         epsilon_run=run_epsilon(events, delta),
                         epsilon_run_rdp=run_epsilon(events, delta, "rdp"),
                         epsilon_tuned=tuned_epsilon(events, runs, delta), evaluations=evaluations)


def as_record(account_: TuningAccount, tuning_runs: int) -> Mapping[str, Any]:
    """The fields a tuned trial's record carries (phase 2 stores them beside the candidate's own)."""
    return {"epsilon_certified_run": account_.epsilon_run, "epsilon_certified_tuned": account_.epsilon_tuned,
            "tuning_runs": tuning_runs, "tuning_distribution": account_.runs.label(),
            "tuning_budget": account_.budget}
