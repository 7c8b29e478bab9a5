"""The utility and speed reference: the same training loop and batch geometry, with no DP work at all.

No parts, no noise, no epsilon: a reference run (`private = False`), which `Mechanism` plans as ordinary
training (shuffled batches), trains with the plain optimizer, and whose audit release is the clipped sum itself.
"""

from __future__ import annotations

from mechanisms.framework.mechanism import Mechanism

ID = "nonprivate"


class NonPrivate(Mechanism):
    ID = ID
    private = False


mechanism = NonPrivate()

__all__ = ["ID", "NonPrivate", "mechanism"]
