"""Per-example clipping: the bound on one example's contribution, and the sensitivity it implies.

A clipper states its guarantee (`bound`: every example's clipped gradient has L2 norm <= bound) and the
L2 sensitivity of the clipped SUM under each neighbouring relation: adding or removing an example moves
the sum by at most `bound`; replacing one moves it by at most `2 * bound` (the old and the new example's
clipped gradients may point in opposite directions). The clipping itself runs in the per-sample-gradient
engine (Opacus' optimizers, `clipping="flat"` or `"per_layer"`); `clip_and_sum` is the same rule on
explicit per-example gradients, for tests and audits.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # torch and dp-accounting load when a clipper clips or states a sensitivity, not on import
    import torch
    from dp_accounting import NeighboringRelation as NeighborRel


def relation_factor(relation: NeighborRel) -> float:
    """How far apart two neighbouring sums can be, in units of the per-example bound."""
    from dp_accounting import NeighboringRelation as NeighborRel  # lazy: heavy (dp_accounting)

    if relation == NeighborRel.ADD_OR_REMOVE_ONE:
        return 1.0
    if relation == NeighborRel.REPLACE_ONE:
        return 2.0
    raise ValueError(f"unsupported neighbouring relation {relation}")


class Clipping(abc.ABC):
    name: ClassVar[str]  # what a grid writes (`mechanism_options: {dpsgd: {clipping: per-layer}}`)
    opacus_clipping: ClassVar[str]  # the same rule as the `clipping` argument of Opacus' optimizers

    @property
    @abc.abstractmethod
    def bound(self) -> float:
        """L2 bound on one example's clipped gradient (all trainable tensors together)."""

    @property
    @abc.abstractmethod
    def max_grad_norm(self) -> float | list[float]:
        """Opacus' `max_grad_norm`: one float (flat) or one per parameter tensor (per-layer)."""

    @property
    def max_bound(self) -> float:
        """The largest bound the clipper can apply in any step (= `bound` unless the state moves it)."""
        return self.bound

    @property
    def min_bound(self) -> float:
        """The smallest bound the clipper may apply (= `bound` unless the state moves it): with `max_bound`, the
        declared range the trainer holds the bound in force to (a state outside it is clamped, and recorded)."""
        return self.bound

    #: The state entry holding the bound in force (None: the bound is fixed). The trainer applies it each step.
    state_key: ClassVar[str | None] = None

    def sensitivity(self, relation: NeighborRel) -> float:
        """L2 sensitivity of the sum of clipped gradients under `relation`, at the declared `bound`."""
        return relation_factor(relation) * self.bound

    @abc.abstractmethod
    def clip_and_sum(self, per_example: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Clip each example's gradient (tensors with a leading batch dimension) and sum over the batch."""


@dataclasses.dataclass(frozen=True)
class FlatClipping(Clipping):
    """One norm over all trainable tensors of an example, scaled down to `clip` when above it."""

    clip: float
    name: ClassVar[str] = "flat"
    opacus_clipping: ClassVar[str] = "flat"

    def __post_init__(self) -> None:
        if not (self.clip > 0 and math.isfinite(self.clip)):
            raise ValueError(f"clip must be a positive finite number, got {self.clip}")

    @property
    def bound(self) -> float:
        return self.clip

    @property
    def max_grad_norm(self) -> float:
        return self.clip

    def clip_and_sum(self, per_example: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        import torch  # lazy: heavy (torch)

        norms = torch.stack([g.reshape(len(g), -1).norm(dim=1) for g in per_example]).norm(dim=0)
        factor = (self.clip / (norms + 1e-6)).clamp(max=1.0)  # Opacus' rule, epsilon included
        return [torch.einsum("i,i...->...", factor, g) for g in per_example]


@dataclasses.dataclass(frozen=True)
class PerLayerClipping(Clipping):
    """Each trainable tensor clipped to its own bound; the example's bound is the norm of the bounds."""

    clips: tuple[float, ...]
    name: ClassVar[str] = "per-layer"
    opacus_clipping: ClassVar[str] = "per_layer"

    def __post_init__(self) -> None:
        if not self.clips or not all(c > 0 and math.isfinite(c) for c in self.clips):
            raise ValueError(f"per-layer clips must be positive finite numbers, got {self.clips}")

    @classmethod
    def splitting(cls, clip: float, n_tensors: int) -> PerLayerClipping:
        """`clip` shared equally (in squares) by `n_tensors` tensors: the example's bound stays `clip`."""
        return cls((clip / math.sqrt(n_tensors),) * n_tensors)

    @property
    def bound(self) -> float:
        return math.sqrt(sum(c * c for c in self.clips))

    @property
    def max_grad_norm(self) -> list[float]:
        return list(self.clips)

    def clip_and_sum(self, per_example: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if len(per_example) != len(self.clips):
            raise ValueError(f"{len(per_example)} tensors for {len(self.clips)} per-layer clips")
        import torch  # lazy: heavy (torch)

        out = []
        for g, c in zip(per_example, self.clips, strict=True):
            factor = (c / (g.reshape(len(g), -1).norm(dim=1) + 1e-6)).clamp(max=1.0)
            out.append(torch.einsum("i,i...->...", factor, g))
        return out


@dataclasses.dataclass(frozen=True)
class AdaptiveClipping(Clipping):
    """Flat clipping at a bound the mechanism's state sets before each step (adaptive clipping), kept within
    [minimum, maximum] by the state update. The declared `bound` is the initial one.

    Guarantee: in every step each example's clipped gradient has norm <= the bound in force <= `maximum`. A
    noise part that follows the bound (`GaussianNoise(follows_bound=True)`: std proportional to it) keeps one
    noise multiplier in every step, whatever the state does; absolute noise is accounted at `maximum`.
    """

    initial: float
    minimum: float
    maximum: float
    name: ClassVar[str] = "adaptive"
    opacus_clipping: ClassVar[str] = "flat"
    state_key: ClassVar[str | None] = "clip"

    def __post_init__(self) -> None:
        for field in ("initial", "minimum", "maximum"):
            value = getattr(self, field)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"adaptive clipping's {field} must be a positive finite number, got {value}")
        if not self.minimum <= self.initial <= self.maximum:
            raise ValueError(f"adaptive clipping needs minimum <= initial <= maximum, got {self.minimum}, "
                             f"{self.initial}, {self.maximum}")

    @property
    def bound(self) -> float:
        return self.initial

    @property
    def max_bound(self) -> float:
        return self.maximum

    @property
    def min_bound(self) -> float:
        return self.minimum

    @property
    def max_grad_norm(self) -> float:
        return self.initial

    def clip_and_sum(self, per_example: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return FlatClipping(self.initial).clip_and_sum(per_example)


# The clipping rules a mechanism option may name (grid name -> class); the per-sample-gradient engines
# (Opacus, mechanisms/clipping_engine) take the same rules under `opacus_clipping`.
CLIPPINGS: dict[str, type[Clipping]] = {c.name: c for c in (FlatClipping, PerLayerClipping)}
# How the per-sample gradients are clipped: the book-keeping engine (mechanisms/clipping_engine) or an Opacus
# grad-sample mode (`mechanisms.framework.private_training` runs them; a grid's `train.grad_sample_mode` names one).
GRAD_SAMPLE_MODES = ("bk", "hooks", "ghost", "functorch", "ew")

__all__ = ["CLIPPINGS", "GRAD_SAMPLE_MODES", "AdaptiveClipping", "Clipping", "FlatClipping",
           "PerLayerClipping", "relation_factor"]
