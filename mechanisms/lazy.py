"""PEP 562 loading of a package's submodules on first attribute access, so that importing a package of
`mechanisms` stays light (no torch, Opacus or scipy until a submodule that needs them is used)."""

from __future__ import annotations

import importlib
from types import ModuleType


def submodule(package: str, name: str) -> ModuleType:
    """`package.name` imported now; AttributeError (as for a missing attribute) when there is no such module."""
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{package}.{name}":
            raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
