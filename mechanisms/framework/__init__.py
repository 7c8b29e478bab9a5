"""The mechanism framework: the `Mechanism` template and its hooks, the registries, options, claims and the
private training step that runs a plan.

Submodules load on first use (PEP 562), so importing the package stays light."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
