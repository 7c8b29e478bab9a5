"""One generic, cached root-finder: the smallest sigma whose epsilon stays at or below a target."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable

import dp_accounting
from dp_accounting import mechanism_calibration

from mechanisms.accountants.reference import FRESH

EventFamily = Callable[[float], dp_accounting.DpEvent]


@dataclasses.dataclass(frozen=True)
class Calibration:
    sigma: float
    epsilon: float  # achieved; never above the target


@functools.lru_cache(maxsize=1024)
def calibrate_sigma(
    events: EventFamily | Hashable, epsilon: float, delta: float, accountant: str = "pld",
    rel_tol: float = 1e-3,
) -> Calibration:
    """Smallest sigma (to `rel_tol`) with epsilon(events(sigma)) <= epsilon. `events` must be hashable."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if accountant not in FRESH:
        raise ValueError(f"unknown accountant {accountant!r}; known: {', '.join(sorted(FRESH))}")
    try:
        sigma = mechanism_calibration.calibrate_dp_mechanism(
            FRESH[accountant], events, epsilon, delta,
            bracket_interval=mechanism_calibration.LowerEndpointAndGuess(1e-2, 1.0),
            tol=rel_tol * 0.25,
        )
    except mechanism_calibration.NoBracketIntervalFoundError as e:  # pragma: no cover - rare
        raise ValueError(f"no sigma reaches epsilon {epsilon} at delta {delta}") from e
    acc = FRESH[accountant]()
    achieved = float(acc.compose(events(sigma)).get_epsilon(delta))
    return Calibration(sigma=float(sigma), epsilon=achieved)
