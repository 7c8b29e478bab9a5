"""Epsilon from a sound accountant named by the user: the registry's PLD, RDP, PRV or a plugin's.

Apart from `reference.py` (the built-in accountants' arithmetic, which the `Accountant` descriptors call) so
that the lookup by name sits above the registry and the registry above the accountants: no import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dp_accounting

from mechanisms.accounting.validation import require_delta
from mechanisms.framework.registry import ACCOUNTANTS

if TYPE_CHECKING:
    from mechanisms.accounting.reference import EpsilonReport

NeighborRel = dp_accounting.NeighboringRelation


def sound_accountants() -> tuple[str, ...]:
    """The sound accountants' names: the built-ins and any plugin (`privbench.accountants`)."""
    return tuple(name for name, acc in ACCOUNTANTS.items() if acc.sound)


def epsilon_report(event: dp_accounting.DpEvent, delta: float, accountant: str = "pld",
                   relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE) -> EpsilonReport:
    """Epsilon at `delta` for `event` from the sound accountant named `accountant` (its `report`), with
    provenance; None when it does not support the event (see `epsilon`).

    `relation` is the neighbouring relation the event's Gaussians are scaled for. Events that mix in a
    replace-one-only release (randomized response) need `REPLACE_ONE`; Gaussian compositions are the same
    under both (the multiplier already carries the relation's sensitivity).
    """
    require_delta(delta)
    if accountant not in sound_accountants():
        raise ValueError(f"unknown accountant {accountant!r}; known: {', '.join(sound_accountants())}")
    return ACCOUNTANTS.get(accountant).report(event, delta, relation)


def epsilon(event: dp_accounting.DpEvent, delta: float, accountant: str = "pld",
            relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE) -> float | None:
    """Epsilon at `delta` for `event`, or None when the accountant does not support it."""
    return epsilon_report(event, delta, accountant, relation).epsilon
