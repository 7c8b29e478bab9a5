"""The mechanism registry: one module per mechanism, looked up by its kebab-case id.

A mechanism module defines `ID`, `plan(spec) -> PrivacyPlan`, `make_private(model, optimizer, loader,
plan, ...) -> (model, optimizer, loader)` and, for auditing, `privatize_step(sums, sigma, clip, rng,
**options)`, which applies one step's privatisation to a batch of summed-gradient vectors.
"""

from __future__ import annotations

from types import ModuleType


class UnknownName(ValueError):
    """A name that is not in a registry; the message lists what exists."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(known)}")
        self.kind, self.name, self.known = kind, name, known


_MECHANISMS: dict[str, ModuleType] = {}


def register(module: ModuleType) -> ModuleType:
    if module.ID in _MECHANISMS:
        raise ValueError(f"mechanism {module.ID!r} registered twice")
    _MECHANISMS[module.ID] = module
    return module


def get(mechanism_id: str) -> ModuleType:
    if mechanism_id not in _MECHANISMS:
        raise UnknownName("mechanism", mechanism_id, names())
    return _MECHANISMS[mechanism_id]


def names() -> list[str]:
    return sorted(_MECHANISMS)
