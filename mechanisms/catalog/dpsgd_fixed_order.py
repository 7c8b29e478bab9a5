"""DP-SGD on fixed-order batches: one permutation fixed before training, the same batches every epoch (the
participation DP-FTRL and DP-MF run), per-example clipping at C and i.i.d. Gaussian noise sigma C.

The comparison correlated noise needs: the same batches as `dpftrl-tree` and `dp-bandmf`, DP-SGD's memoryless
noise, no amplification by sampling. Formal guarantee (certified, and claimed: the two are the same analysis):
each example joins one step per epoch, each step a Gaussian of multiplier sigma / 2 under replace-one (2C for the
fixed-size batches that run), composed over the epochs by PLD, as the `shuffle` sampler. The grid's `sampler`
does not apply (the plan records `fixed-order`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mechanisms.catalog.dpsgd import DpSgd, Options
from mechanisms.catalog.matrix_factorization import fixed_order

if TYPE_CHECKING:
    from mechanisms.parts.plan import Parts, PrivacySpec

ID = "dpsgd-fixed-order"


class DpSgdFixedOrder(DpSgd):
    ID = ID
    references = ("arXiv:1607.00133",)
    Options = Options

    def parts(self, spec: PrivacySpec, options: Any) -> Parts:
        from mechanisms.parts.noise_addition import GaussianNoise  # lazy: keeps the registries light
        from mechanisms.parts.plan import Parts  # lazy: keeps the registries light

        clipper = self.clipper(spec, options)
        return Parts(fixed_order(spec), clipper, GaussianNoise(clipper.bound))


mechanism = DpSgdFixedOrder()

__all__ = ["ID", "DpSgdFixedOrder", "mechanism"]
