"""White-box Dirac gradient canaries for a one-run audit of an Opacus training run.

Steinke, Nasr & Jagielski (2023), white-box variant: m parameter coordinates are canaries, each
included independently with probability 1/2 (from a seed). Inside the optimizer step, after Opacus
has clipped and summed the per-example gradients and before it adds noise, every included canary
adds C (the clip) at its coordinate, the gradient of a worst-case example of norm C. The
privatised value at every canary coordinate is accumulated over the run as that canary's score;
`estimate(delta)` turns the scores into the one-run epsilon lower bound (guess "in" for the
highest scores, abstain on the rest).

The score of a canary is, by default, the likelihood-ratio statistic of the subsampled Gaussian
across steps (`white_box`), and `estimate` reports the Steinke and the f-DP bound (each at half the
significance) and their maximum as the run's `epsilon`. More canaries than coordinates share
coordinates with random signs (`white_box.CanaryLayout`).

Two details keep the bound sound and useful:
- A canary must not leak more than a real example does. Under Poisson sampling at rate q an
  example joins a step with probability q, so an included canary joins each step independently
  with probability `sample_rate` (pass the loader's rate; 1.0 for full-batch or fixed batches
  accounted without amplification).
- `score="residual"` (default) subtracts the real batch's clipped sum at the coordinate, read
  before the canary is added. Conditional on the rest of the batch, each step is still a
  (subsampled) Gaussian mechanism in the canary, so the guarantee holds for the residual too, and
  the data's gradient no longer drowns the canary. `score="update"` uses the privatised value as is.

The canaries measure what ran, not what the mechanism says about itself. They are the private optimizer's
canary probe (`PrivateOptimizerMixin.attach_probe`), which runs before any release observer: each joining
canary enters the step as an example whose gradient has `CANARY_NORM` times the plan's bound at its coordinate,
and is clipped by the engine that clips the batch, at the bound that engine holds in that step
(`clipped_norm`). The released value is read before any observer sees it (`after_noise`), and every
observation is in the plan's units: the bound the plan's noise is declared for (`Parts.audit_bound`), or, when
the noise follows a state-set bound, the bound in force clamped to the clipper's declared range. An engine
that clips at 2C after planning, or a sum scaled before the noise, pushes a canary by 2 plan units: the audit
then reads far more than the certified epsilon. The noise in between is the mechanism's own noise part
(gredp's frequency-domain noise, shuffled DP-SGD's batch clip), so every mechanism is audited through the
code that trains. The excluded canaries' residuals are kept (a capped number of them) for the noise checks
(`noise_checks`: scale per step, independence across steps).
"""

from __future__ import annotations

import base64
import dataclasses
import time
from typing import Any

import numpy as np

from mechanisms.auditing import noise_checks, one_run, white_box
from mechanisms.auditing.canary import CanaryScoreAuditor

SCORES = ("residual", "update")
CANARY_NORM = 4.0  # a canary example's gradient norm, in the plan's bound: well above it, so the engine clips it
PENDING_VALUES = 1 << 20  # at most this many buffered values (two per canary and step) before scoring


