"""privbench's mechanism library: usable alone (no Ray, no MLflow), e.g. `mechanisms.get("dpsgd")`.

A mechanism is a `Mechanism` (mechanisms/framework/mechanism.py) built from parts (`mechanisms.parts`): batch
selection (`parts.batch_selection`), clipping (`parts.clipping`) and noise addition (`parts.noise_addition`),
bundled with the DpEvent they add up to in a `PrivacyPlan` (`parts.plan`); `private_training.make_private`
runs exactly that plan. Mechanisms are found through entry points (`mechanisms.framework.registry`): privbench's own
and any installed plugin alike.

Importing this package is light (no torch, Opacus or scipy): `Parts`, `PrivacyPlan`, `PrivacySpec` and the
submodules load on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Any

from mechanisms.framework.mechanism import Mechanism
from mechanisms.framework.registry import PluginError, UnknownName, get, names, register, unregister
from mechanisms.lazy import submodule

_FROM_PLAN = ("Parts", "PrivacyPlan", "PrivacySpec")


def __getattr__(name: str) -> Any:
    if name in _FROM_PLAN:
        return getattr(importlib.import_module("mechanisms.parts.plan"), name)
    return submodule(__name__, name)


__all__ = ["Mechanism", "Parts", "PluginError", "PrivacyPlan", "PrivacySpec", "UnknownName", "get", "names",
           "register", "unregister"]
