"""The accountant contract (`Accountant`) and privbench's built-in accountants, as light descriptors.

An accountant is either *sound*: a function of a DpEvent that upper-bounds epsilon for every event it
supports (`epsilon_certified` and the accountants recorded beside it), or *claimed*: a seed paper's own
analysis of DP-SGD's noise, shown beside the sound ones by `privbench privacy` (not a bound).
A plugin accountant is sound: it names a factory of a `dp_accounting.PrivacyAccountant` for
add-or-remove-one neighbours, whose `compose(event).get_epsilon(delta)` must be an upper bound on the
event's epsilon (dp-accounting's own contract); `calibrates: true` lets a grid pick it (`accountant:`).
Nothing here imports an accountant's code: `make()` does, when a number is asked for.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Accountant:
    """An accountant by name: what it is, whether it bounds epsilon, and how to build one."""

    name: str
    description: str
    sound: bool = True
    calibrates: bool = False  # a grid's `accountant:` may pick it to calibrate sigma
    factory: str | Callable[[], Any] | None = None  # `module:callable` or a callable; sound plugins only

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"an accountant needs a name, got {self.name!r}")
        if self.calibrates and not self.sound:
            raise ValueError(f"accountant {self.name}: only a sound accountant may calibrate sigma")

    @property
    def kind(self) -> str:
        return "sound" if self.sound else "claimed"

    def make(self) -> Any:
        """A fresh `dp_accounting.PrivacyAccountant` (add-or-remove-one) from the factory."""
        factory = self.factory
        if factory is None:
            raise ValueError(f"accountant {self.name} has no factory")
        if isinstance(factory, str):
            module, _, attr = factory.partition(":")
            factory = getattr(importlib.import_module(module), attr)
        return factory()


PLD = Accountant("pld", "privacy loss distributions (dp-accounting), the reference for epsilon_certified",
                 calibrates=True)
RDP = Accountant("rdp", "Renyi DP (dp-accounting), looser", calibrates=True)
PRV = Accountant("prv", "privacy random variables (Opacus port of Gopi et al. 2021), cross-check")
GDP = Accountant("gdp", "mu-GDP central limit theorem (arXiv 1911.11607, dpsgd-gdp); not a bound", sound=False)
MA_CLASSIC = Accountant("ma_classic", "moments accountant with the classic conversion (Abadi et al. 2016 as "
                                      "published)", sound=False)
FENTON_WILKINSON = Accountant("fenton_wilkinson", "Fenton-Wilkinson Thm 6 + advanced composition "
                                                  "(arXiv 2407.15414, shuffled-dpsgd); not a bound", sound=False)

BUILTIN_SOUND = ("pld", "rdp", "prv")  # answered by `reference.py` itself, not through a factory


def described(accountant: Accountant) -> str:
    """'sound: ...' / 'claimed: ...', as `privbench list accountants` and `privbench privacy` show it."""
    return f"{accountant.kind}: {accountant.description}"


__all__ = ["BUILTIN_SOUND", "FENTON_WILKINSON", "GDP", "MA_CLASSIC", "PLD", "PRV", "RDP", "Accountant",
           "described"]
