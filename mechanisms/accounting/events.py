"""The sampling wrappers of a DpEvent (how one step's release composes over a run), and `DpsgdRun`, the
setting the papers' own analyses are stated for.

`mechanisms.parts.batch_selection` is the only caller: each sampler states its run's event through one of
these, and every event in privbench (trial plans, `privbench privacy`, claimed analyses) is built from a
sampler and the parts (`mechanisms.parts.plan.Parts`), so one setting has one event.
"""

from __future__ import annotations

import dataclasses

import dp_accounting


def poisson_sampled(step: dp_accounting.DpEvent, sample_rate: float, steps: int) -> dp_accounting.DpEvent:
    """`steps` releases of `step`, each on a Poisson sample of rate q (q = 1: every record, every step)."""
    sampled = step if sample_rate == 1 else dp_accounting.PoissonSampledDpEvent(sample_rate, step)
    return dp_accounting.SelfComposedDpEvent(sampled, steps)


def sampled_without_replacement(
    step: dp_accounting.DpEvent, dataset_size: int, batch_size: int, steps: int,
) -> dp_accounting.DpEvent:
    """`steps` releases of `step`, each on a fresh batch of exactly B of the N records (replace-one)."""
    sampled = dp_accounting.SampledWithoutReplacementDpEvent(dataset_size, batch_size, step)
    return dp_accounting.SelfComposedDpEvent(sampled, steps)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DpsgdRun(dp_accounting.DpEvent):
    """`steps` DP-SGD steps at noise multiplier `noise_multiplier`, each on a batch the sampler draws at rate
    `sampling_probability` (`poisson`, or `uniform`: fixed-size or shuffled batches of that share).

    A new event for a new meaning (dp-accounting's rule): the seed papers' claimed analyses (the GDP CLT, the
    classic moments accountant, Fenton-Wilkinson) are functions of this setting, not of an event algebra, so
    the claimed accountants read it; no sound accountant supports it. `dim`, `batch_clip_ratio`,
    `batch_size` and `delta_split` are what shuffled DP-SGD's Theorem 6 also takes (d, c'/c, B, the share of
    delta given to advanced composition's slack). `once` are the multipliers of Gaussian releases made once on
    the whole training set and composed with the run (Tramer & Boneh's private standardisation: one per
    statistic row); an analysis that does not compose them does not support the run.

    A view, never a setting of its own: `compare.DpsgdSetting.run` (a view of a `PrivacySpec`, or of a rate
    and steps) is the one place it is made, so its numbers are the spec's."""

    noise_multiplier: float
    sampling_probability: float
    steps: int
    sampler: str = "poisson"
    dim: float | None = None
    batch_clip_ratio: float | None = None
    batch_size: int | None = None
    delta_split: float = 0.5
    once: tuple[float, ...] = ()


__all__ = ["DpsgdRun", "poisson_sampled", "sampled_without_replacement"]
