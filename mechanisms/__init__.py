"""privbench's mechanism library: usable alone (no Ray, no MLflow), e.g. `from mechanisms import dpsgd`."""

from mechanisms import dp_forward, dpsgd, dpsgd_gdp, gredp, nonprivate, shuffled_dpsgd
from mechanisms.plan import PrivacyPlan, PrivacySpec
from mechanisms.registry import UnknownName, get, names, register

for _module in (nonprivate, dpsgd, dpsgd_gdp, gredp, shuffled_dpsgd, dp_forward):
    register(_module)

__all__ = ["PrivacyPlan", "PrivacySpec", "UnknownName", "dpsgd", "get", "names", "nonprivate", "register"]
