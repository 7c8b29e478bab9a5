"""privbench's built-in mechanisms, each a `mechanisms.framework.mechanism.Mechanism` registered under its ID.

Submodules load on first use (PEP 562), so importing the package stays light."""

from __future__ import annotations

from types import ModuleType

from mechanisms.lazy import submodule


def __getattr__(name: str) -> ModuleType:
    return submodule(__name__, name)
