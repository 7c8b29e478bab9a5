"""Correlated noise: the noise of step t is a fixed linear combination of independent Gaussian draws.

The matrix-factorization view (Denisov et al. 2022; Choquette-Choo et al., ICML 2023, arXiv 2211.06530): the
model after t steps of SGD reads the prefix sums A g of the gradients (A lower-triangular ones). Factor
A = B C; the mechanism releases C g + z (z i.i.d. N(0, s^2)) and the model reads B (C g + z) = A g + B z. In
training this is: add the noise w = C^-1 z to the gradient sums, step by step. Everything the run releases is
post-processing of C g + z, so the run is ONE Gaussian mechanism with L2 sensitivity

    sens(C, Pi) = max over admissible participation patterns pi of || sum_{j in pi} C[:, j] u_j ||,  |u_j| <= 1,

bounded by sqrt(max_pi sum_{i, j in pi} |(C^T C)_ij|), with equality when C^T C >= 0 entrywise (every strategy
here: the worst case puts the same unit vector in every participation). With one participation it is the
largest column norm; with b-min-separated participations and a banded C of at most b bands the columns do
not overlap and it is sqrt(sum of the columns' squared norms). The certified event is
`GaussianDpEvent(s / (clip_sensitivity * sens))` for the whole run, composed by PLD; the participation schema
(`mechanisms.parts.participation`) is the sampler's (`fixed-order`), so the accounted process is the executed one.

Strategies (each streams its noise: no T x T matrix is ever materialised in training):

- `BandedToeplitz(c_0, ..., c_{b-1})`: C[i, j] = c_{i-j} for 0 <= i - j < b. Streamed by the recurrence
  w_t = (z_t - sum_{k=1}^{b-1} c_k w_{t-k}) / c_0 (i.e. C w = z): a ring buffer of the last b - 1 noises,
  memory O(bands x parameters). `square_root(b)`: Kalinin & Lampert's closed-form banded square root
  (NeurIPS 2024, arXiv 2405.13763): c_k = binom(2k, k) / 4^k, the coefficients of (1 - x)^(-1/2), truncated to
  b bands. b = T is the full Toeplitz square root of A; b = 1 is DP-SGD's identity.
- `RestartedTree(leaves)`: DP-FTRL's binary tree aggregation (Kairouz et al., ICML 2021, arXiv 2103.00039),
  restarted every `leaves` steps (one epoch). C is the node-incidence matrix of each tree (a node is a dyadic
  interval of leaves inside the tree): a leaf lies in floor(log2 P) + 1 nodes at most (leaf 0 in exactly as
  many), the height tensorflow_privacy's `compute_rdp_tree_restart` uses. The prefix-sum noise at step t is the
  sum of the node estimates of [0, t]'s dyadic decomposition; with `honaker` each node's estimate is the
  variance-optimal mix of its own draw and its children's estimates (Honaker 2015, the "efficient" tree of
  tensorflow_privacy), which releases nothing more. Streamed with a stack of the decomposition's nodes:
  memory O(log P x parameters).

The part declares its correlation (`correlation`, `noise_matrix`, `covariance`, `whiten`), so checks that expect
independent noise can decorrelate residuals with the known strategy before testing them.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import scipy.linalg
import torch

from mechanisms.parts.clipping import Clipping
from mechanisms.parts.noise_addition import NoiseMap, RunNoise, RunStream, gaussian
from mechanisms.parts.participation import Participation

if TYPE_CHECKING:
    import torch
    from dp_accounting import NeighboringRelation as NeighborRel

Draw = Callable[["torch.Tensor"], "torch.Tensor"]  # like -> a fresh N(0, 1) tensor shaped like it


def square_root_coefficients(bands: int) -> tuple[float, ...]:
    """The first `bands` coefficients of (1 - x)^(-1/2): r_0 = 1, r_k = r_{k-1} (2k - 1) / (2k) = binom(2k, k) / 4^k
    (the Toeplitz square root of the prefix-sum matrix; Kalinin & Lampert's banded square root keeps `bands`)."""
    if isinstance(bands, bool) or not isinstance(bands, int) or bands < 1:
        raise ValueError(f"bands must be an integer >= 1, got {bands!r}")
    out = [1.0]
    for k in range(1, bands):
        out.append(out[-1] * (2 * k - 1) / (2 * k))
    return tuple(out)


class Strategy(abc.ABC):
    """A strategy matrix C (the factor the mechanism releases C g + z of), streamed step by step."""

    name: ClassVar[str]

    @abc.abstractmethod
    def gram(self, p: int, q: int, steps: int) -> float:
        """(C^T C)[p, q] for a run of `steps` steps: the overlap of the columns of steps p and q."""

    @abc.abstractmethod
    def stream(self, draw: Draw) -> StrategyStream:
        """A fresh stream of the per-step noise w = C^-1 z (in units of the draws' std)."""

    def pattern_sensitivity_squared(self, pattern: Sequence[int], steps: int) -> float:
        """sum_{p, q in pattern} |(C^T C)[p, q]|: the squared sensitivity of one participation pattern (exact when
        C^T C >= 0, an upper bound otherwise)."""
        return float(sum(abs(self.gram(p, q, steps)) for p in pattern for q in pattern))

    def sensitivity(self, participation: Participation) -> float:
        """The L2 sensitivity of C g for one example under `participation`, per unit of per-example bound: the
        max over admissible patterns (the cyclic schema has `min_separation` of them)."""
        return math.sqrt(max(self.pattern_sensitivity_squared(p, participation.steps)
                             for p in participation.patterns()))

    def noise_matrix(self, steps: int) -> np.ndarray:
        """M with the per-step noise of `steps` steps = M z (z the i.i.d. draws, in order): read off the stream
        itself by drawing basis vectors, so it is the law of what training adds (for audits and whitening)."""
        width = 2 * steps + 1  # draws: at most one per leaf and one per tree node
        counter = [0]

        def basis(like: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(like.shape[0], width, dtype=torch.float64)
            out[:, counter[0]] = 1.0
            counter[0] += 1
            return out

        stream = self.stream(basis)
        rows = [stream.next(torch.empty(1, width, dtype=torch.float64))[0].numpy() for _ in range(steps)]
        return np.stack(rows)[:, :counter[0]]

    def describe(self) -> dict[str, Any]:
        return {"strategy": self.name, **dataclasses.asdict(self)}  # type: ignore[call-overload]


class StrategyStream(abc.ABC):
    """The running state of a strategy's noise over one run (one per trainer)."""

    steps_taken: int = 0

    @abc.abstractmethod
    def next(self, like: torch.Tensor) -> torch.Tensor:
        """Step `steps_taken`'s noise, shaped like `like` (rows x coordinates), in units of the draws' std."""


@dataclasses.dataclass(frozen=True)
class BandedToeplitz(Strategy):
    """C[i, j] = coefficients[i - j] for 0 <= i - j < b (b = len(coefficients)); c_0 > 0."""

    coefficients: tuple[float, ...]
    name: ClassVar[str] = "banded-toeplitz"

    def __post_init__(self) -> None:
        if not self.coefficients or not self.coefficients[0] > 0:
            raise ValueError(f"a banded Toeplitz strategy needs c_0 > 0, got {self.coefficients}")
        if any(not math.isfinite(c) for c in self.coefficients):
            raise ValueError(f"coefficients must be finite, got {self.coefficients}")

    @classmethod
    def square_root(cls, bands: int) -> BandedToeplitz:
        """Kalinin & Lampert's banded square root (BSR) with `bands` bands."""
        return cls(square_root_coefficients(bands))

    @property
    def bands(self) -> int:
        return len(self.coefficients)

    def matrix(self, steps: int) -> np.ndarray:
        """C as a dense T x T matrix (tests and small audits only)."""
        out = np.zeros((steps, steps))
        for k, c in enumerate(self.coefficients[:steps]):
            out += c * np.eye(steps, k=-k)
        return out

    def gram(self, p: int, q: int, steps: int) -> float:
        p, q = min(p, q), max(p, q)
        c = self.coefficients
        return float(sum(c[k] * c[k - (q - p)] for k in range(q - p, min(self.bands, steps - p))))

    def sensitivity(self, participation: Participation) -> float:
        """Exact for the cyclic schema (the max over its offsets, overlapping columns included). For min-separation:
        one participation, the first column's norm; with non-negative, non-increasing coefficients (the square
        root's) the worst pattern is k participations exactly b apart from step 0 (Kalinin & Lampert 2024,
        Theorem 2; with b <= separation its columns do not overlap, Choquette-Choo et al. 2023); other
        coefficients are brute-forced (small runs only)."""
        steps, sep = participation.steps, participation.min_separation
        if participation.schema == "cyclic":
            norms = np.array([self.gram(j, j, steps) for j in range(steps)])
            worst = 0.0
            for pattern in participation.patterns():
                total = float(norms[list(pattern)].sum())
                if self.bands > sep:  # overlapping columns: the cross terms too
                    total += sum(2 * abs(self.gram(p, q, steps)) for i, p in enumerate(pattern)
                                 for q in pattern[i + 1:] if q - p < self.bands)
                worst = max(worst, total)
            return math.sqrt(worst)
        if participation.single:
            return math.sqrt(self.gram(0, 0, steps))
        c = self.coefficients
        if all(x >= 0 for x in c) and all(a >= b for a, b in zip(c, c[1:], strict=False)):
            pattern = tuple(range(0, steps, sep))[: participation.max_participations]
            return math.sqrt(self.pattern_sensitivity_squared(pattern, steps))
        if steps > 24:
            raise ValueError(f"min-separation sensitivity of coefficients {c} that are not non-negative and "
                             "non-increasing is only computed by brute force, for runs of at most 24 steps")
        return super().sensitivity(participation)

    def stream(self, draw: Draw) -> ToeplitzStream:
        return ToeplitzStream(self.coefficients, draw)


class ToeplitzStream(StrategyStream):
    """w_t = (z_t - sum_{k=1}^{b-1} c_k w_{t-k}) / c_0, with the last b - 1 noises in a ring buffer."""

    def __init__(self, coefficients: tuple[float, ...], draw: Draw) -> None:
        self.coefficients, self.draw = coefficients, draw
        self.history: list[torch.Tensor] = []  # the last b - 1 noises, most recent first
        self.steps_taken = 0

    def next(self, like: torch.Tensor) -> torch.Tensor:
        c = self.coefficients
        w = self.draw(like)
        for k, past in enumerate(self.history, start=1):
            w.sub_(past, alpha=c[k])
        if c[0] != 1.0:
            w.div_(c[0])
        if len(c) > 1:
            self.history = [w, *self.history[: len(c) - 2]]
        self.steps_taken += 1
        return w


def honaker_weights(levels: int) -> tuple[float, ...]:
    """Weight of a node's own draw in its estimate, per level (level 0, a leaf: 1): with its children's
    estimates of variance v_{l-1} each (v_0 = 1), the inverse-variance mix weights its draw 2v / (1 + 2v) and
    leaves variance v_l = 2 v_{l-1} / (1 + 2 v_{l-1}) = 2^l / (2^(l+1) - 1)."""
    weights, v = [1.0], 1.0
    for _ in range(1, levels):
        weights.append(2 * v / (1 + 2 * v))
        v = weights[-1]
    return tuple(weights)


@dataclasses.dataclass(frozen=True)
class RestartedTree(Strategy):
    """Binary-tree aggregation over each block of `leaves` steps (an epoch), restarted after it."""

    leaves: int
    honaker: bool = True
    name: ClassVar[str] = "restarted-tree"

    def __post_init__(self) -> None:
        if isinstance(self.leaves, bool) or not isinstance(self.leaves, int) or self.leaves < 1:
            raise ValueError(f"leaves must be an integer >= 1, got {self.leaves!r}")

    @property
    def height(self) -> int:
        """Levels of a tree over P leaves: floor(log2 P) + 1 (the most nodes one leaf lies in)."""
        return self.leaves.bit_length()

    def gram(self, p: int, q: int, steps: int) -> float:
        """How many nodes hold both leaves: none across trees; in one tree, the levels l whose node over p's
        dyadic interval also holds q and lies inside the tree (its last leaf is before the tree's end)."""
        tree, size = p // self.leaves, min(self.leaves, steps - (p // self.leaves) * self.leaves)
        if q // self.leaves != tree:
            return 0.0
        i, j = p - tree * self.leaves, q - tree * self.leaves
        return float(sum(1 for level in range(size.bit_length())
                         if i >> level == j >> level and ((i >> level) + 1) << level <= size))

    def stream(self, draw: Draw) -> TreeStream:
        return TreeStream(self.leaves, honaker_weights(self.height) if self.honaker else (1.0,) * self.height, draw)


class TreeStream(StrategyStream):
    """The stack of the nodes of [0, t]'s dyadic decomposition (a binary counter); the step's noise is the
    change of the prefix-sum noise (the sum of their estimates)."""

    def __init__(self, leaves: int, weights: tuple[float, ...], draw: Draw) -> None:
        self.leaves, self.weights, self.draw = leaves, weights, draw
        self.stack: list[tuple[int, torch.Tensor]] = []
        self.prefix: torch.Tensor | None = None
        self.steps_taken = 0

    def next(self, like: torch.Tensor) -> torch.Tensor:
        if self.steps_taken % self.leaves == 0:  # a new tree
            self.stack, self.prefix = [], None
        self.stack.append((0, self.draw(like)))
        while len(self.stack) >= 2 and self.stack[-1][0] == self.stack[-2][0]:
            (level, right), (_, left) = self.stack.pop(), self.stack.pop()
            weight = self.weights[level + 1]
            estimate = self.draw(like)
            if weight != 1.0:  # Honaker: mix the node's draw with its children's estimates
                estimate.mul_(weight).add_(left.add_(right), alpha=1.0 - weight)
            self.stack.append((level + 1, estimate))
        prefix = self.stack[0][1].clone()
        for _, estimate in self.stack[1:]:
            prefix.add_(estimate)
        noise = prefix if self.prefix is None else prefix - self.prefix
        self.prefix = prefix
        self.steps_taken += 1
        return noise


@dataclasses.dataclass(frozen=True)
class CorrelatedNoise(RunNoise):
    """The noise of a matrix-factorization mechanism: step t adds s w_t, w = C^-1 z streamed by `strategy`
    (s = sigma * std_per_sigma); its privacy is one Gaussian over the whole run (a `RunNoise`) at multiplier
    s / (clip sensitivity * strategy sensitivity under `participation`), see the module docstring.

    Training keeps the state in a `NoiseStream` (`start`); `release` without a stream is the first step of a
    fresh one (w_0 = z_0 / c_0: one participation's release, which the one-step audit tests).
    """

    std_per_sigma: float
    strategy: BandedToeplitz | RestartedTree
    participation: Participation

    def sensitivity(self, clipper: Clipping, relation: NeighborRel) -> float:
        """Clip sensitivity (the relation's: x2 under replace-one) times the strategy's under the schema."""
        return (clipper.sensitivity(relation) * clipper.max_bound / clipper.bound
                * self.strategy.sensitivity(self.participation))

    def noise_multiplier(self, sigma: float, clipper: Clipping, relation: NeighborRel) -> float:
        return sigma * self.std_per_sigma / self.sensitivity(clipper, relation)

    def start(self) -> NoiseStream:
        """A fresh stream for one run's steps."""
        return NoiseStream(self)

    def release(self, sums: Sequence[torch.Tensor], sigma: float, generator: torch.Generator | None, *,
                secure: bool = False, noise_map: NoiseMap | None = None,
                scale: torch.Tensor | None = None) -> list[torch.Tensor]:
        return self.start().release(sums, sigma, generator, secure=secure, noise_map=noise_map, scale=scale)

    # ---- the declared correlation (for independence checks and audits) ------------------------------------

    @property
    def correlation(self) -> DeclaredCorrelation:
        """How the noise is correlated across steps (`name`, `whiten`): what the audits' noise checks whiten the
        residuals with (`mechanisms.auditing.noise_checks.Correlation`); independent noise parts have none."""
        return DeclaredCorrelation(self)

    def noise_matrix(self, steps: int) -> np.ndarray:
        """M with the first `steps` steps' noise = s M z, z i.i.d. N(0, 1) (per coordinate)."""
        return self.strategy.noise_matrix(steps)

    def covariance(self, steps: int) -> np.ndarray:
        """The per-step noise's covariance across steps, per coordinate, in units of s^2: M M^T."""
        m = self.noise_matrix(steps)
        return m @ m.T

    def whiten(self, residuals: np.ndarray) -> np.ndarray:
        """Residuals (steps first: T x ...) of the noise, mapped to i.i.d. draws of the same std: L^-1 r with
        L L^T the declared covariance (for a banded C this is C r exactly)."""
        r = np.asarray(residuals, dtype=np.float64)
        steps = r.shape[0]
        flat = r.reshape(steps, -1)
        if isinstance(self.strategy, BandedToeplitz):  # (C r)_t = sum_k c_k r_{t-k}: O(T b), no T x T matrix
            out = np.zeros_like(flat)
            for k, c in enumerate(self.strategy.coefficients[:steps]):
                out[k:] += c * flat[: steps - k]
            return out.reshape(r.shape)
        # a restarted tree: independent blocks of `leaves` steps, each with the same (causal) covariance
        block = min(self.strategy.leaves, steps)
        chol = np.linalg.cholesky(self.covariance(block))
        out = np.empty_like(flat)
        for start in range(0, steps, block):
            n = min(block, steps - start)
            out[start:start + n] = scipy.linalg.solve_triangular(chol[:n, :n], flat[start:start + n], lower=True)
        return out.reshape(r.shape)

    def describe(self) -> dict[str, object]:
        return {"noise": type(self).__name__, "std_per_sigma": self.std_per_sigma, **self.strategy.describe(),
                "participation": self.participation.describe()}


@dataclasses.dataclass(frozen=True)
class DeclaredCorrelation:
    """A correlated-noise part's correlation across steps, named, with the whitening its known strategy gives."""

    noise: CorrelatedNoise

    @property
    def name(self) -> str:
        fields = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(self.noise.strategy).items())  # type: ignore[call-overload]
        return f"{self.noise.strategy.name}({fields})"

    def whiten(self, residuals: np.ndarray) -> np.ndarray:
        return self.noise.whiten(residuals)


class NoiseStream(RunStream):
    """One run's state of a `CorrelatedNoise`: every step's noise drawn as one flat buffer (rows x all
    coordinates) and viewed per tensor, as `gaussian_like`."""

    def __init__(self, noise: CorrelatedNoise) -> None:
        self.noise = noise
        self.secure = False
        self.generator: torch.Generator | None = None
        self.strategy = noise.strategy.stream(self._draw)

    def _draw(self, like: torch.Tensor) -> torch.Tensor:
        return gaussian(like, 1.0, self.generator, self.secure)

    def step_objects(self) -> tuple[object, ...]:
        return self, self.strategy

    def release(self, sums: Sequence[torch.Tensor], sigma: float, generator: torch.Generator | None, *,
                secure: bool = False, noise_map: NoiseMap | None = None,
                scale: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The step's privatised sums: s w_t on every coordinate, then `noise_map`, plus the sums."""
        if not sums:
            return []
        self.generator, self.secure = generator, secure
        first = sums[0]
        rows = first.shape[0]
        sizes = [s[0].numel() for s in sums]
        flat = self.strategy.next(torch.empty(rows, sum(sizes), dtype=first.dtype, device=first.device))
        flat = flat * (sigma * self.noise.std_per_sigma)  # a copy: the stream keeps its own noise
        out, offset = [], 0
        for i, (s, size) in enumerate(zip(sums, sizes, strict=True)):
            noise = flat.narrow(1, offset, size).view(s.shape)
            offset += size
            if noise_map is not None:
                noise = noise_map(i, noise)
            out.append(noise)
        torch._foreach_add_(out, list(sums))
        return out


STRATEGIES = {s.name: s for s in (BandedToeplitz, RestartedTree)}

__all__ = ["STRATEGIES", "BandedToeplitz", "CorrelatedNoise", "DeclaredCorrelation", "NoiseStream", "RestartedTree",
           "Strategy", "StrategyStream", "TreeStream", "ToeplitzStream", "honaker_weights", "square_root_coefficients"]
