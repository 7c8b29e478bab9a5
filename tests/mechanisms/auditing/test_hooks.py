"""The audit's view of a mechanism's hooks: the claimed trade-off of one step, from a closed form (DP-SGD), from
the claimed privacy profile when a mechanism has none (a bare test mechanism), or none (non-private)."""

import numpy as np
from audit_test_mechanisms import DPSGD_BARE, GREDP_REFERENCE

import mechanisms
from mechanisms.auditing import Gaussian, hooks

DPSGD = mechanisms.get("dpsgd")


def test_hooks_resolve_claims_for_registry_and_test_modules():
    assert hooks.claimed_step_tradeoff(DPSGD, 2.0) == Gaussian(0.5)
    assert DPSGD.audit_coordinatewise and not GREDP_REFERENCE.audit_coordinatewise
    assert hooks.claimed_step_tradeoff(mechanisms.get("nonprivate"), 1.0) is None
    envelope = hooks.claimed_step_tradeoff(DPSGD_BARE, 1.0)
    alpha = np.linspace(0.001, 0.999, 50)
    assert np.all(envelope(alpha) <= Gaussian(1.0)(alpha) + 1e-6)  # inside the exact curve
    assert np.max(Gaussian(1.0)(alpha) - envelope(alpha)) < 0.05  # and close to it
