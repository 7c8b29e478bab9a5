"""The sampling wrappers of a DpEvent: how one step's release composes over a run.

`mechanisms.parts.batch_selection` is the only caller: each sampler states its run's event through one of
these, and every event in privbench (trial plans, `privbench privacy`, claimed analyses) is built from a
sampler and the parts (`mechanisms.parts.plan.Parts`), so one setting has one event.
"""

from __future__ import annotations

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


__all__ = ["poisson_sampled", "sampled_without_replacement"]
