"""Every accountant, sound and claimed, for one DP-SGD setting: epsilon for a sigma, sigma for a target.

Backs `privbench privacy epsilon|sigma` and the README's epsilon-by-accountant table. Every accountant is
asked through the one contract (`Accountant.supports` / `report`): a sound one about the setting's DpEvent,
built from the same sampler and parts as a trial's plan; a claimed one (a seed paper's own analysis) about
the setting itself (`events.DpsgdRun`). Each answer carries its provenance and caveats.
"""

from __future__ import annotations

import dataclasses

from dp_accounting import DpEvent

from mechanisms.accounting import fenton_wilkinson
from mechanisms.accounting.accountant import described
from mechanisms.accounting.calibration import Calibration, calibrate, calibrate_sigma
from mechanisms.accounting.events import DpsgdRun
from mechanisms.accounting.reference import EpsilonReport
from mechanisms.accounting.validation import require_delta, require_fraction, require_positive
from mechanisms.framework.registry import ACCOUNTANTS as REGISTRY
from mechanisms.parts.batch_selection import BatchSelection, PoissonRate, relation_name
from mechanisms.parts.clipping import FlatClipping
from mechanisms.parts.noise_addition import GaussianNoise
from mechanisms.parts.plan import Parts, PrivacySpec
from mechanisms.parts.releases import DatasetStatistic


def accountants() -> tuple[str, ...]:
    """Every accountant's name: the registry's (built-ins and plugins), sound ones first."""
    items = REGISTRY.items()
    return tuple(n for n, a in items if a.sound) + tuple(n for n, a in items if not a.sound)


def sound() -> tuple[str, ...]:
    return tuple(n for n, a in REGISTRY.items() if a.sound)


