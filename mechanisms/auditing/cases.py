"""Neighbouring inputs for a one-step audit: a batch sum without and with a worst-case canary.

Side A rows hold `base`, the clipped-gradient sum of a batch; side B rows hold `base + canary`, the
same batch plus one example whose clipped gradient is `canary` (norm = the clip C). A case also
names its test statistic; the default, the projection of the release on the canary direction, is
the likelihood-ratio test for any Gaussian-noise mechanism, so it is optimal for DP-SGD-like steps.
Mechanism-specific worst cases (arXiv 2409.11663; docs/mechanisms.md, seed_000_shuffling.md 4.3) are
further `AuditCase`s returned by the mechanism's `audit_cases` hook (see `hooks.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

Statistic = Callable[[np.ndarray], np.ndarray]  # released rows (n, dim) -> scores (n,), high = canary


@dataclasses.dataclass(frozen=True)
class AuditCase:
    """One neighbouring pair and the statistic that tells them apart."""

    name: str
    canary: np.ndarray  # (dim,): the worst-case example's clipped gradient (and other releases), norm = clip
    base: np.ndarray  # (dim,): side A's clipped batch sum
    statistic: Statistic | None = None  # None: projection on the canary direction
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # extra privatize_step options
    note: str = ""
    # A step with several releases (`Parts.releases`): each block's width in the row, and each coordinate's
    # weight, the inverse of its noise variance, so that the projection is still the likelihood-ratio test.
    layout: tuple[int, ...] | None = None
    weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        canary = np.asarray(self.canary, dtype=np.float64).ravel()
        base = np.asarray(self.base, dtype=np.float64).ravel()
        if canary.shape != base.shape:
            raise ValueError(f"canary {canary.shape} and base {base.shape} must have one shape")
        if not np.linalg.norm(canary) > 0:
            raise ValueError("the canary must be a non-zero vector")
        object.__setattr__(self, "canary", canary)
        object.__setattr__(self, "base", base)
        if self.weights is not None:
            weights = np.asarray(self.weights, dtype=np.float64).ravel()
            if weights.shape != canary.shape or not (weights > 0).all():
                raise ValueError("weights must be positive, one per coordinate")
            object.__setattr__(self, "weights", weights)
        if self.layout is not None and sum(self.layout) != canary.size:
            raise ValueError(f"layout {self.layout} does not cover the {canary.size} coordinates")

    @property
    def dim(self) -> int:
        return self.canary.size

    @property
    def direction(self) -> np.ndarray:
        return self.canary / np.linalg.norm(self.canary)

    @property
    def projection(self) -> np.ndarray:
        """The vector the default statistic projects on: the canary, each coordinate weighted by the inverse
        of its noise variance (the likelihood-ratio test between the two sides' Gaussian releases)."""
        v = self.canary if self.weights is None else self.canary * self.weights
        return v / np.linalg.norm(v)

    def score(self, released: np.ndarray) -> np.ndarray:
        """Scores of released rows: the case's statistic, or the projection on the canary minus base's."""
        if self.statistic is not None:
            return np.asarray(self.statistic(released), dtype=np.float64).ravel()
        u = self.projection
        support = np.flatnonzero(u)
        released = np.asarray(released, dtype=np.float64)
        if support.size * 8 < u.size:  # sparse canary (Dirac): read its columns only
            return released[:, support] @ u[support] - float(self.base[support] @ u[support])
        return released @ u - float(self.base @ u)

    def support_layout(self, columns: np.ndarray) -> tuple[int, ...] | None:
        """The release layout of the row restricted to `columns` (for the support path)."""
        if self.layout is None:
            return None
        ends = np.cumsum(self.layout)
        starts = ends - np.asarray(self.layout)
        return tuple(int(((columns >= a) & (columns < b)).sum()) for a, b in zip(starts, ends, strict=True))


def random_batch_sum(dim: int, clip: float, rng: np.random.Generator, batch: int = 8) -> np.ndarray:
    """The clipped sum of `batch` random gradients of norm `clip`: a realistic, fixed side A."""
    g = rng.standard_normal((batch, dim))
    g *= clip / np.linalg.norm(g, axis=1, keepdims=True)
    return g.sum(axis=0)


def dirac_case(dim: int, clip: float, rng: np.random.Generator, batch: int = 8,
               block_bounds: tuple[tuple[int, float], ...] | None = None) -> AuditCase:
    """Nasr et al.'s Dirac canary: C at one random coordinate, 0 elsewhere, over a random batch sum.

    Every mechanism gets this case; for Gaussian noise every direction is equally bad, so a Dirac
    is a worst case and its projection statistic reads one coordinate. `block_bounds` ((size, bound) per
    parameter tensor, for per-layer clipping) puts one spike of each tensor's bound in each tensor instead:
    a gradient that per-layer clipping can produce, at the full bound sqrt(sum of bounds^2).
    """
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    canary = np.zeros(dim)
    if block_bounds is None:
        canary[int(rng.integers(dim))] = clip
        note = f"C at one coordinate over a batch of {batch} clipped gradients"
    else:
        if sum(size for size, _ in block_bounds) != dim:
            raise ValueError(f"the tensor blocks cover {sum(size for size, _ in block_bounds)} of {dim} coordinates")
        start = 0
        for size, bound in block_bounds:
            canary[start + int(rng.integers(size))] = bound
            start += size
        note = f"each tensor's bound at one of its coordinates over a batch of {batch} clipped gradients"
    return AuditCase("dirac", canary, random_batch_sum(dim, float(np.linalg.norm(canary)), rng, batch), note=note)
