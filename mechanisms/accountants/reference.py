"""Sound accountants as pure functions of a DpEvent: `(event, delta) -> epsilon | None`.

PLD (dp-accounting) is the reference used for `epsilon_certified`; RDP is a looser cross-check.
`None` means the accountant cannot analyse the event (never a guess); `inf` means no privacy.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import dp_accounting
from dp_accounting import pld, rdp

# PLD discretisation: 1e-3 is within 0.13% of 1e-4 on sigma (research/pitfalls.md) and 3-10x faster.
PLD_DISCRETIZATION = 1e-3


def pld_accountant() -> dp_accounting.PrivacyAccountant:
    return pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)


def rdp_accountant() -> dp_accounting.PrivacyAccountant:
    return rdp.RdpAccountant()


FRESH: dict[str, Callable[[], dp_accounting.PrivacyAccountant]] = {
    "pld": pld_accountant,
    "rdp": rdp_accountant,
}


def epsilon(event: dp_accounting.DpEvent, delta: float, accountant: str = "pld") -> float | None:
    """Epsilon at `delta` for `event`, or None when the accountant does not support it."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
        return math.inf
    if isinstance(event, dp_accounting.UnsupportedDpEvent):
        return None
    if accountant not in FRESH:
        raise ValueError(f"unknown accountant {accountant!r}; known: {', '.join(sorted(FRESH))}")
    acc = FRESH[accountant]()
    if not acc.supports(event):
        return None
    return float(acc.compose(event).get_epsilon(delta))
