"""The mechanism framework: the `Mechanism` template and its hooks, the registries, options, claims and the
private training step that runs a plan.

Submodules load on first use (PEP 562), so importing the package stays light."""

from __future__ import annotations

from types import ModuleType

from mechanisms.lazy import submodule


def __getattr__(name: str) -> ModuleType:
    return submodule(__name__, name)
