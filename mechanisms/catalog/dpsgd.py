"""DP-SGD (Abadi et al., arXiv 1607.00133): Poisson sampling, per-sample clipping, Gaussian noise.

The reference mechanism: its claimed epsilon is the reference accountant's, so claimed == certified.
Options: `clipping: flat` (one bound C over all trainable tensors, default) or `per-layer` (C split
equally over the model's tensors, so one example's bound is still C).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from mechanisms.framework.mechanism import CLIPPINGS, Mechanism, clipping_for

if TYPE_CHECKING:
    from mechanisms.parts.clipping import Clipping
    from mechanisms.parts.plan import Parts, PrivacySpec

ID = "dpsgd"


@dataclasses.dataclass(frozen=True)
class Options:
    clipping: str = "flat"

    def __post_init__(self) -> None:
        if self.clipping not in CLIPPINGS:
            raise ValueError(f"clipping must be one of {', '.join(CLIPPINGS)}, got {self.clipping!r}")


class DpSgd(Mechanism):
    ID = ID
    references = ("arXiv:1607.00133",)
    Options = Options

    def clipper(self, spec: PrivacySpec, options: Any) -> Clipping:
        return clipping_for(options.clipping, spec.clip, spec.n_tensors, self.ID)

    def parts(self, spec: PrivacySpec, options: Any) -> Parts:
        from mechanisms.parts.noise_addition import GaussianNoise  # lazy: keeps the registries light
        from mechanisms.parts.plan import Parts  # lazy: keeps the registries light

        clipper = self.clipper(spec, options)
        return Parts(spec.batch_selection, clipper, GaussianNoise(clipper.bound))


mechanism = DpSgd()

__all__ = ["ID", "DpSgd", "Options", "mechanism"]
