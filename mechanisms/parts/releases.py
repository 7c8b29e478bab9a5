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

A `DatasetStatistic` is the other kind of release: made once, before training, on the whole training set
(a private standardisation's channel means, Tramer & Boneh 2021). It is its own Gaussian mechanism, composed
with the run's steps (`Parts.dp_event`), not folded into a step's sample.

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
from mechanisms.parts.noise_addition import gaussian

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


@dataclasses.dataclass(frozen=True)
class DatasetStatistic:
    """A statistic of the whole training set, released once before training: for each row r,
    sum_i clip(f_r(x_i), bounds[r]) + N(0, (noise_multiplier * bounds[r])^2 I), f_r(x_i) a per-example vector
    (a model supplies f, e.g. each channel's mean and mean square; privbench clips and noises it here).

    Guarantee (tested): each row's per-example vector is clipped to L2 norm `bounds[r]` by this class, so one
    example moves row r by at most bounds[r] (2 bounds[r] when replaced) whatever f computes per example; the
    rows' noise is independent. One example touches every row, so the release is ONE Gaussian of multiplier
    noise_multiplier / sqrt(R) under add/remove (the same combination as a step's releases), the exact value of
    R Gaussian events of `noise_multiplier` composed (what Tramer & Boneh's code accounts by RDP).
    What f must keep: row i of its output depends on example i alone (a mean over the batch would not).
    """

    name: str
    bounds: tuple[float, ...]  # one clip bound per row
    noise_multiplier: float

    def __post_init__(self) -> None:
        if not self.bounds or any(not (b > 0 and math.isfinite(b)) for b in self.bounds):
            raise ValueError(f"{self.name}: each row's clip bound must be a positive finite number, got {self.bounds}")
        if not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise ValueError(f"{self.name}: the noise multiplier must be a positive finite number, got "
                             f"{self.noise_multiplier}")

    def multiplier(self, relation: NeighborRel) -> float:
        """The release's one Gaussian multiplier in add/remove units: each row's std over its sensitivity
        under `relation`, combined over the rows."""
        return self.noise_multiplier / (relation_factor(relation) * math.sqrt(len(self.bounds)))

    def row_multipliers(self) -> tuple[float, ...]:
        """Each row as its own Gaussian event under add/remove (a papers' accountant composes them one by one)."""
        return (self.noise_multiplier,) * len(self.bounds)

    def release(self, contributions: torch.Tensor, generator: torch.Generator | None, *,
                secure: bool = False) -> torch.Tensor:
        """The noised sums (R, K) of per-example contributions (N, R, K), each example's row r clipped to
        bounds[r]. Summed in float64 (60,000 examples of float32 would lose the noise's last digits)."""
        import torch  # lazy: heavy (torch)

        values = contributions.to(torch.float64)
        if values.dim() != 3 or values.shape[1] != len(self.bounds):
            raise ValueError(f"{self.name}: contributions must be (examples, {len(self.bounds)}, width), got "
                             f"{tuple(values.shape)}")
        bounds = torch.tensor(self.bounds, dtype=torch.float64, device=values.device)
        norms = values.norm(dim=2)
        values = values * (bounds / (norms + 1e-12)).clamp(max=1.0).unsqueeze(2)
        total = values.sum(0)
        std = (self.noise_multiplier * bounds).unsqueeze(1)
        return total + gaussian(total, 1.0, generator, secure) * std

    def describe(self) -> dict[str, Any]:
        return {"statistic": self.name, "bounds": list(self.bounds), "noise_multiplier": self.noise_multiplier}


# The release classes privbench ships (beside the clippers and noise parts of their own modules).
RELEASES: dict[str, type[Release]] = {r.name: r for r in (UnclippedCount,)}

__all__ = ["RELEASES", "DatasetStatistic", "ExampleView", "Release", "Released", "UnclippedCount"]
