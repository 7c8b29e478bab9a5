"""DpEvent builders for the noise our mechanisms add (one name per sampling scheme).

The event is the contract between a mechanism and the accountants: it must describe what the code
*effectively* does, including the neighbouring relation the sampler forces, because an epsilon is only
meaningful together with the sampler it assumes (`SAMPLER_ADJACENCY`, recorded next to every epsilon).
"""

from __future__ import annotations

import dataclasses
import math

import dp_accounting

from mechanisms.accountants.validation import require_positive, require_sample_rate, require_steps

SAMPLERS = ("poisson", "fixed", "shuffle")

# The neighbouring relation each sampler's guarantee is stated for.
SAMPLER_ADJACENCY = {
    "poisson": "add-or-remove-one",  # batch size is random; adding a record changes nothing else
    "fixed": "replace-one",  # n and the batch size are public; a record is replaced
    "shuffle": "replace-one",
}


def fixed_batch_size(sample_rate: float, dataset_size: int) -> int:
    """round(q N), at least 1: the batch a fixed-size sampler draws."""
    return max(1, round(sample_rate * dataset_size))


def participations(sample_rate: float, steps: int, dataset_size: int) -> int:
    """Most steps one record can join under shuffling: one per epoch started (floor(N/B) full batches each)."""
    steps_per_epoch = max(1, dataset_size // fixed_batch_size(sample_rate, dataset_size))
    return math.ceil(steps / steps_per_epoch)


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


def dpsgd_event(
    sigma: float, sample_rate: float, steps: int, *, sampler: str = "poisson",
    dataset_size: int | None = None,
) -> dp_accounting.DpEvent:
    """T steps of DP-SGD: a Gaussian with noise multiplier `sigma` on a sum of clipped gradients.

    `sampler="poisson"`: each record joins a batch independently with probability `sample_rate`
    (add/remove adjacency, sensitivity = clip).

    `"fixed"`: each step draws a batch of exactly `round(q N)` records without replacement,
    independently across steps. This needs replace-one adjacency, under which the clipped sum moves by
    up to 2 * clip, so the event carries noise multiplier sigma / 2 (dp-accounting's
    `SampledWithoutReplacementDpEvent` measures noise against the replace-one sensitivity; jax_privacy's
    fixed-batch accounting doubles the sensitivity the same way).

    `"shuffle"`: one random permutation per epoch, then consecutive disjoint batches. Steps are not
    independent samples, and no amplification for this is known to be sound (Chua et al. 2024 show
    Poisson accounting under-reports it), so the event is the un-amplified bound: each record is in one
    batch per epoch, i.e. `participations` Gaussians with sigma / 2 (replace-one).
    """
    require_positive("sigma", sigma)
    require_sample_rate(sample_rate)
    require_steps(steps)
    gaussian = dp_accounting.GaussianDpEvent(sigma)
    if sampler == "poisson":
        return poisson_sampled(gaussian, sample_rate, steps)
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; known: {', '.join(SAMPLERS)}")
    if dataset_size is None or dataset_size < 1:
        raise ValueError(f"a {sampler} sampler needs dataset_size >= 1, got {dataset_size}")
    replace_one = dp_accounting.GaussianDpEvent(sigma / 2)
    if sampler == "fixed":
        return sampled_without_replacement(
            replace_one, dataset_size, fixed_batch_size(sample_rate, dataset_size), steps)
    return dp_accounting.SelfComposedDpEvent(replace_one, participations(sample_rate, steps, dataset_size))


@dataclasses.dataclass(frozen=True)
class DpsgdEvents:
    """A hashable family sigma -> DpEvent, so calibrations can be cached across a sweep.

    `sigma_scale` maps the noise multiplier a mechanism is configured with to the one it effectively
    adds (e.g. GReDP's complex noise is DP-SGD at sigma / sqrt(2)).
    """

    sample_rate: float
    steps: int
    sampler: str = "poisson"
    dataset_size: int | None = None
    sigma_scale: float = 1.0

    def __call__(self, sigma: float) -> dp_accounting.DpEvent:
        return dpsgd_event(sigma * self.sigma_scale, self.sample_rate, self.steps,
                           sampler=self.sampler, dataset_size=self.dataset_size)
