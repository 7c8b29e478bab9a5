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

from mechanisms.accounting.validation import require_delta
from mechanisms.framework.claims import CALIBRATIONS
from mechanisms.framework.integrity.trust import own_part  # the one trust definition (a leaf module)
from mechanisms.parts.batch_selection import SAMPLERS, BatchSelection, batch_selection, relation_name
from mechanisms.parts.clipping import Clipping
from mechanisms.parts.noise_addition import GaussianNoise, NoiseAddition, RunNoise
from mechanisms.parts.releases import DatasetStatistic, Release

GRADIENT = "gradient"  # the clipped gradient sum's name among a step's releases


@dataclasses.dataclass(frozen=True, kw_only=True)
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
    # statistics of the training set the model has released once before training (its private standardisation):
    # the plan composes them with the steps (`Parts.dataset_releases`) and the trainer releases exactly these
    dataset_statistics: tuple[DatasetStatistic, ...] = ()

    def __post_init__(self) -> None:
        """Every check of a privacy setting, once, where it is made: what reads a spec trusts it."""
        if self.epsilon is not None and not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"epsilon must be a positive finite number, got {self.epsilon}")
        require_delta(self.delta)
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {tuple(SAMPLERS)}, got {self.sampler!r}")
        batch_selection(self.sampler, self.dataset_size, self.batch_size, self.epochs)  # its check of N, B, epochs
        for name in ("clip", "sigma"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive finite number, got {value}")
        if self.calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {self.calibration!r}")

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
    """The parts one private step is made of, each stating its guarantee: the step's releases on one sample.

    A step releases the clipped gradient sum (`clipper` bounds each example, `noise` adds the noise) and
    every other statistic in `releases` (e.g. adaptive clipping's noised unclipped count), all computed on
    the batch `sampler` draws. The run's event is derived from them (`dp_event`): the releases' Gaussian
    multipliers combine exactly into one (`mechanisms.parts.releases`), and `sampler.dp_event` composes it
    over the run. `dataset_releases` are statistics of the training set released once before training (a
    model's private standardisation: the plan takes them from the spec, whatever the mechanism's parts say),
    each its own Gaussian composed with the steps. `extra_events` are other releases made once, outside the
    steps, as events (DP-Forward's randomized labels);
    `post_processing` names what runs on the released update without touching the data (it costs no
    privacy and earns none).

    Calibration and certification both read `dp_event(sigma)` under `accounting_relation`: one event, one
    relation (`mechanisms.accounting.calibration` asks the parts for both).
    """

    sampler: BatchSelection
    clipper: Clipping
    noise: NoiseAddition
    releases: tuple[Release, ...] = ()
    extra_events: tuple[dp_accounting.DpEvent, ...] = ()
    post_processing: str | None = None
    dataset_releases: tuple[DatasetStatistic, ...] = ()

    def __post_init__(self) -> None:
        names = [r.name for r in self.releases]
        if len(set(names)) != len(names) or GRADIENT in names:
            raise ValueError(f"release names must be unique and not {GRADIENT!r}, got {names}")

    @property
    def neighboring_relation(self) -> dp_accounting.NeighboringRelation:
        """What neighbouring datasets mean for this run (the sampler's relation)."""
        return self.sampler.neighboring_relation

    @property
    def accounting_relation(self) -> dp_accounting.NeighboringRelation:
        """The relation the accountant composes the event under (calibration and certification alike).

        Gaussian steps are written in add/remove units whatever the sampler (a replace-one step carries the
        doubled sensitivity in its multiplier), which every dp-accounting accountant reads the same way.
        Randomized response exists only under replace-one, so parts with such extra events are accounted
        under REPLACE_ONE, where dp-accounting's PLD doubles a Gaussian's unit sensitivity itself: each
        release's multiplier is then taken at half its replace-one sensitivity.
        """
        if self.extra_events:
            return dp_accounting.NeighboringRelation.REPLACE_ONE
        return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE

    @property
    def audit_bound(self) -> float:
        """The largest norm one example's clipped gradient can have at the noise the parts declare: the declared
        bound when the noise follows the bound in force (their ratio is fixed), else the largest bound."""
        return self.clipper.bound if getattr(self.noise, "follows_bound", False) else self.clipper.max_bound

    def _units(self) -> tuple[dp_accounting.NeighboringRelation, float]:
        """The relation a release's sensitivity is taken under, and the factor that puts its multiplier in the
        units of the accounting relation (`accounting_relation`: under REPLACE_ONE, PLD doubles the sensitivity
        itself, so the multiplier is taken at half the replace-one sensitivity)."""
        if self.accounting_relation == dp_accounting.NeighboringRelation.REPLACE_ONE:
            return dp_accounting.NeighboringRelation.REPLACE_ONE, 2.0
        return self.neighboring_relation, 1.0

    def release_multipliers(self, sigma: float) -> dict[str, float]:
        """Each release's own Gaussian multiplier (std over sensitivity), in the units of the accounting
        relation: the gradient sum under `GRADIENT`, the others under their names."""
        relation, unit = self._units()
        out = {GRADIENT: unit * self.noise.noise_multiplier(sigma, self.clipper, relation)}
        for release in self.releases:
            out[release.name] = unit * release.noise_multiplier(sigma, relation)
        return out

    def dataset_multipliers(self) -> dict[str, float]:
        """Each dataset statistic's Gaussian multiplier, in the units of the accounting relation."""
        relation, unit = self._units()
        return {r.name: unit * r.multiplier(relation) for r in self.dataset_releases}

    def noise_multiplier(self, sigma: float) -> float:
        """The step's one Gaussian multiplier: (sum_r z_r^-2)^-1/2 over its releases; 0 when one leaves a
        direction without noise."""
        multipliers = list(self.release_multipliers(sigma).values())
        if any(not z > 0 for z in multipliers):
            return 0.0
        if len(multipliers) == 1:  # the gradient alone: its multiplier as it is (no round trip through 1/z^2)
            return multipliers[0]
        return 1.0 / math.sqrt(sum(1.0 / (z * z) for z in multipliers))

    def certification_gap(self) -> str | None:
        """Why these parts cannot be certified (None when they can): a part privbench did not write (its
        code, not its declaration, decides what is released), or a noise part that does not say how it
        follows a clip bound the state moves."""
        problems = foreign_parts(self)
        if isinstance(self.noise, RunNoise):
            problems += correlated_gaps(self, self.noise)
        if self.clipper.state_key is not None and type(self.noise) is not GaussianNoise:
            problems.append(f"{type(self.noise).__name__} does not state how its noise follows the clip bound "
                            "the mechanism's state sets (GaussianNoise does)")
        return "; ".join(problems) or None

    def dp_event(self, sigma: float) -> dp_accounting.DpEvent:
        """The whole run's event at noise multiplier `sigma`; a noiseless direction makes it non-private, parts
        that cannot be certified make it unsupported."""
        if self.certification_gap() is not None:
            return dp_accounting.UnsupportedDpEvent()
        multiplier = self.noise_multiplier(sigma)
        if not multiplier > 0:
            return dp_accounting.NonPrivateDpEvent()
        if isinstance(self.noise, RunNoise):  # one Gaussian for the whole run, over every participation
            event = dp_accounting.GaussianDpEvent(multiplier)
        else:
            event = self.sampler.dp_event(dp_accounting.GaussianDpEvent(multiplier))
        once = [dp_accounting.GaussianDpEvent(z) for z in self.dataset_multipliers().values()]
        once += self.extra_events
        return dp_accounting.ComposedDpEvent([event, *once]) if once else event

    def __call__(self, sigma: float) -> dp_accounting.DpEvent:
        """Parts are a hashable event family sigma -> DpEvent (calibration caches on it)."""
        return self.dp_event(sigma)

    def describe(self) -> dict[str, Any]:
        return {**self.sampler.describe(), "clipping": type(self.clipper).__name__,
                "clip_bound": self.clipper.bound, "sensitivity": self.clipper.sensitivity(self.neighboring_relation),
                **self.noise.describe(), "releases": [r.describe() for r in self.releases],
                "post_processing": self.post_processing, "extra_events": [repr(e) for e in self.extra_events],
                "dataset_releases": [r.describe() for r in self.dataset_releases]}


def correlated_gaps(parts: Parts, noise: RunNoise) -> list[str]:
    """Why a correlated-noise part's one Gaussian does not describe the run (empty: it does): its participation
    schema must admit every pattern the sampler executes (same steps, at least as many participations, at most
    the same separation), and a step may release nothing else (a per-step release would compose per step)."""
    sampler, stated = parts.sampler, noise.participation
    executed = getattr(sampler, "participation", None)
    problems = []
    if executed is None:
        problems.append(f"the {sampler.name} sampler states no participation schema, which the correlated noise's "
                        "sensitivity needs (no amplification by sampling is analysed for correlated noise here; "
                        "use sampler fixed-order)")
    elif not (stated.steps == executed.steps and stated.max_participations >= executed.max_participations
              and stated.min_separation <= executed.min_separation
              and (stated.schema == "min-separation" or stated == executed)):
        problems.append(f"the noise's sensitivity is stated for {stated}, the sampler executes {executed}")
    if parts.releases:
        problems.append("correlated noise with other per-step releases is not analysed")
    return problems


def foreign_parts(parts: Parts) -> list[str]:
    """The parts of `parts` that are not privbench's own classes (`integrity.trust.own_part`: a plugin's subclass
    of a privbench part is not, since it may change what is released while keeping the declaration)."""
    found = []
    for role, part in (("sampler", parts.sampler), ("clipper", parts.clipper), ("noise", parts.noise),
                       *(("release", r) for r in parts.releases),
                       *(("dataset release", r) for r in parts.dataset_releases)):
        if not own_part(part):
            kind = type(part)
            found.append(f"the {role} {kind.__module__}.{kind.__qualname__} is not one of privbench's parts, so "
                         "what it releases is not verified")
    return found


@dataclasses.dataclass(frozen=True, kw_only=True)
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
    uncertified_reason: str | None = None  # why no sound analysis of what runs is known (certified is None)
    release_multipliers: Mapping[str, float] = dataclasses.field(default_factory=dict)  # each release's own

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
        out["release_multipliers"] = dict(self.release_multipliers)
        out["parts"] = self.parts.describe() if self.parts is not None else None
        out["batch_selection"] = self.batch_selection.describe() if self.parts or self.batch else None
        return out


__all__ = ["CALIBRATIONS", "GRADIENT", "SAMPLERS", "Parts", "PrivacyPlan", "PrivacySpec", "foreign_parts",
           "relation_name"]
