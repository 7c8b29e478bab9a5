"""What a trial asks of a mechanism (`PrivacySpec`) and what the mechanism answers (`PrivacyPlan`).

A plan bundles the parts that run (`Parts`: batch selection, clipping, noise) with the `DpEvent` they add
up to, in the spirit of jax_privacy's execution plan: the loader, the optimizer and the accountant all
read the same objects, so the accounted process is the executed one. The certified epsilon is a pure
function of that event (dp-accounting style) and can be recomputed by any reference accountant later.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import dp_accounting

from mechanisms.claims import CALIBRATIONS
from mechanisms.parts.batch_selection import SAMPLERS, BatchSelection, batch_selection, relation_name
from mechanisms.parts.clipping import Clipping
from mechanisms.parts.noise_addition import NoiseAddition


@dataclasses.dataclass(frozen=True)
class PrivacySpec:
    """The privacy side of one trial: target, batch geometry and how to calibrate."""

    epsilon: float | None  # target; None means "no target" (nonprivate, or an explicit sigma)
    delta: float
    dataset_size: int
    batch_size: int
    epochs: int
    clip: float = 1.0
    calibration: str = "claimed"
    accountant: str = "pld"
    sampler: str = "poisson"
    sigma: float | None = None  # an explicit noise multiplier skips calibration
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    model_dim: int | None = None  # trainable parameters (e.g. d in the shuffled-DP-SGD accountant)
    n_tensors: int | None = None  # trainable parameter tensors (per-layer clipping's sensitivity)
    tensor_sizes: tuple[int, ...] | None = None  # elements of each trainable tensor, in parameter order

    def __post_init__(self) -> None:
        if self.epsilon is not None and not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"epsilon must be a positive finite number, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta}")
        if self.dataset_size < 1 or self.batch_size < 1 or self.epochs < 1:
            raise ValueError("dataset_size, batch_size and epochs must be >= 1")
        if self.batch_size > self.dataset_size:
            raise ValueError(f"batch_size {self.batch_size} exceeds dataset_size {self.dataset_size}")
        if self.clip <= 0:
            raise ValueError(f"clip must be > 0, got {self.clip}")
        if self.calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {self.calibration!r}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {tuple(SAMPLERS)}, got {self.sampler!r}")
        if self.sigma is not None and self.sigma <= 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma}")

    @property
    def batch_selection(self) -> BatchSelection:
        """The sampler the trial will run (and the accountant composes)."""
        return batch_selection(self.sampler, self.dataset_size, self.batch_size, self.epochs)

    @property
    def sample_rate(self) -> float:
        return self.batch_selection.sample_rate

    @property
    def steps(self) -> int:
        """The number of updates the sampler yields: `epochs` passes of round(N / B) steps each."""
        return self.batch_selection.steps


@dataclasses.dataclass(frozen=True)
class Parts:
    """The parts one private step is made of, each stating its guarantee.

    The run's event is derived from them: one step releases the clipped sum with `noise`, i.e. a Gaussian
    whose multiplier is `noise.noise_multiplier(sigma, clipper, relation)` under the sampler's
    neighbouring relation, and `sampler.dp_event` composes it over the run. `extra_events` are releases
    outside the gradient path (DP-Forward's randomized labels), composed once; `post_processing` names
    what runs on the released update without touching the data (it costs no privacy and earns none).
    """

    sampler: BatchSelection
    clipper: Clipping
    noise: NoiseAddition
    extra_events: tuple[dp_accounting.DpEvent, ...] = ()
    post_processing: str | None = None

    @property
    def neighboring_relation(self) -> dp_accounting.NeighboringRelation:
        """What neighbouring datasets mean for this run (the sampler's relation)."""
        return self.sampler.neighboring_relation

    @property
    def accounting_relation(self) -> dp_accounting.NeighboringRelation:
        """The relation the accountant composes the event under.

        Gaussian steps are written in add/remove units whatever the sampler (a replace-one step carries the
        doubled sensitivity in its multiplier), which every dp-accounting accountant reads the same way.
        Randomized response exists only under replace-one, so parts with such extra events are accounted
        under REPLACE_ONE, where dp-accounting's PLD doubles a Gaussian's unit sensitivity itself: their
        Gaussian multiplier is then taken in add/remove units (std over the per-example bound).
        """
        if self.extra_events:
            return dp_accounting.NeighboringRelation.REPLACE_ONE
        return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE

    def noise_multiplier(self, sigma: float) -> float:
        """The step's Gaussian multiplier: noise std over the sensitivity under the sampler's relation."""
        return self.noise.noise_multiplier(sigma, self.clipper, self.neighboring_relation)

    def dp_event(self, sigma: float) -> dp_accounting.DpEvent:
        """The whole run's event at noise multiplier `sigma`; a noiseless direction makes it non-private."""
        if self.extra_events:
            multiplier = self.noise.noise_multiplier(sigma, self.clipper,
                                                     dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
        else:
            multiplier = self.noise_multiplier(sigma)
        if not multiplier > 0:
            return dp_accounting.NonPrivateDpEvent()
        event = self.sampler.dp_event(dp_accounting.GaussianDpEvent(multiplier))
        return dp_accounting.ComposedDpEvent([event, *self.extra_events]) if self.extra_events else event

    def __call__(self, sigma: float) -> dp_accounting.DpEvent:
        """Parts are a hashable event family sigma -> DpEvent (calibration caches on it)."""
        return self.dp_event(sigma)

    def describe(self) -> dict[str, Any]:
        return {**self.sampler.describe(), "clipping": type(self.clipper).__name__,
                "clip_bound": self.clipper.bound, "sensitivity": self.clipper.sensitivity(self.neighboring_relation),
                **self.noise.describe(), "post_processing": self.post_processing,
                "extra_events": [repr(e) for e in self.extra_events]}


@dataclasses.dataclass(frozen=True)
class PrivacyPlan:
    """A mechanism's answer: its noise, and the three sources of truth about that noise.

    `epsilon_claimed` comes from the mechanism's own published analysis (`claimed_by` names it);
    `epsilon_certified` from the reference accountant applied to `effective_event`; `None` where no
    value applies (nonprivate: both None; no sound analysis: certified None).
    """

    mechanism: str
    sigma: float | None
    sample_rate: float
    steps: int
    delta: float
    sampler: str
    accountant: str
    claimed_by: str | None
    epsilon_claimed: float | None
    epsilon_certified: float | None
    effective_event: dp_accounting.DpEvent
    notes: str = ""
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    parts: Parts | None = None  # None: nothing private runs (nonprivate)
    neighboring_relation: str = "add-or-remove-one"
    epsilons: Mapping[str, float | None] = dataclasses.field(default_factory=dict)  # pld (certified), rdp, prv
    batch: BatchSelection | None = None  # the sampler that runs (parts.sampler when there are parts)

    @property
    def batch_selection(self) -> BatchSelection:
        selection = self.parts.sampler if self.parts is not None else self.batch
        if selection is None:
            raise ValueError(f"the {self.mechanism} plan has no batch selection")
        return selection

    def __post_init__(self) -> None:
        for name in ("epsilon_claimed", "epsilon_certified"):
            value = getattr(self, name)
            if value is not None and math.isnan(value):
                raise ValueError(f"{self.mechanism}: {name} is NaN; an undefined epsilon is an error, never a verdict")

    def as_record(self) -> dict[str, Any]:
        """Plain JSON-ready view (the event as its repr, which dp-accounting keeps readable)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("parts", "batch")}
        out["effective_event"] = repr(self.effective_event)
        out["extra"] = dict(self.extra)
        out["epsilons"] = dict(self.epsilons)
        out["parts"] = self.parts.describe() if self.parts is not None else None
        out["batch_selection"] = self.batch_selection.describe() if self.parts or self.batch else None
        return out


__all__ = ["CALIBRATIONS", "SAMPLERS", "Parts", "PrivacyPlan", "PrivacySpec", "relation_name"]
