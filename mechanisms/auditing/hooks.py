"""What a mechanism module provides so that `privbench audit` can test it (all optional).

Adding a mechanism to the audit is one to three module-level names next to `privatize_step`:

    def claimed_step_tradeoff(sigma: float, **options) -> TradeOff | None:
        '''The curve the mechanism's own analysis claims for ONE un-subsampled step with
        sensitivity `clip` and noise multiplier `sigma` (None: it claims nothing).'''
        return tradeoff.Gaussian(mu=1 / sigma)          # dpsgd; an (eps, delta) claim: ApproxDP(...)

    def audit_cases(dim: int, clip: float, rng: np.random.Generator, **options) -> list[AuditCase]:
        '''Worst-case neighbours beyond the Dirac canary every mechanism gets (cases.py).'''

    AUDIT_COORDINATEWISE = True
        # privatize_step treats coordinates independently (output column k depends only on input
        # column k and fresh noise): the audit may then run it on the canary's support only, which
        # is exact for projection statistics and makes a 100,000-dimensional step as cheap as a
        # 1-dimensional one. Leave it out when noise mixes coordinates (FFT, permutations).

Without `claimed_step_tradeoff` the claim is rebuilt from the mechanism's own `plan(...)` for one
step: the envelope of f_{eps(delta_i), delta_i} over a grid of deltas, a sound inner approximation
of its privacy profile.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import dp_accounting
import numpy as np

from mechanisms.auditing import tradeoff
from mechanisms.auditing.cases import AuditCase, dirac_case
from mechanisms.plan import PrivacyPlan, PrivacySpec

# deltas at which the fallback reads the claimed privacy profile from plan(...)
PROFILE_DELTAS = (0.5, 0.3, 0.2, 0.1, 0.05, 0.02, 1e-2, 5e-3, 2e-3, *(10.0 ** -k for k in range(3, 13)))


def _hook(module: ModuleType, name: str) -> Any:
    return getattr(module, name, None)


def step_spec(sigma: float | None, delta: float, *, epsilon: float | None = None, clip: float = 1.0,
              options: Mapping[str, Any] | None = None) -> PrivacySpec:
    """ONE un-subsampled step (sample_rate 1, steps 1): the scope of every mechanism-level number."""
    return PrivacySpec(epsilon=epsilon, delta=delta, dataset_size=1, batch_size=1, epochs=1, clip=clip,
                       sigma=sigma, options=dict(options or {}))


def step_plan(module: ModuleType, sigma: float | None, delta: float, *, epsilon: float | None = None,
              clip: float = 1.0, options: Mapping[str, Any] | None = None) -> PrivacyPlan:
    """The mechanism's own plan for one step: claimed and certified epsilon, or sigma for `epsilon`.

    Only the options the mechanism declares reach its plan (audits pass auditor-side keys such as
    `tensor_sizes` to `privatize_step`).

    Cached per (module, numbers, options) when the options are hashable: a PLD accountant call
    costs ~0.2 s, far more than sampling and bounding a 20,000-sample audit.
    """
    options = dict(options or {})
    if hasattr(module, "audit_options"):
        options = module.audit_options(options)
    items = tuple(sorted(options.items()))
    try:
        hash(items)
    except TypeError:
        return module.plan(step_spec(sigma, delta, epsilon=epsilon, clip=clip, options=options))
    return _cached_plan(module, sigma, delta, epsilon, clip, items)


@functools.lru_cache(maxsize=256)
def _cached_plan(module: ModuleType, sigma: float | None, delta: float, epsilon: float | None, clip: float,
                 items: tuple[tuple[str, Any], ...]) -> PrivacyPlan:
    return module.plan(step_spec(sigma, delta, epsilon=epsilon, clip=clip, options=dict(items)))


def is_private(plan: PrivacyPlan) -> bool:
    return not isinstance(plan.effective_event, dp_accounting.NonPrivateDpEvent)


def claimed_step_tradeoff(module: ModuleType, sigma: float, *, clip: float = 1.0,
                          options: Mapping[str, Any] | None = None) -> tradeoff.TradeOff | None:
    """The curve the mechanism claims for one step, from its hook or rebuilt from its plan."""
    options = dict(options or {})
    hook: Callable[..., tradeoff.TradeOff | None] | None = _hook(module, "claimed_step_tradeoff")
    if hook is not None:
        return hook(sigma, **options)
    curves: list[tradeoff.TradeOff] = []
    for delta in PROFILE_DELTAS:
        eps = step_plan(module, sigma, delta, clip=clip, options=options).epsilon_claimed
        if eps is None:
            return None
        if math.isfinite(eps):
            curves.append(tradeoff.ApproxDP(eps, delta))
    return tradeoff.Envelope(tuple(curves)) if curves else None


def is_coordinatewise(module: ModuleType) -> bool:
    return bool(_hook(module, "AUDIT_COORDINATEWISE"))


def audit_cases(module: ModuleType, dim: int, clip: float, seed: int,
                options: Mapping[str, Any] | None = None) -> Sequence[AuditCase]:
    """The Dirac case every mechanism gets, then the mechanism's own worst cases."""
    rng = np.random.default_rng([seed, 0xCA5E])
    cases = [dirac_case(dim, clip, rng)]
    hook = _hook(module, "audit_cases")
    if hook is not None:
        cases.extend(hook(dim=dim, clip=clip, rng=rng, **dict(options or {})))
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise ValueError(f"audit case names must be unique, got {names}")
    return cases
