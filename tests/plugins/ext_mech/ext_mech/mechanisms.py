"""DP-SGD clipped at a fraction of C: per-example gradients clipped to `clip_scale` * C, noise sigma * C.

Built from privbench's public parts: the trial's sampler, flat clipping at the smaller bound, Gaussian
noise at the usual std. The certified event follows from the parts (the noise multiplier is sigma divided
by clip_scale), so privbench calibrates, certifies and audits it like any built-in: the one-step audit's
canary has the clipper's bound and its claim is the Gaussian curve of these parts, with no code here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

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

    def parts(self, spec: Any, options: Options) -> Any:
        from mechanisms.parts.noise_addition import GaussianNoise  # heavy parts load inside the hook
        from mechanisms.parts.plan import Parts

        return Parts(spec.batch_selection, FlatClipping(options.clip_scale * spec.clip), GaussianNoise(spec.clip))


mechanism = TightClipDpSgd()
