"""privbench's mechanism library: usable alone (no Ray, no MLflow), e.g. `from mechanisms import dpsgd`.

A mechanism is a `Mechanism` (mechanisms/mechanism.py) built from parts: batch selection
(`batch_selection`), clipping (`clipping`) and noise addition (`noise_addition`), bundled with the DpEvent
they add up to in a `PrivacyPlan`; `private_training.make_private` runs exactly that plan.
"""

from mechanisms import dp_forward, dpsgd, dpsgd_gdp, gredp, nonprivate, shuffled_dpsgd
from mechanisms.mechanism import Mechanism
from mechanisms.plan import Parts, PrivacyPlan, PrivacySpec
from mechanisms.registry import UnknownName, get, names, register

for _module in (nonprivate, dpsgd, dpsgd_gdp, gredp, shuffled_dpsgd, dp_forward):
    register(_module.mechanism)

__all__ = ["Mechanism", "Parts", "PrivacyPlan", "PrivacySpec", "UnknownName", "dpsgd", "get", "names",
           "nonprivate", "register"]
