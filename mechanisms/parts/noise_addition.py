"""Noise addition: what is added to the sum of clipped gradients, and the Gaussian event it amounts to.

A noise part does two things, and both live here so that they cannot drift apart:
- `release(sums, sigma, generator)`: the code training runs (through `PrivateOptimizer.add_noise`) and
  the one-step auditor runs (through `Mechanism.privatize_step`): one tensor per parameter, each with a
  leading dimension of independent releases (1 in training);
- `noise_multiplier(sigma, clipper, relation)`: the multiplier of the isotropic Gaussian event that
  soundly describes one release, i.e. (smallest noise std in any direction) / (L2 sensitivity of what is
  noised) under the sampler's neighbouring relation. 0 means some direction gets no noise: no finite
  epsilon exists, and the plan certifies infinity.

A Gaussian with covariance Sigma >= s^2 I is the isotropic N(0, s^2 I) plus independent noise, i.e.
post-processing of it, so certifying with the smallest eigenvalue is sound (and exact when isotropic).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol

from mechanisms.parts.clipping import Clipping, PerLayerClipping, relation_factor

if TYPE_CHECKING:  # torch loads when noise is drawn, dp-accounting when a sensitivity is stated
    import numpy as np
    import torch
    from dp_accounting import NeighboringRelation as NeighborRel

    from mechanisms.parts.participation import Participation

NoiseMap = Callable[[int, "torch.Tensor"], "torch.Tensor"]  # (tensor index, noise) -> noise in the current frame


def gaussian(reference: torch.Tensor, std: float, generator: torch.Generator | None,
             secure: bool = False) -> torch.Tensor:
    """N(0, std^2) shaped like `reference`.

    `secure`: the sum of four draws halved (same law), the floating-point hardening Opacus uses in its
    secure mode (Mironov, "On significance of the least significant bits for differential privacy", 2012
    describes the attack on naive floating-point sampling).
    """
    import torch  # lazy: heavy (torch)

    if std == 0:
        return torch.zeros_like(reference)
    if not secure:
        return torch.normal(0.0, std, reference.shape, generator=generator, device=reference.device,
                            dtype=reference.dtype)
    total = torch.zeros_like(reference)
    for _ in range(4):
        total += torch.normal(0.0, std, reference.shape, generator=generator, device=reference.device,
                              dtype=reference.dtype)
    return total / 2


def gaussian_like(sums: Sequence[torch.Tensor], std: float, generator: torch.Generator | None,
                  secure: bool = False) -> list[torch.Tensor]:
    """N(0, std^2) shaped like each of `sums`, drawn as ONE flat buffer (rows x all coordinates) and viewed per
    tensor: one generator call and one kernel per step instead of one per parameter tensor (a step of a small
    model on a GPU is bound by kernel launches). The draw is a function of the generator's state alone, so a
    seeded generator reproduces it. Tensors of different dtype, device or leading dimension are drawn one by one.
    """
    import torch  # lazy: heavy (torch)

    if not sums:
        return []
    first = sums[0]
    if any(s.dtype != first.dtype or s.device != first.device or s.dim() == 0 or s.shape[0] != first.shape[0]
           for s in sums):
        return [gaussian(s, std, generator, secure) for s in sums]
    rows = first.shape[0]
    sizes = [s[0].numel() if rows else s.numel() for s in sums]
    flat = gaussian(torch.empty(rows, sum(sizes), dtype=first.dtype, device=first.device), std, generator, secure)
    offsets = [0]
    for size in sizes[:-1]:
        offsets.append(offsets[-1] + size)
    # narrow, not split: single-output views may be modified in place under grad mode (Opacus' ghost step)
    return [flat.narrow(1, o, n).view(s.shape) for o, n, s in zip(offsets, sizes, sums, strict=True)]


class NoiseAddition(abc.ABC):
    """One step's release of the clipped sums (see the module docstring)."""

    #: Whether the part draws fresh noise from the generator's stream, never rewinding it. The trainer checks the
    #: stream continues from step to step (`integrity.StepGuard`); a part that regenerates earlier draws by
    #: rewinding its generator (a declared correlated noise) says False, and only the generator's identity is
    #: checked.
    continues_stream: ClassVar[bool] = True

    @abc.abstractmethod
    def release(self, sums: Sequence[torch.Tensor], sigma: float, generator: torch.Generator | None, *,
                secure: bool = False, noise_map: NoiseMap | None = None,
                scale: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Privatise `sums` (one tensor per parameter, leading dimension = independent releases). `scale`:
        the clip bound in force over the declared one, for a part whose noise follows the bound."""

    @abc.abstractmethod
    def noise_multiplier(self, sigma: float, clipper: Clipping, relation: NeighborRel) -> float:
        """The Gaussian event's noise multiplier for one release (std over sensitivity)."""

    def describe(self) -> dict[str, object]:
        return {"noise": type(self).__name__} | dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclasses.dataclass(frozen=True)
class GaussianNoise(NoiseAddition):
    """DP-SGD's noise: i.i.d. N(0, (sigma * std_per_sigma)^2) on every coordinate of the sum.

    `follows_bound`: the std scales with the clip bound in force (`scale` = bound in force / declared bound,
    given by the trainer each step), as adaptive clipping's noise does; the multiplier is then the same in
    every step. Otherwise the std is fixed and the multiplier is taken at the largest bound the clipper can
    apply (`Clipping.max_bound`), which bounds every step.
    """

    std_per_sigma: float  # the std at sigma 1 and the declared bound: the clip (flat), the norm of per-layer clips
    follows_bound: bool = False

    def release(self, sums: Sequence[torch.Tensor], sigma: float, generator: torch.Generator | None, *,
                secure: bool = False, noise_map: NoiseMap | None = None,
                scale: torch.Tensor | None = None) -> list[torch.Tensor]:
        import torch  # lazy: heavy (torch)

        out = gaussian_like(sums, sigma * self.std_per_sigma, generator, secure)
        if scale is not None and self.follows_bound and out:
            torch._foreach_mul_(out, scale)  # the bound in force over the declared one (a device scalar)
        if noise_map is not None:
            out = [noise_map(i, noise) for i, noise in enumerate(out)]
        if out:
            torch._foreach_add_(out, list(sums))  # in place on the fresh noise, one multi-tensor kernel
        return out

    def sensitivity(self, clipper: Clipping, relation: NeighborRel) -> float:
        if self.follows_bound:
            return clipper.sensitivity(relation)
        return clipper.sensitivity(relation) * clipper.max_bound / clipper.bound

    def noise_multiplier(self, sigma: float, clipper: Clipping, relation: NeighborRel) -> float:
        return sigma * self.std_per_sigma / self.sensitivity(clipper, relation)


@dataclasses.dataclass(frozen=True)
class BatchClippedGaussian(NoiseAddition):
    """Shuffled DP-SGD's release: the whole sum (all tensors as one vector) clipped to `batch_clip`,
    then DP-SGD's Gaussian noise.

    Sensitivity: projection onto the ball of radius c' is 1-Lipschitz, and both projected sums lie in that
    ball, so neighbouring sums end at most min(Delta, 2 c') apart, Delta being the clipper's sensitivity
    (tight: S = c' u, S' = (c' - C) u when C >= 2 c'). A batch clip above Delta / 2 gains nothing.
    """

    std_per_sigma: float
    batch_clip: float  # c', absolute

    def release(self, sums: Sequence[torch.Tensor], sigma: float, generator: torch.Generator | None, *,
                secure: bool = False, noise_map: NoiseMap | None = None,
                scale: torch.Tensor | None = None) -> list[torch.Tensor]:
        import torch  # lazy: heavy (torch)

        if not sums:
            return []
        rows = len(sums[0])
        norm = torch.stack([s.reshape(rows, -1).norm(dim=1) for s in sums]).norm(dim=0)
        scale = (self.batch_clip / (norm + 1e-6)).clamp(max=1.0)
        out = []
        for i, (s, noise) in enumerate(zip(sums, gaussian_like(sums, sigma * self.std_per_sigma, generator, secure),
                                           strict=True)):
            if noise_map is not None:
                noise = noise_map(i, noise)
            out.append(noise.addcmul_(s, scale.reshape(rows, *([1] * (s.dim() - 1)))))
        return out

    def sensitivity(self, clipper: Clipping, relation: NeighborRel) -> float:
        return min(clipper.sensitivity(relation) * clipper.max_bound / clipper.bound, 2 * self.batch_clip)

    def noise_multiplier(self, sigma: float, clipper: Clipping, relation: NeighborRel) -> float:
        return sigma * self.std_per_sigma / self.sensitivity(clipper, relation)


class RunNoise(NoiseAddition):
    """Noise correlated across the steps of a run (a matrix factorization, DP-FTRL's tree): the declared interface
    that planning, training, the audits and the integrity checks ask for (`isinstance(noise, RunNoise)`), never an
    attribute probe. What a part of this kind promises:

    - `noise_multiplier` is the whole run's one Gaussian, over every participation the `participation` schema
      admits: the plan does not compose it over the sampler's steps, and a sampler that executes another schema
      (or a step with other releases) leaves the plan uncertified (`plan.correlated_gaps`);
    - `start()` opens one run's stream (`RunStream`), whose `release` training calls at every step in order;
      `release` on the part itself is the first step of a fresh stream (one participation, as the one-step audit
      tests it);
    - `correlation` names the correlation across steps and whitens residuals with it (the canaries and the noise
      checks read the run through it).
    """

    participation: Participation  # the schema the sensitivity is stated for (a dataclass field of the part)

    @abc.abstractmethod
    def start(self) -> RunStream:
        """A fresh stream for one run's steps."""

    @property
    @abc.abstractmethod
    def correlation(self) -> Correlation:
        """How the noise is correlated across steps (`name`, `whiten`)."""


class RunStream(abc.ABC):
    """One run's state of a `RunNoise`: the step's release, drawn from the state the earlier steps left."""

    @abc.abstractmethod
    def release(self, sums: Sequence[torch.Tensor], sigma: float, generator: torch.Generator | None, *,
                secure: bool = False, noise_map: NoiseMap | None = None,
                scale: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The step's privatised sums, as `NoiseAddition.release`."""

    @abc.abstractmethod
    def step_objects(self) -> tuple[object, ...]:
        """Every object whose code the stream runs in a step (itself included): the integrity check's
        `step_findings` verifies each is privbench's."""


class Correlation(Protocol):
    """A declared correlation across steps, for the audits' noise checks: its name, and `whiten`, which maps a
    (steps, canaries) block of residuals (each column one coordinate's noise over the run, in units of sigma times
    the plan's unit) to one that is i.i.d. across steps under the declared strategy."""

    name: str

    def whiten(self, residuals: np.ndarray) -> np.ndarray: ...


FFT_NORMS = {"unitary": "ortho", "unnormalised": "backward"}


@dataclasses.dataclass(frozen=True)
class FrequencyNoise(NoiseAddition):
    """GReDP's release (Wang et al., arXiv 2409.11663), per parameter tensor: Re(F^-1(F(V) + tau)).

    tau has real part N(0, (a s)^2) and imaginary part N(0, (b s)^2), s = sigma * `std_per_sigma` (the
    frequency-domain clip). Since F^-1(F(V) + tau) = V + F^-1(tau), the release is V plus the real
    Gaussian n = Re(F^-1 tau), whose covariance is s^2 (a^2 A A^T + b^2 B B^T) with A + iB the inverse
    transform; for the unitary FFT A A^T + B B^T = I, so the covariance is at least s^2 min(a, b)^2 I.
    The unnormalised inverse divides by n_i (the tensor's size) and the time-domain clip is C / sqrt(N)
    (N = all trainable coordinates): the noise-to-clip ratio is then at least that of the unitary case
    (n_i <= N), so the same multiplier is a sound, possibly conservative, description of it.

    Multiplier: sigma min(|a|, |b|) over the relation's factor, divided by sqrt(L) under per-layer
    clipping (L tensors, each clipped to its own bound and noised at sigma times that bound).
    """

    std_per_sigma: float
    parts: tuple[float, float]
    fft: str = "unitary"

    def __post_init__(self) -> None:
        if self.fft not in FFT_NORMS:
            raise ValueError(f"fft must be one of {', '.join(FFT_NORMS)}, got {self.fft!r}")

    def release(self, sums: Sequence[torch.Tensor], sigma: float, generator: torch.Generator | None, *,
                secure: bool = False, noise_map: NoiseMap | None = None,
                scale: torch.Tensor | None = None) -> list[torch.Tensor]:
        import torch  # lazy: heavy (torch)

        norm = FFT_NORMS[self.fft]
        a, b = self.parts
        std = sigma * self.std_per_sigma
        out = []
        for i, s in enumerate(sums):
            flat = s.reshape(len(s), -1).to(torch.float64)
            tau = torch.complex(gaussian(flat, a * std, generator, secure), gaussian(flat, b * std, generator, secure))
            # F^-1(F(V) + tau) = V + F^-1(tau) exactly (linearity); this form avoids the round-off of V's
            # round trip through the transform.
            noise = torch.fft.ifft(tau, dim=-1, norm=norm).real
            if noise_map is not None:
                noise = noise_map(i, noise.reshape(s.shape)).reshape(flat.shape)
            out.append((flat + noise).to(s.dtype).reshape(s.shape))
        return out

    def noise_multiplier(self, sigma: float, clipper: Clipping, relation: NeighborRel) -> float:
        layers = len(clipper.clips) if isinstance(clipper, PerLayerClipping) else 1
        return sigma * min(abs(self.parts[0]), abs(self.parts[1])) / (relation_factor(relation) * math.sqrt(layers))



__all__ = ["BatchClippedGaussian", "Correlation", "FrequencyNoise", "GaussianNoise", "NoiseAddition", "RunNoise",
           "RunStream", "gaussian", "gaussian_like"]
