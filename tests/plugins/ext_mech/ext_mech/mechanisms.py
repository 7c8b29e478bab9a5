"""DP-SGD clipped at a fraction of C: per-example gradients clipped to `clip_scale` * C, noise sigma * C.

Built from privbench's public parts: the trial's sampler, flat clipping at the smaller bound, Gaussian
noise at the usual std. The certified event follows from the parts (the noise multiplier is sigma divided
by clip_scale), so privbench calibrates, certifies and audits it like any built-in.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from mechanisms import Mechanism
from mechanisms.parts.clipping import FlatClipping


@dataclasses.dataclass(frozen=True)
class Options:
    clip_scale: float = 0.5  # the clipping norm, as a fraction of the grid's clip C

    def __post_init__(self) -> None:
        if not 0 < self.clip_scale <= 1:
            raise ValueError(f"clip_scale must lie in (0, 1], got {self.clip_scale}")


class TightClipDpSgd(Mechanism):
    ID = "dpsgd-tightclip"
    Options = Options
    audit_coordinatewise = False  # privatize_step clips whole rows (their norm couples the coordinates)

    def parts(self, spec: Any, options: Options) -> Any:
        from mechanisms.parts.noise_addition import GaussianNoise  # heavy parts load inside the hook
        from mechanisms.parts.plan import Parts

        return Parts(spec.batch_selection, FlatClipping(options.clip_scale * spec.clip), GaussianNoise(spec.clip))

    def privatize_step(self, sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator, *,
                       clip_scale: float = 0.5, **options: Any) -> np.ndarray:
        """The audited release: each row, one example's gradient of norm <= clip, is clipped to clip_scale * clip
        as training clips it, then released through the noise part (the base class' release)."""
        rows = np.atleast_2d(np.asarray(sums, dtype=np.float64))
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        rows = rows * np.minimum(1.0, clip_scale * clip / np.maximum(norms, 1e-300))
        return super().privatize_step(rows, sigma, clip, rng, clip_scale=clip_scale, **options)

    def claimed_step_tradeoff(self, sigma: float, clip_scale: float = 0.5, **_: Any) -> Any:
        """One step is the Gaussian mechanism at sensitivity clip_scale * C and std sigma * C."""
        from mechanisms.auditing.tradeoff import Gaussian

        return Gaussian(mu=clip_scale / sigma)


mechanism = TightClipDpSgd()
