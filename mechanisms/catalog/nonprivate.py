"""The utility and speed reference: the same training loop and batch geometry, with no DP work at all.

No parts, no noise, no epsilon: `Mechanism` plans it as a reference run (shuffled batches, as ordinary
training), trains it with the plain optimizer, and its audit release is the clipped sum itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mechanisms.framework.mechanism import Mechanism

ID = "nonprivate"


class NonPrivate(Mechanism):
    ID = ID
    private = False

    def privatize_step(self, sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator,
                       **_: Any) -> np.ndarray:
        """No privatisation: what the auditor sees is the clipped sum itself."""
        return np.asarray(sums, dtype=np.float64)


mechanism = NonPrivate()

__all__ = ["ID", "NonPrivate", "mechanism"]
