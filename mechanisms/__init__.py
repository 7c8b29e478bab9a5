"""privbench's mechanism library: usable alone (no Ray, no MLflow), e.g. `from mechanisms import dpsgd`."""

from mechanisms import dpsgd, nonprivate
from mechanisms import gredp  # noqa: E402  (after dpsgd, which it composes)
from mechanisms.plan import PrivacyPlan, PrivacySpec
from mechanisms.registry import UnknownName, get, names, register

for _module in (nonprivate, dpsgd, gredp):
    register(_module)

__all__ = ["PrivacyPlan", "PrivacySpec", "UnknownName", "dpsgd", "get", "names", "nonprivate", "register"]
