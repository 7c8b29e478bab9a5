"""Privacy accountants: sound ones certify (`reference`), the papers' own ones claim (`gdp`,
`fenton_wilkinson`, `moments_accountant`, `composition`), and calibrators pick noise (`calibration`,
`analytic_gaussian`). Every function here is pure: mechanisms describe their noise as a DpEvent (or
plain parameters) and get numbers back; bad input raises ValueError."""

import importlib
from typing import Any

# Public name -> the submodule that defines it. Imported on first use (PEP 562): `privbench privacy agm`
# needs the analytic Gaussian (SciPy) only, not dp_accounting (0.6 s), and nothing is imported with the package.
_SUBMODULES = ("composition", "fenton_wilkinson", "gdp", "moments_accountant")
_ATTRIBUTES = {
    **dict.fromkeys(("agm_delta", "agm_epsilon", "agm_sigma", "amgm_epsilon", "amgm_is_private", "amgm_scale",
                     "amgm_sigma", "analytic_bound"), "analytic_gaussian"),
    **dict.fromkeys(("Calibration", "calibrate", "calibrate_sigma"), "calibration"),
    **dict.fromkeys(("DpsgdSetting", "epsilon_of", "epsilons", "sigma_for"), "compare"),
    **dict.fromkeys(("SAMPLER_ADJACENCY", "DpsgdEvents", "dpsgd_event"), "events"),
    **dict.fromkeys(("EpsilonReport", "epsilon", "epsilon_report"), "reference"),
}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _ATTRIBUTES:
        return getattr(importlib.import_module(f"{__name__}.{_ATTRIBUTES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "Calibration", "DpsgdEvents", "DpsgdSetting", "EpsilonReport", "SAMPLER_ADJACENCY", "agm_delta",
    "agm_epsilon", "agm_sigma", "amgm_epsilon", "amgm_is_private", "amgm_scale", "amgm_sigma",
    "analytic_bound", "calibrate", "calibrate_sigma", "composition", "dpsgd_event", "epsilon",
    "epsilon_of", "epsilon_report", "epsilons", "fenton_wilkinson", "gdp", "moments_accountant",
    "sigma_for",
]