def kinds() -> dict[str, str]:
    """name -> 'sound: ...' / 'claimed: ...' (`privbench list accountants`, `privbench privacy`)."""
    return {n: described(a) for n, a in REGISTRY.items()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DpsgdSetting:
    """A privacy setting as the accountants compare it (everything but sigma): a view of a `PrivacySpec`
    (`of_spec`: its sampler, delta and one-time statistics), or Poisson sampling stated by rate and steps
    alone (`poisson`), which no spec can state, plus what the claimed analyses additionally need.

    Its certified event is the trial's: the parts of DP-SGD (this sampler, flat clipping, Gaussian noise, the
    spec's dataset statistics) at unit clip, since epsilon does not depend on the clip. `run(sigma)` is the
    one place a `DpsgdRun` (the setting the claimed analyses read) is made.
    """

    selection: BatchSelection | PoissonRate
    delta: float
    # statistics of the training set released once before training (a model's private standardisation)
    statistics: tuple[DatasetStatistic, ...] = ()
    dim: float | None = None  # model dimension d (Fenton-Wilkinson)
    batch_clip_ratio: float | None = None  # c'/c (Fenton-Wilkinson)
    batch_size: int | None = None  # stands in for c'/c without batch clipping (Fenton-Wilkinson)
    delta_split: float = 0.5  # advanced composition's slack share of delta (Fenton-Wilkinson)

    def __post_init__(self) -> None:
        require_delta(self.delta)
        require_fraction("delta_split", self.delta_split)
        if self.dim is not None:
            fenton_wilkinson.check_dim(self.dim)
        if self.batch_clip_ratio is not None:
            require_positive("batch_clip_ratio", self.batch_clip_ratio)
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")

    @classmethod
    def of_spec(cls, spec: PrivacySpec, **claims: object) -> DpsgdSetting:
        """The setting of `spec` (checked where it was made): its sampler, delta and dataset statistics."""
        return cls(selection=spec.batch_selection, delta=spec.delta, statistics=spec.dataset_statistics,
                   **claims)  # type: ignore[arg-type]

    @classmethod
    def poisson(cls, sample_rate: float, steps: int, delta: float, **claims: object) -> DpsgdSetting:
        return cls(selection=PoissonRate(sample_rate, steps), delta=delta, **claims)  # type: ignore[arg-type]

    @classmethod
    def of(cls, sampler: str, dataset_size: int, batch_size: int, epochs: int, delta: float,
           **claims: object) -> DpsgdSetting:
        """The geometry of a trial: `sampler` over N examples in batches of B for `epochs` epochs (its spec)."""
        spec = PrivacySpec(epsilon=None, delta=delta, dataset_size=dataset_size, batch_size=batch_size,
                           epochs=epochs, sampler=sampler)
        return cls.of_spec(spec, batch_size=batch_size, **claims)

    @property
    def sampler(self) -> str:
        return self.selection.name

    @property
    def sample_rate(self) -> float:
        return self.selection.sample_rate

    @property
    def steps(self) -> int:
        return self.selection.steps

    @property
    def dataset_size(self) -> int | None:
        return getattr(self.selection, "dataset_size", None)

    @property
    def epochs(self) -> int | None:
        return getattr(self.selection, "epochs", None)

    @property
    def adjacency(self) -> str:
        return relation_name(self.selection.neighboring_relation)

    def parts(self) -> Parts:
        """DP-SGD's parts on this sampler at unit clip: the trial's certified event, sigma -> DpEvent."""
        return Parts(self.selection, FlatClipping(1.0), GaussianNoise(1.0),  # type: ignore[arg-type]
                     dataset_releases=self.statistics)

    def run(self, sigma: float) -> DpsgdRun:
        """The setting at `sigma` as the claimed analyses read it (each statistic row its own Gaussian)."""
        once = tuple(z for statistic in self.statistics for z in statistic.row_multipliers())
        return DpsgdRun(noise_multiplier=sigma, sampling_probability=self.sample_rate, steps=self.steps,
                        sampler="poisson" if self.sampler == "poisson" else "uniform", dim=self.dim,
                        batch_clip_ratio=self.batch_clip_ratio, batch_size=self.batch_size,
                        delta_split=self.delta_split, once=once)

    def event(self, sigma: float, accountant: str) -> DpEvent:
        """What `accountant` is asked about: the parts' event (sound), the setting (claimed)."""
        return self.parts().dp_event(sigma) if REGISTRY.get(accountant).sound else self.run(sigma)


def applicable(setting: DpsgdSetting) -> tuple[str, ...]:
    """Accountants that can speak about this setting (each one's `supports`), sound ones first."""
    parts = setting.parts()
    return tuple(name for name in accountants()
                 if REGISTRY.get(name).supports(setting.event(1.0, name), parts.accounting_relation))


def _check_name(setting: DpsgdSetting, accountant: str) -> None:
    if accountant not in accountants():
        raise ValueError(f"unknown accountant {accountant!r}; known: {', '.join(accountants())}, all")
    if accountant not in applicable(setting):
        acc = REGISTRY.get(accountant)
        raise ValueError(f"accountant {accountant!r}: {acc.unsupported_note(setting.event(1.0, accountant), None)}")


def epsilon_of(setting: DpsgdSetting, sigma: float, accountant: str = "pld") -> EpsilonReport:
    """Epsilon of T DP-SGD steps at noise multiplier sigma under one accountant, with provenance."""
    require_positive("sigma", sigma)
    _check_name(setting, accountant)
    return REGISTRY.get(accountant).report(setting.event(sigma, accountant), setting.delta,
                                          setting.parts().accounting_relation)


def epsilons(setting: DpsgdSetting, sigma: float,
             accountants: tuple[str, ...] | None = None) -> dict[str, EpsilonReport]:
    """`epsilon_of` for every applicable accountant (or the given ones), in a stable order."""
    names = applicable(setting) if accountants is None else accountants
    return {name: epsilon_of(setting, sigma, name) for name in names}


def sigma_for(setting: DpsgdSetting, epsilon: float, accountant: str = "pld",
              rel_tol: float = 1e-3) -> Calibration:
    """Smallest sigma on the rel_tol grid whose epsilon under `accountant` is <= epsilon.

    Sound accountants go through the cached `calibrate_sigma`; claimed ones through the same grid search,
    started from their own closed form or inverse, so every accountant obeys one contract.
    """
    require_positive("epsilon", epsilon)
    _check_name(setting, accountant)
    if accountant in sound():
        return calibrate_sigma(setting.parts(), epsilon, setting.delta, accountant, rel_tol)
    acc = REGISTRY.get(accountant)
    result = calibrate(lambda sigma: acc.report(setting.run(sigma), setting.delta).epsilon, epsilon,
                       rel_tol=rel_tol, guess=acc.sigma_guess(setting.run(1.0), epsilon, setting.delta))
    note = acc.calibration_note(setting.run(result.sigma), epsilon, setting.delta)
    return dataclasses.replace(result, note="; ".join(n for n in (result.note, note) if n))
