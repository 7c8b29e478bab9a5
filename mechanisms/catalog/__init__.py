"""privbench's built-in mechanisms, each a `mechanisms.framework.mechanism.Mechanism` registered under its ID.

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
