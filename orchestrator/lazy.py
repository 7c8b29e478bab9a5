"""Modules imported on first use, so that `privbench --help` and the read commands start fast.

torch, Ray and the mechanism library take seconds to import; a command that does not use them must
not pay for them. `lazy("mechanisms")` is a stand-in whose first attribute access imports the module.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class _LazyModule:
    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


def lazy(name: str) -> Any:
    return _LazyModule(name)
