"""Privacy accountants: sound ones certify (`reference`), the papers' own ones claim (`gdp`,
`fenton_wilkinson`, `moments_accountant`, `composition`), and calibrators pick noise (`calibration`,
`analytic_gaussian`). Every function here is pure: mechanisms describe their noise as a DpEvent (or
plain parameters) and get numbers back; bad input raises ValueError.

The names below are imported on first use (PEP 562), so that `import mechanisms.accounting.accountant`
(the accountant descriptors) costs nothing: dp-accounting and scipy load only when a number is asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

_SUBMODULES = ("composition", "fenton_wilkinson", "gdp", "moments_accountant")
_NAMES = {
    "agm_delta": "analytic_gaussian", "agm_epsilon": "analytic_gaussian", "agm_sigma": "analytic_gaussian",
    "amgm_epsilon": "analytic_gaussian", "amgm_is_private": "analytic_gaussian", "amgm_scale": "analytic_gaussian",
    "amgm_sigma": "analytic_gaussian", "analytic_bound": "analytic_gaussian",
    "Calibration": "calibration", "calibrate": "calibration", "calibrate_sigma": "calibration",
    "DpsgdSetting": "compare", "epsilon_of": "compare", "epsilons": "compare", "sigma_for": "compare",
    "EpsilonReport": "reference", "epsilon": "sound", "epsilon_report": "sound",
}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted([*_SUBMODULES, *_NAMES])
