"""What the one-step audit asks of a mechanism, through the hooks `Mechanism` declares.

`claimed_step_tradeoff` (the claim for one un-subsampled step), `audit_cases` (worst-case neighbours beyond
the Dirac canary), `audit_coordinatewise` and `privatize_step` are `Mechanism` methods with their
guarantees stated there (mechanisms/mechanism.py). This module adds what the auditor derives from them:
the mechanism's own plan for one step (cached), and `claimed_profile`: a claim rebuilt from that plan (the
envelope of f_{eps(delta_i), delta_i} over a grid of deltas, a sound inner approximation of its privacy
profile), for a mechanism whose `claimed_step_tradeoff` has no closed form.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mechanisms.auditing import tradeoff
from mechanisms.auditing.cases import AuditCase, dirac_case

if TYPE_CHECKING:
    from mechanisms.mechanism import Mechanism
    from mechanisms.parts.plan import PrivacyPlan, PrivacySpec

# deltas at which the fallback reads the claimed privacy profile from plan(...)
PROFILE_DELTAS = (0.5, 0.3, 0.2, 0.1, 0.05, 0.02, 1e-2, 5e-3, 2e-3, *(10.0 ** -k for k in range(3, 13)))


def step_spec(sigma: float | None, delta: float, *, epsilon: float | None = None, clip: float = 1.0,
              options: Mapping[str, Any] | None = None) -> PrivacySpec:
    """ONE un-subsampled step (sample_rate 1, steps 1): the scope of every mechanism-level number."""
    from mechanisms.parts.plan import PrivacySpec

    return PrivacySpec(epsilon=epsilon, delta=delta, dataset_size=1, batch_size=1, epochs=1, clip=clip,
                       sigma=sigma, options=dict(options or {}))


def step_plan(mechanism: Mechanism, sigma: float | None, delta: float, *, epsilon: float | None = None,
              clip: float = 1.0, options: Mapping[str, Any] | None = None) -> PrivacyPlan:
    """The mechanism's own plan for one step: claimed and certified epsilon, or sigma for `epsilon`.

    Only the options the mechanism declares reach its plan (audits pass auditor-side keys such as
    `tensor_sizes` to `privatize_step`).

    Cached per (mechanism, numbers, options) when the options are hashable: a PLD accountant call
    costs ~0.2 s, far more than sampling and bounding a 20,000-sample audit.
    """
    options = mechanism.audit_options(dict(options or {}))
    items = tuple(sorted(options.items()))
    try:
        hash(items)
    except TypeError:
        return mechanism.plan(step_spec(sigma, delta, epsilon=epsilon, clip=clip, options=options))
    return _cached_plan(mechanism, sigma, delta, epsilon, clip, items)


@functools.lru_cache(maxsize=256)
def _cached_plan(mechanism: Mechanism, sigma: float | None, delta: float, epsilon: float | None, clip: float,
                 items: tuple[tuple[str, Any], ...]) -> PrivacyPlan:
    return mechanism.plan(step_spec(sigma, delta, epsilon=epsilon, clip=clip, options=dict(items)))


def claimed_step_tradeoff(mechanism: Mechanism, sigma: float, *, clip: float = 1.0,
                          options: Mapping[str, Any] | None = None) -> tradeoff.TradeOff | None:
    """The curve the mechanism claims for one step (its `claimed_step_tradeoff` hook)."""
    return mechanism.claimed_step_tradeoff(sigma, **dict(options or {}))


def claimed_profile(mechanism: Mechanism, sigma: float, *, clip: float = 1.0,
                    options: Mapping[str, Any] | None = None) -> tradeoff.TradeOff | None:
    """The claim for one step rebuilt from the mechanism's own plan: the envelope of f_{eps(delta), delta}
    over PROFILE_DELTAS (for a mechanism whose `claimed_step_tradeoff` returns this)."""
    curves: list[tradeoff.TradeOff] = []
    for delta in PROFILE_DELTAS:
        eps = step_plan(mechanism, sigma, delta, clip=clip, options=options).epsilon_claimed
        if eps is None:
            return None
        if math.isfinite(eps):
            curves.append(tradeoff.ApproxDP(eps, delta))
    return tradeoff.Envelope(tuple(curves)) if curves else None


def audit_cases(mechanism: Mechanism, dim: int, clip: float, seed: int,
                options: Mapping[str, Any] | None = None) -> Sequence[AuditCase]:
    """The Dirac case every mechanism gets, then the mechanism's own worst cases."""
    rng = np.random.default_rng([seed, 0xCA5E])
    cases = [dirac_case(dim, clip, rng)]
    cases.extend(mechanism.audit_cases(dim=dim, clip=clip, rng=rng, **dict(options or {})))
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise ValueError(f"audit case names must be unique, got {names}")
    return cases