@dataclasses.dataclass(frozen=True)
class OneRunEstimate:
    """epsilon: lower bound at `delta` holding with probability 1 - significance (the larger of the
    Steinke and f-DP bounds, each at significance / 2)."""

    epsilon: float
    delta: float
    significance: float
    canaries: int
    included: int
    steps: int
    overhead_s: float  # time spent in canary injection and scoring during training
    epsilon_steinke: float = 0.0
    epsilon_fdp: float = 0.0
    epsilon_fdp_gdp: float | None = None  # jax_privacy's Gaussian family: informative, not a bound on (eps, delta)
    guesses: int = 0
    statistic: str = "lr"
    estimate_s: float = 0.0  # time spent turning scores into bounds

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class DiracCanaries:
    """m Dirac gradient canaries over a model's flattened trainable parameters."""

    def __init__(self, n_params: int, m: int, *, clip: float, sample_rate: float, seed: int = 0,
                 score: str = "residual", statistic: str = "lr",
                 guess_counts: tuple[int, ...] | None = None, unit_range: tuple[float, float] | None = None,
                 planned_steps: int | None = None, correlation: noise_checks.Correlation | None = None) -> None:
        """`clip`: the plan's unit (the bound its noise is declared for); `unit_range`: when the noise follows
        a state-set bound, the clipper's declared range, to which the bound in force is clamped to give each
        step's unit; `planned_steps` and `correlation` (the noise part's declared correlation across steps)
        are for the noise checks."""
        if not 1 <= m:
            raise ValueError(f"need at least one canary, got {m}")
        if not clip > 0:
            raise ValueError(f"clip must be > 0, got {clip}")
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate}")
        if score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}, got {score!r}")
        if statistic not in white_box.SCORES:
            raise ValueError(f"statistic must be one of {white_box.SCORES}, got {statistic!r}")
        rng = np.random.default_rng([seed, 0xD1AC])
        self.n_params, self.m, self.clip, self.sample_rate, self.score_kind = n_params, m, clip, sample_rate, score
        self.layout = white_box.CanaryLayout.draw(n_params, m, rng)
        self.coordinates, self.signs = self.layout.coordinates, self.layout.signs
        self.included = rng.random(m) < 0.5
        self.statistic, self.guess_counts = statistic, guess_counts
        self.unit_range = unit_range
        # The noise is read at excluded canaries on distinct coordinates: canaries sharing a coordinate see the
        # same noise (up to their signs), so counting each would count one draw several times.
        excluded = np.flatnonzero(~self.included)
        _, first = np.unique(self.coordinates[excluded], return_index=True)
        self.noise_columns = excluded[np.sort(first)]
        self._series = noise_checks.SeriesKeeper(self.noise_columns, planned_steps or 2000, correlation)
        self._scores = np.zeros(m)  # sum over steps of the observation, in units of C
        self._lr = white_box.ScoreAccumulator(m, sample_rate, "lr")
        self._steps = 0
        self.overhead_s = 0.0
        self._participation = np.random.default_rng([seed, 0x5A3F])
        self._optimizer: Any = None
        self._layout: list[tuple[int, Any]] = []  # (param index, local offsets on the parameter's device)
        self._ids = np.zeros(0, dtype=np.int64)  # canary ids in layout order
        # Steps not yet scored: (rows, 2, canaries) on the parameters' device, the clipped sum before the push
        # and the release at each canary's coordinate. Scoring a block of steps at once keeps the per-step
        # work to a few gathers and, on a GPU, off the host: no synchronisation until the block is full.
        self._pending: Any = None
        self._spans: list[tuple[int, int]] = []  # each tensor's canaries: a slice of the layout order
        self._before: list[Any] = []  # per tensor, its columns of the buffer's first and second halves
        self._after: list[Any] = []
        self._bumps: list[Any] = []  # per tensor, the block's pushes: C times the sign where a canary joins
        self._rows = 0
        # Moments of the excluded canaries' residuals, one per coordinate (`noise_columns`; pure noise at a
        # coordinate no canary of theirs pushes; pushes of included canaries sharing it only add variance): the
        # white-box noise measurement.
        self._noise_moments = np.zeros(3)  # (count, sum of y^2, sum of y^4)
        self._norm: Any = None  # the canary example's gradient norm, a device scalar

    @property
    def scores(self) -> np.ndarray:
        self._score_pending()
        return self._scores

    @scores.setter
    def scores(self, value: np.ndarray) -> None:
        self._score_pending()
        self._scores = value

    @property
    def lr_scores(self) -> np.ndarray:
        self._score_pending()
        return self._lr.scores

    @property
    def steps(self) -> int:
        self._score_pending()
        return self._steps

    @property
    def noise_moments(self) -> np.ndarray:
        self._score_pending()
        return self._noise_moments

    @classmethod
    def attach_to(cls, optimizer: Any, m: int, *, sample_rate: float, seed: int = 0,
                  score: str = "residual", statistic: str = "lr",
                  guess_counts: tuple[int, ...] | None = None, unit: float | None = None,
                  unit_range: tuple[float, float] | None = None, planned_steps: int | None = None,
                  correlation: noise_checks.Correlation | None = None) -> DiracCanaries:
        """Canaries over all of `optimizer.params`, already attached. `unit`: the plan's (the trial passes
        `Parts.audit_bound`); without it the optimizer's declared bound. Each push is what the engine's clipping
        leaves of a canary example (`clipped_norm`), never a number the optimizer reports; with `unit_range`
        (noise that follows a state-set bound) each observation is read in units of the bound in force clamped
        to that range.

        Under Opacus' per-layer clipping `max_grad_norm` is the total norm sqrt(sum_l C_l^2), the
        sensitivity of the sum: against isotropic noise a Dirac canary of that norm leaks exactly as
        much as a worst-case example with norm C_l in every tensor.
        """
        n_params = sum(p.numel() for p in optimizer.params)
        if unit is None:
            unit = float(getattr(optimizer, "declared_bound", None) or optimizer.max_grad_norm)
        canaries = cls(n_params, m, clip=unit, sample_rate=sample_rate, seed=seed, score=score, statistic=statistic,
                       guess_counts=guess_counts, unit_range=unit_range, planned_steps=planned_steps,
                       correlation=correlation)
        return canaries.attach(optimizer)

    # -- Opacus plumbing ----------------------------------------------------------------------

    def attach(self, optimizer: Any) -> DiracCanaries:
        import torch  # lazy: heavy (torch)

        if self._optimizer is not None:
            raise RuntimeError("these canaries are already attached")
        if not hasattr(optimizer, "attach_probe"):
            raise ValueError("Dirac canaries need a privbench private optimizer "
                             "(mechanisms.framework.private_training)")
        if optimizer.probe is not None:
            raise RuntimeError("this optimizer already carries Dirac canaries")
        sizes = [p.numel() for p in optimizer.params]
        if sum(sizes) != self.n_params:
            raise ValueError(f"optimizer has {sum(sizes)} parameters, canaries were drawn for {self.n_params}")
        starts = np.cumsum([0, *sizes])
        self._layout, ids = [], []
        for i in range(len(sizes)):
            mine = np.flatnonzero((self.coordinates >= starts[i]) & (self.coordinates < starts[i + 1]))
            if mine.size:
                local = torch.as_tensor(self.coordinates[mine] - starts[i], dtype=torch.long)
                self._layout.append((i, local.to(optimizer.params[i].device)))
                ids.append(mine)
        self._ids = np.concatenate(ids)
        if len({optimizer.params[i].dtype for i, _ in self._layout}) > 1:
            raise ValueError("Dirac canaries need the trainable parameters in one dtype")
        first = optimizer.params[self._layout[0][0]]
        rows = int(np.clip(PENDING_VALUES // (2 * self._ids.size), 1, 256))
        self._pending = torch.zeros((rows, 2, self._ids.size), dtype=first.dtype, device=first.device)
        self._bounds = torch.full((rows,), self.clip, dtype=first.dtype, device=first.device)  # each row's bound
        ends = np.cumsum([local.numel() for _, local in self._layout])
        self._spans = list(zip([0, *ends[:-1].tolist()], ends.tolist(), strict=True))
        self._before = [self._pending[:, 0, start:end] for start, end in self._spans]  # (rows, its canaries)
        self._after = [self._pending[:, 1, start:end] for start, end in self._spans]
        top = self.unit_range[1] if self.unit_range is not None else self.clip
        self._norm = torch.tensor(CANARY_NORM * top, dtype=first.dtype, device=first.device)
        optimizer.attach_probe(self)
        self._optimizer = optimizer
        return self

    def before_noise(self, optimizer: Any) -> None:
        t0 = time.perf_counter()
        self._inject(optimizer)
        self.overhead_s += time.perf_counter() - t0

    def after_noise(self, optimizer: Any) -> None:
        t1 = time.perf_counter()
        self._read(optimizer)
        self.overhead_s += time.perf_counter() - t1
        if self._rows == len(self._pending):
            self._score_pending()

    def detach(self) -> None:
        """Stop observing the optimizer; scores are kept."""
        if self._optimizer is None:
            return
        self._optimizer.attach_probe(None)
        self._optimizer = None

    def _inject(self, optimizer: Any) -> None:
        """Push the joining included canaries into the clipped sum, each by what the engine's clipping leaves of
        a canary example, keeping what the sum held there; record the step's unit (no host synchronisation)."""
        import torch  # lazy: heavy (torch)

        k = self._rows
        if k == 0:  # each included canary joins each step with probability q: a block's draws at once
            ids = self._ids
            joins = self._joins(len(self._pending))[:, ids]
            bumps = torch.as_tensor(joins * self.signs[ids], dtype=self._pending.dtype, device=self._pending.device)
            self._bumps = [bumps[:, start:end] for start, end in self._spans]
        if self.unit_range is not None:  # noise following a state-set bound: the bound in force, as declared
            bound = getattr(optimizer, "bound", self.clip)
            lo, hi = self.unit_range
            if isinstance(bound, torch.Tensor):
                torch.clamp(bound.detach().to(self._bounds.dtype), lo, hi, out=self._bounds[k])
            else:
                self._bounds[k] = min(max(float(bound), lo), hi)
        push = optimizer.clipped_norm(self._norm) if hasattr(optimizer, "clipped_norm") else self._bounds[k]
        for (i, local), before, bump in zip(self._layout, self._before, self._bumps, strict=True):
            p = optimizer.params[i]
            if not p.summed_grad.is_contiguous():
                p.summed_grad = p.summed_grad.contiguous()
            flat = p.summed_grad.view(-1)
            if self.score_kind == "residual":
                torch.index_select(flat.detach(), 0, local, out=before[k])  # a copy, taken before the push
            flat.index_add_(0, local, bump[k] * push)  # shared coordinates add

    def _joins(self, rows: int) -> np.ndarray:
        """Which canaries join each of the next `rows` steps (rows x m booleans): an included canary joins each
        step independently with probability `sample_rate`, as an example of a Poisson-sampled run does."""
        return self.included & (self._participation.random((rows, self.m)) < self.sample_rate)

    def _read(self, optimizer: Any) -> None:
        import torch  # lazy: heavy (torch)

        for (i, local), after in zip(self._layout, self._after, strict=True):
            torch.index_select(optimizer.params[i].grad.detach().reshape(-1), 0, local, out=after[self._rows])
        self._rows += 1

    def _score_pending(self) -> None:
        """Score the buffered steps: one copy to the host for the whole block (timed as canary overhead)."""
        if not self._rows:
            return
        t0 = time.perf_counter()
        block = self._pending[: self._rows].detach().double().cpu().numpy()
        bounds = self._bounds[: self._rows].detach().double().cpu().numpy()[:, None]
        released = block[:, 1] - block[:, 0] if self.score_kind == "residual" else block[:, 1]
        ids = self._ids
        observed = np.empty((self._rows, self.m))
        observed[:, ids] = released * self.signs[ids] / bounds
        self._scores += observed.sum(axis=0)
        self._lr.add(observed)
        out = observed[:, self.noise_columns]
        self._series.add(observed)
        sq = out * out
        self._noise_moments += (out.size, float(sq.sum()), float((sq * sq).sum()))
        self._steps += self._rows
        self._rows = 0
        self.overhead_s += time.perf_counter() - t0

    # -- estimates --------------------------------------------------------------------------

    def statistic_scores(self) -> np.ndarray:
        return self.lr_scores if self.statistic == "lr" else self.scores

    def auditor(self) -> CanaryScoreAuditor:
        return self.observations().auditor()

    def observations(self) -> CanaryObservations:
        """What the canaries saw, without the optimizer: all the estimates need (a later phase computes them)."""
        return CanaryObservations(self.statistic, self.scores.copy(), self.lr_scores.copy(), self.included.copy(),
                                  self.noise_moments.copy(), self.guess_counts, self.steps, self.overhead_s,
                                  self._series.summary())

    def estimate(self, delta: float, significance: float = 0.05) -> OneRunEstimate:
        """The run-level bounds at `delta` (95% by default) from the accumulated scores."""
        return self.observations().estimate(delta, significance)


def encode_array(array: np.ndarray) -> dict[str, str]:
    return {"dtype": array.dtype.str, "b64": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()}


def decode_array(data: dict[str, str]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data["b64"]), dtype=np.dtype(data["dtype"])).copy()


@dataclasses.dataclass(frozen=True)
class CanaryObservations:
    """The scores m canaries accumulated over a run (sum and likelihood-ratio statistic), which were
    included, and the moments of the excluded canaries' residuals. JSON-ready through `to_dict`
    (arrays as exact little-endian bytes), so a run's observations can be stored and analysed later."""

    statistic: str
    scores: np.ndarray  # sum over steps of the observation, in units of C
    lr_scores: np.ndarray
    included: np.ndarray
    noise_moments: np.ndarray  # (count, sum of y^2, sum of y^4)
    guess_counts: tuple[int, ...] | None
    steps: int
    overhead_s: float
    noise_summary: noise_checks.NoiseSummary | None = None  # the excluded canaries' residual series, summarised

    @property
    def m(self) -> int:
        return int(self.included.size)

    def statistic_scores(self) -> np.ndarray:
        return self.lr_scores if self.statistic == "lr" else self.scores

    def auditor(self) -> CanaryScoreAuditor:
        scores = self.statistic_scores()
        return CanaryScoreAuditor(scores[self.included], scores[~self.included])

    def estimate(self, delta: float, significance: float = 0.05) -> OneRunEstimate:
        """The run-level bounds at `delta` (95% by default) from the accumulated scores.

        Guesses: the top-r scores for each r of `guess_counts` (fixed before the run, Bonferroni
        over the list), or every hull threshold (Bonferroni over all of them) when none were given.
        """
        n_in = int(self.included.sum())
        if 0 < n_in < self.m:
            b = white_box.one_run_bounds(self.statistic_scores(), self.included, delta, significance=significance,
                                         guess_counts=self.guess_counts)
            eps, parts = b.epsilon_audited, (b.epsilon_steinke, b.epsilon_fdp, b.epsilon_fdp_gdp, b.guesses, b.wall_s)
        else:  # one side empty: the only rule is "all in", fixed in advance, so no correction
            eps = one_run.epsilon_one_run(self.m, self.m, n_in, significance, delta)
            parts = (eps, 0.0, None, self.m, 0.0)
        return OneRunEstimate(epsilon=float(eps), delta=delta, significance=significance, canaries=self.m,
                              included=n_in, steps=self.steps, overhead_s=self.overhead_s,
                              epsilon_steinke=float(parts[0]), epsilon_fdp=float(parts[1]),
                              epsilon_fdp_gdp=None if parts[2] is None else float(parts[2]), guesses=int(parts[3]),
                              statistic=self.statistic, estimate_s=float(parts[4]))

    def to_dict(self) -> dict[str, Any]:
        arrays = ("scores", "lr_scores", "included", "noise_moments")
        return {f.name: encode_array(getattr(self, f.name)) if f.name in arrays else getattr(self, f.name)
                for f in dataclasses.fields(self)} | {
            "guess_counts": None if self.guess_counts is None else [int(g) for g in self.guess_counts],
            "noise_summary": None if self.noise_summary is None else self.noise_summary.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CanaryObservations:
        arrays = ("scores", "lr_scores", "included", "noise_moments")
        values = {k: decode_array(v) if k in arrays else v for k, v in data.items()}
        if values.get("guess_counts") is not None:
            values["guess_counts"] = tuple(values["guess_counts"])
        if values.get("noise_summary") is not None:
            values["noise_summary"] = noise_checks.NoiseSummary.from_dict(values["noise_summary"])
        return cls(**values)
