"""DpEvent builders for the noise our mechanisms add (one name per sampling scheme)."""

from __future__ import annotations

import dataclasses

import dp_accounting


def dpsgd_event(
    sigma: float, sample_rate: float, steps: int, *, sampler: str = "poisson",
    dataset_size: int | None = None,
) -> dp_accounting.DpEvent:
    """T compositions of a subsampled Gaussian with noise multiplier `sigma` (sensitivity 1).

    `sampler="poisson"`: each example joins a batch independently with probability `sample_rate`
    (add/remove adjacency). `"fixed"`/`"shuffle"`: batches of exactly `round(q N)` examples drawn
    without replacement (replace-one adjacency, as dp-accounting defines it); needs `dataset_size`.
    """
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    gaussian = dp_accounting.GaussianDpEvent(sigma)
    if sampler == "poisson":
        step = gaussian if sample_rate == 1 else dp_accounting.PoissonSampledDpEvent(sample_rate, gaussian)
    elif sampler in ("fixed", "shuffle"):
        if dataset_size is None:
            raise ValueError("a fixed-size sampler needs dataset_size")
        batch = max(1, round(sample_rate * dataset_size))
        step = dp_accounting.SampledWithoutReplacementDpEvent(dataset_size, batch, gaussian)
    else:
        raise ValueError(f"unknown sampler {sampler!r}; known: poisson, fixed, shuffle")
    return dp_accounting.SelfComposedDpEvent(step, steps)


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
