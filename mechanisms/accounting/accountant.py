"""The accountant contract (`Accountant`): one base for privbench's accountants and a plugin's alike.

An accountant answers two questions about a DpEvent, in dp-accounting's manner: `supports(event, relation)`
("can I?") and `report(event, delta, relation)` ("epsilon at delta, with where the number comes from"),
and `report` answers None for an event it does not support, never a guess. It is either *sound*: its
epsilon upper-bounds the event's for every event it supports (`epsilon_certified` and the accountants
recorded beside it), or *claimed*: a seed paper's own analysis of DP-SGD's noise, shown beside the sound
ones by `privbench privacy` and tested by the audits, not a bound.

The built-ins are subclasses registered exactly as a plugin's are (the `privbench.accountants` entry points):
PLD (the reference), RDP and PRV (sound); the mu-GDP CLT, the classic moments accountant and shuffled
DP-SGD's Fenton-Wilkinson condition (claimed: they read a `events.DpsgdRun`, the setting their papers
state them for). A plugin either subclasses `Accountant` or names a factory of a
`dp_accounting.PrivacyAccountant` for add-or-remove-one neighbours, whose `compose(event).get_epsilon(delta)`
must bound the event's epsilon (dp-accounting's own contract); `calibrates: true` lets a grid pick it.

Import-light: nothing here imports dp-accounting, scipy or an accountant's code until a number is asked for.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import dp_accounting

    from mechanisms.accounting.reference import EpsilonReport


def _relation(relation: Any) -> Any:
    import dp_accounting  # lazy: heavy (dp_accounting)

    return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE if relation is None else relation


@dataclasses.dataclass(frozen=True)
class Accountant:
    """An accountant by name: what it is, whether it bounds epsilon, and how it answers.

    Subclasses override `supports` and `_epsilon`; `report` is the same for all (non-private and unsupported
    events, the support check, the provenance of the number).
    """

    name: str
    description: str
    sound: bool = True
    calibrates: bool = False  # a grid's `accountant:` may pick it to calibrate sigma
    factory: str | Callable[[], Any] | None = None  # `module:callable` or a callable (a plugin's accountant)
    bracket: str | None = None  # a cheaper sound accountant that brackets its calibration (calibration.py)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"an accountant needs a name, got {self.name!r}")
        if self.calibrates and not self.sound:
            raise ValueError(f"accountant {self.name}: only a sound accountant may calibrate sigma")

    @property
    def kind(self) -> str:
        return "sound" if self.sound else "claimed"

    def make(self) -> Any:
        """A fresh `dp_accounting.PrivacyAccountant` (add-or-remove-one) from the factory."""
        factory = self.factory
        if factory is None:
            raise ValueError(f"accountant {self.name} has no factory")
        if isinstance(factory, str):
            module, _, attr = factory.partition(":")
            factory = getattr(importlib.import_module(module), attr)
        return factory()

    def supports(self, event: dp_accounting.DpEvent, relation: dp_accounting.NeighboringRelation | None = None) -> bool:
        """Whether `report` gives a number for `event` under `relation` (a factory's accountant: add-or-remove-one
        events its `supports` accepts)."""
        import dp_accounting  # lazy: heavy (dp_accounting)

        return _relation(relation) == dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE and \
            self.make().supports(event)

    def _epsilon(self, event: dp_accounting.DpEvent, delta: float,
                 relation: dp_accounting.NeighboringRelation) -> EpsilonReport:
        """The number for a supported event (a factory's accountant: its `compose(event).get_epsilon(delta)`)."""
        from mechanisms.accounting.reference import EpsilonReport  # lazy: keeps the registries light

        value = float(self.make().compose(event).get_epsilon(delta))
        return EpsilonReport(epsilon=value, accountant=self.name, computed_by=self.name)

    def report(self, event: dp_accounting.DpEvent, delta: float,
               relation: dp_accounting.NeighboringRelation | None = None) -> EpsilonReport:
        """Epsilon at `delta` for `event` under `relation` (add-or-remove-one by default), with provenance:
        inf for a non-private event, None (and why) for an event no sound analysis or this accountant covers."""
        import dp_accounting  # lazy: heavy (dp_accounting)

        from mechanisms.accounting.reference import EpsilonReport  # lazy: keeps the registries light
        from mechanisms.accounting.validation import require_delta  # lazy: keeps privbench list light

        require_delta(delta)
        relation = _relation(relation)
        if isinstance(event, dp_accounting.NonPrivateDpEvent):
            return EpsilonReport(epsilon=math.inf, accountant=self.name, computed_by=self.name, note="non-private")
        if isinstance(event, dp_accounting.UnsupportedDpEvent):
            return EpsilonReport(epsilon=None, accountant=self.name, computed_by=self.name,
                                 note="no sound analysis is known for this event")
        if not self.supports(event, relation):
            return EpsilonReport(epsilon=None, accountant=self.name, computed_by=self.name,
                                 note=self.unsupported_note(event, relation))
        return self._epsilon(event, delta, relation)

    def unsupported_note(self, event: dp_accounting.DpEvent, relation: dp_accounting.NeighboringRelation) -> str:
        import dp_accounting  # lazy: heavy (dp_accounting)

        if self.factory is not None and relation != dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE:
            return "plugin accountants answer add-or-remove-one only"
        return f"{self.name} does not support this event"


@dataclasses.dataclass(frozen=True)
class Pld(Accountant):
    """dp-accounting's PLD, with the discretisation chosen per event (`adaptive_pld`): the reference."""

    def supports(self, event: Any, relation: Any = None) -> bool:
        from mechanisms.accounting import reference  # lazy: keeps the registries light

        return reference.pld_supports(event, _relation(relation))

    def _epsilon(self, event: Any, delta: float, relation: Any) -> EpsilonReport:
        from mechanisms.accounting import reference  # lazy: keeps the registries light

        return reference.pld_report(event, delta, relation, self.name)


@dataclasses.dataclass(frozen=True)
class Rdp(Accountant):
    """dp-accounting's RDP: fixed-size batches by sampling without replacement; not for replace-one Gaussians,
    which it reads at another sensitivity than PLD."""

    def supports(self, event: Any, relation: Any = None) -> bool:
        from mechanisms.accounting import reference  # lazy: keeps the registries light

        return reference.rdp_supports(event, _relation(relation))

    def unsupported_note(self, event: Any, relation: Any) -> str:
        import dp_accounting  # lazy: heavy (dp_accounting)

        if relation == dp_accounting.NeighboringRelation.REPLACE_ONE:
            return ("dp-accounting's RDP reads replace-one Gaussians at a different sensitivity than PLD: not used "
                    "for replace-one events")
        return super().unsupported_note(event, relation)

    def _epsilon(self, event: Any, delta: float, relation: Any) -> EpsilonReport:
        from mechanisms.accounting import reference  # lazy: keeps the registries light

        return reference.rdp_report(event, delta)


@dataclasses.dataclass(frozen=True)
class Prv(Accountant):
    """The PRV accountant (Gopi et al.), guarded: PLD answers where it is known to fail."""

    def supports(self, event: Any, relation: Any = None) -> bool:
        from mechanisms.accounting import reference  # lazy: keeps the registries light

        return reference.prv_supports(event, _relation(relation))

    def _epsilon(self, event: Any, delta: float, relation: Any) -> EpsilonReport:
        from mechanisms.accounting import reference  # lazy: keeps the registries light

        return reference.prv_report(event, delta, relation)


@dataclasses.dataclass(frozen=True)
class ClaimedDpsgd(Accountant):
    """A paper's own analysis of DP-SGD: a function of (sigma, q, T) and the sampler, so it reads an
    `events.DpsgdRun`; `formula` names `module:function(run, delta) -> epsilon`."""

    sound: bool = False
    formula: str = ""
    poisson_only: bool = False
    composes_once: bool = False  # whether the formula composes the run's one-time releases (`DpsgdRun.once`)

    def supports(self, event: Any, relation: Any = None) -> bool:
        from mechanisms.accounting.events import DpsgdRun  # lazy: keeps the registries light

        return isinstance(event, DpsgdRun) and (event.sampler == "poisson" or not self.poisson_only) and \
            (self.composes_once or not event.once)

    def unsupported_note(self, event: Any, relation: Any) -> str:
        if getattr(event, "once", ()) and not self.composes_once:
            return f"{self.name} does not compose one-time releases with DP-SGD's steps"
        return f"{self.name} analyses DP-SGD's setting{' under Poisson sampling' if self.poisson_only else ''} only"

    def _epsilon(self, event: Any, delta: float, relation: Any) -> EpsilonReport:
        from mechanisms.accounting.reference import EpsilonReport  # lazy: keeps the registries light

        module, _, function = self.formula.partition(":")
        value = float(getattr(importlib.import_module(module), function)(event, delta))
        return EpsilonReport(epsilon=value, accountant=self.name, computed_by=self.name, note=self.note(event, value))

    def note(self, event: Any, value: float) -> str:
        return ""

    def calibration_note(self, event: Any, epsilon: float, delta: float) -> str:
        """What a calibration to `epsilon` should add about the sigma it found (none by default)."""
        return ""

    def sigma_guess(self, event: Any, epsilon: float, delta: float) -> float:
        """A starting sigma for a calibration (the CLT's closed form, where the analysis has one)."""
        from mechanisms.accounting import gdp  # lazy: keeps the registries light

        return gdp.sigma_for_epsilon(epsilon, delta, event.sampling_probability, event.steps,
                                     "poisson" if event.sampler == "poisson" else "uniform")


@dataclasses.dataclass(frozen=True)
class FentonWilkinson(ClaimedDpsgd):
    """Shuffled DP-SGD's Theorem 6 + advanced composition: needs the model dimension d and the batch clip
    c'/c (or a batch size standing in for it), which the `DpsgdRun` carries."""

    def supports(self, event: Any, relation: Any = None) -> bool:
        return super().supports(event, relation) and event.dim is not None and (
            event.batch_clip_ratio is not None or event.batch_size is not None)

    def unsupported_note(self, event: Any, relation: Any) -> str:
        return "fenton_wilkinson needs --dim and --batch-clip-ratio or --batch-size"

    def note(self, event: Any, value: float) -> str:
        return "Theorem 6 holds at every per-step epsilon: the claim is epsilon 0 (not a bound)" if value == 0 else ""

    def calibration_note(self, event: Any, epsilon: float, delta: float) -> str:
        """Algorithm 1 runs whichever of the shuffled sigma and the plain (d = 1) one is smaller: say which."""
        from mechanisms.accounting import fenton_wilkinson  # lazy: keeps the registries light

        plain = fenton_wilkinson.sigma_for_epsilon(
            epsilon, delta, event.sampling_probability, event.steps, 1, batch_clip_ratio=event.batch_clip_ratio,
            batch_size=event.batch_size, delta_split=event.delta_split)
        if plain < event.noise_multiplier:
            return (f"Algorithm 1 falls back to plain DP-SGD: the unshuffled sigma {plain:.6g} is smaller than "
                    "the shuffled one")
        return f"unshuffled (d = 1) sigma for the same target: {plain:.6g}"

    def sigma_guess(self, event: Any, epsilon: float, delta: float) -> float:
        from mechanisms.accounting import fenton_wilkinson  # lazy: keeps the registries light

        return fenton_wilkinson.sigma_for_epsilon(
            epsilon, delta, event.sampling_probability, event.steps, event.dim,
            batch_clip_ratio=event.batch_clip_ratio, batch_size=event.batch_size, delta_split=event.delta_split)


PLD = Pld("pld", "privacy loss distributions (dp-accounting), the reference for epsilon_certified", calibrates=True,
          bracket="rdp")
RDP = Rdp("rdp", "Renyi DP (dp-accounting), looser", calibrates=True)
PRV = Prv("prv", "privacy random variables (Opacus port of Gopi et al. 2021), cross-check", bracket="pld")
GDP = ClaimedDpsgd("gdp", "mu-GDP central limit theorem (arXiv 1911.11607, dpsgd-gdp); not a bound",
                   formula="mechanisms.accounting.gdp:run_epsilon")
MA_CLASSIC = ClaimedDpsgd("ma_classic", "moments accountant with the classic conversion (Abadi et al. 2016 as "
                                        "published)", formula="mechanisms.accounting.moments_accountant:run_epsilon",
                          poisson_only=True, composes_once=True)
FENTON_WILKINSON = FentonWilkinson("fenton_wilkinson", "Fenton-Wilkinson Thm 6 + advanced composition "
                                                       "(arXiv 2407.15414, shuffled-dpsgd); not a bound",
                                   formula="mechanisms.accounting.fenton_wilkinson:run_epsilon")


def described(accountant: Accountant) -> str:
    """'sound: ...' / 'claimed: ...', as `privbench list accountants` and `privbench privacy` show it."""
    return f"{accountant.kind}: {accountant.description}"


__all__ = ["FENTON_WILKINSON", "GDP", "MA_CLASSIC", "PLD", "PRV", "RDP", "Accountant", "ClaimedDpsgd",
           "FentonWilkinson", "Pld", "Prv", "Rdp", "described"]
