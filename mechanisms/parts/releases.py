"""Releases: every statistic a private step publishes about its sample, each with its sensitivity and noise.

A private step of DP-SGD releases one thing, the clipped gradient sum with Gaussian noise
(`GradientSum`: the plan's clipper and noise part). A mechanism may publish more on the same sample, such
as adaptive clipping's noised count of unclipped examples (Andrew, Thakkar, McMahan, Ramaswamy 2021,
arXiv 1905.03871). Each such statistic is a `Release`: a sum over the batch of a per-example contribution
whose L2 norm is bounded (hence its `sensitivity` under each neighbouring relation), plus Gaussian noise of
a stated std. The trainer computes, noises and hands out every release of a step (`Released`); a
mechanism's state is updated from those noised values only, which is post-processing.

Why Gaussian releases on one sample combine exactly: the step's output is (S_r + N(0, s_r^2 I))_r and one
example moves each S_r by at most Delta_r, so the privacy loss is that of ONE Gaussian at sensitivity
sqrt(sum_r (Delta_r / s_r)^2) and unit noise, i.e. noise multiplier z = (sum_r z_r^-2)^-1/2 with
z_r = s_r / Delta_r (Theorem 1 of Andrew et al. is the two-release case). Under Poisson sampling all
releases share the sample, so the step is `PoissonSampled(Gaussian(z))`; composing each release as its own
sampled event would treat the samples as independent and under-report epsilon, so privbench never does.

Only the release classes defined here (and the gradient sum of `mechanisms.parts.clipping` and
`noise_addition` parts) are privbench's: `owned` checks parts by exact type, so a plugin's own subclass,
whose code privbench has not verified, makes the plan `uncertified` with the reason.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from mechanisms.parts.clipping import relation_factor

if TYPE_CHECKING:
    import torch
    from dp_accounting import NeighboringRelation as NeighborRel


@dataclasses.dataclass(frozen=True)
class ExampleView:
    """What a release may read of one step's batch: each example's gradient norm before clipping, the clip
    bound in force, and each row's weight (1 for an example, 0 for a padding row that stands for nothing)."""

    norms: torch.Tensor  # (B,)
    bound: torch.Tensor | float
    weights: torch.Tensor | None = None  # (B,); None: every row is an example

    def unclipped(self) -> torch.Tensor:
        """1 where clipping left the example unchanged, by Opacus' rule min(1, C / (|g| + 1e-6)) == 1."""
        return (self.bound / (self.norms + 1e-6) >= 1).to(self.norms.dtype)


class Release(abc.ABC):
    """One statistic released on a step's sample besides the gradient sum: sum_i f(x_i) + N(0, std^2).

    Guarantee a subclass states and privbench's tests check: `contributions` returns per-example values
    whose L2 norm is at most `sensitivity(ADD_OR_REMOVE_ONE)`, and any two examples' values are at most
    `sensitivity(REPLACE_ONE)` apart; `release` adds N(0, std^2) to every coordinate, nothing else.
    """

    name: ClassVar[str]  # its key in `Released.values` and in the audit's release layout
    width: ClassVar[int] = 1  # coordinates of the released vector

    @abc.abstractmethod
    def sensitivity(self, relation: NeighborRel) -> float:
        """L2 distance between the sums of two neighbouring batches."""

    @abc.abstractmethod
    def noise_std(self, sigma: float) -> float:
        """The std of the noise on each coordinate when the gradient's noise multiplier is `sigma`."""

    def noise_multiplier(self, sigma: float, relation: NeighborRel) -> float:
        """The Gaussian event's multiplier of this release alone: std over sensitivity (0: unprotected)."""
        return self.noise_std(sigma) / self.sensitivity(relation)

    @abc.abstractmethod
    def contributions(self, view: ExampleView) -> torch.Tensor:
        """Each example's contribution (B, width), zero on padding rows."""

    def release(self, view: ExampleView, sigma: float, generator: torch.Generator | None, *,
                secure: bool = False) -> torch.Tensor:
        """The noised sum (width,): the statistic the step publishes."""
        return self.add_noise(self.contributions(view).sum(0), sigma, generator, secure=secure)

    def add_noise(self, total: torch.Tensor, sigma: float, generator: torch.Generator | None, *,
                  secure: bool = False) -> torch.Tensor:
        """`total` (any shape: one release, or rows of independent ones for the audit) plus the noise."""
        from mechanisms.parts.noise_addition import gaussian

        return total + gaussian(total, self.noise_std(sigma), generator, secure)

    def describe(self) -> dict[str, Any]:
        return {"release": self.name, "kind": type(self).__name__, **dataclasses.asdict(self)}  # type: ignore[call-overload]


@dataclasses.dataclass(frozen=True)
class UnclippedCount(Release):
    """How many of the step's examples clipping left unchanged, centred: sum_i (b_i - 1/2) + N(0, std^2).

    b_i is 1 when example i's gradient norm is within the bound (Opacus' rule, `ExampleView.unclipped`).
    Centring makes one example move the sum by 1/2 when it is added or removed and by 1 when it is replaced,
    half of what the plain count b_i would; a reader recovers the count as released + B / 2 with the
    expected batch size B (the realised size is private under Poisson sampling). `std` is in counts and does
    not scale with sigma (Andrew et al.'s sigma_b).
    """

    std: float
    name: ClassVar[str] = "unclipped"

    def __post_init__(self) -> None:
        if not (self.std > 0 and math.isfinite(self.std)):
            raise ValueError(f"the unclipped count's noise std must be a positive finite number, got {self.std}")

    def sensitivity(self, relation: NeighborRel) -> float:
        return 0.5 * relation_factor(relation)

    def noise_std(self, sigma: float) -> float:
        return self.std

    def contributions(self, view: ExampleView) -> torch.Tensor:
        values = view.unclipped() - 0.5
        if view.weights is not None:
            values = values * view.weights
        return values.unsqueeze(1)


@dataclasses.dataclass(frozen=True)
class Released:
    """What one step published: the noised gradient sums (one tensor per trainable parameter, before any
    scaling by the batch size) and every other release's noised value by name. The only input a mechanism's
    state update gets: what it computes from these is post-processing."""

    gradient: tuple[torch.Tensor, ...]
    values: Mapping[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.values[name]


# The release classes privbench ships (beside the clippers and noise parts of their own modules).
RELEASES: dict[str, type[Release]] = {r.name: r for r in (UnclippedCount,)}

__all__ = ["RELEASES", "ExampleView", "Release", "Released", "UnclippedCount"]
