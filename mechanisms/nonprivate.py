"""The utility and speed reference: the same training loop with no DP work at all."""

from __future__ import annotations

from typing import Any

import dp_accounting
import numpy as np

from mechanisms.plan import PrivacyPlan, PrivacySpec

ID = "nonprivate"
AUDIT_COORDINATEWISE = True


def claimed_step_tradeoff(sigma: float, **_: Any) -> None:
    """Claims nothing."""
    return None


def plan(spec: PrivacySpec) -> PrivacyPlan:
    return PrivacyPlan(
        mechanism=ID, sigma=None, sample_rate=spec.sample_rate, steps=spec.steps, delta=spec.delta,
        sampler="shuffle", accountant=spec.accountant, claimed_by=None, epsilon_claimed=None,
        epsilon_certified=None, effective_event=dp_accounting.NonPrivateDpEvent(),
    )


def make_private(model: Any, optimizer: Any, loader: Any, plan: PrivacyPlan, *, criterion: Any,
                 **_: Any) -> tuple[Any, Any, Any, Any]:
    return model, optimizer, loader, criterion


def privatize_step(sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator,
                   **_: Any) -> np.ndarray:
    """No privatisation: what the auditor sees is the clipped sum itself."""
    return np.asarray(sums, dtype=np.float64)
