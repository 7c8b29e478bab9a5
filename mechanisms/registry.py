"""The mechanism registry: `Mechanism` instances (mechanisms/mechanism.py) by their kebab-case id."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mechanisms.mechanism import Mechanism


class UnknownName(ValueError):
    """A name that is not in a registry; the message lists what exists."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(known)}")
        self.kind, self.name, self.known = kind, name, known


_MECHANISMS: dict[str, Mechanism] = {}


def register(mechanism: Mechanism) -> Mechanism:
    if mechanism.ID in _MECHANISMS:
        raise ValueError(f"mechanism {mechanism.ID!r} registered twice")
    _MECHANISMS[mechanism.ID] = mechanism
    return mechanism


def get(mechanism_id: str) -> Mechanism:
    if mechanism_id not in _MECHANISMS:
        raise UnknownName("mechanism", mechanism_id, names())
    return _MECHANISMS[mechanism_id]


def names() -> list[str]:
    return sorted(_MECHANISMS)
