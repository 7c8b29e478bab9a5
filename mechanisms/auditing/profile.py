"""A mechanism's claim for ONE un-subsampled step rebuilt from its own plan: the envelope of
f_{eps(delta_i), delta_i} over a grid of deltas, a sound inner approximation of its claimed privacy profile, for a
mechanism whose `claimed_step_tradeoff` has no closed form (`Mechanism.claimed_step_tradeoff`'s default when the
mechanism writes its own `claim`).

Only the claimed epsilon is read, which the contract check never changes (it withdraws the certificate, not the
claim), so the plan comes from `mechanism.plan` itself: the mechanism contract calls this module, and this module
needs nothing above it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mechanisms.auditing import tradeoff
from mechanisms.parts.plan import PrivacySpec

if TYPE_CHECKING:
    from mechanisms.framework.mechanism import Mechanism
    from mechanisms.parts.plan import PrivacySpec

# deltas at which the profile reads the claimed privacy profile from plan(...)
PROFILE_DELTAS = (0.5, 0.3, 0.2, 0.1, 0.05, 0.02, 1e-2, 5e-3, 2e-3, *(10.0 ** -k for k in range(3, 13)))


def step_spec(sigma: float | None, delta: float, *, epsilon: float | None = None, clip: float = 1.0,
              options: Mapping[str, Any] | None = None, batch_size: int | None = None) -> PrivacySpec:
    """ONE un-subsampled step (sample_rate 1, steps 1) on a batch of the trial's expected size (1 by default):
    the scope of every mechanism-level number."""
    batch = int(batch_size or 1)
    return PrivacySpec(epsilon=epsilon, delta=delta, dataset_size=batch, batch_size=batch, epochs=1, clip=clip,
                       sigma=sigma, options=dict(options or {}))


def step_options(mechanism: Mechanism, options: Mapping[str, Any] | None,
                 ) -> tuple[int | None, dict[str, Any], tuple[tuple[str, Any], ...] | None]:
    """(the step's batch size, the options the mechanism declares, the same as a cache key or None when they are
    not hashable): only declared options reach a step's plan (audits also pass auditor-side keys such as
    `tensor_sizes`), and `batch_size` among them sets the step's batch (`step_spec`)."""
    batch = (options or {}).get("batch_size")
    declared = mechanism.audit_options(dict(options or {}))
    items = tuple(sorted(declared.items()))
    try:
        hash(items)
    except TypeError:
        return batch, declared, None
    return batch, declared, items


def claimed_profile(mechanism: Mechanism, sigma: float, *, clip: float = 1.0,
                    options: Mapping[str, Any] | None = None) -> tradeoff.TradeOff | None:
    """The claim for one step rebuilt from the mechanism's own plan: the envelope of f_{eps(delta), delta}
    over PROFILE_DELTAS."""
    batch, options, items = step_options(mechanism, options)  # items None: planned afresh at each delta
    curves: list[tradeoff.TradeOff] = []
    for delta in PROFILE_DELTAS:
        eps = (_claimed(mechanism, sigma, delta, clip, items, batch) if items is not None else
               mechanism.plan(step_spec(sigma, delta, clip=clip, options=options, batch_size=batch)).epsilon_claimed)
        if eps is None:
            return None
        if math.isfinite(eps):
            curves.append(tradeoff.ApproxDP(eps, delta))
    return tradeoff.Envelope(tuple(curves)) if curves else None


@functools.lru_cache(maxsize=1024)
def _claimed(mechanism: Mechanism, sigma: float, delta: float, clip: float, items: tuple[tuple[str, Any], ...],
             batch_size: int | None) -> float | None:
    """The claimed epsilon of one step, cached per (mechanism, numbers, options): a PLD accountant call costs
    ~0.2 s, and the profile asks at 19 deltas for every audit of the same step."""
    spec = step_spec(sigma, delta, clip=clip, options=dict(items), batch_size=batch_size)
    return mechanism.plan(spec).epsilon_claimed


__all__ = ["PROFILE_DELTAS", "claimed_profile", "step_options", "step_spec"]
