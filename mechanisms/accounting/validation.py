"""Argument checks shared by every accountant, so that bad input fails the same way everywhere.

Each check raises `ValueError` with a one-line message naming the argument; the CLI prints that line
and exits with code 2. Checks run before any numerical work, so no accountant ever guesses on nonsense.
"""

from __future__ import annotations

import math
import numbers

# The smallest noise multiplier privbench accepts (grids, `privbench privacy`, `privbench audit`): below it the
# accountants overflow, and epsilon is above 10^5 for a single step.
SIGMA_FLOOR = 1e-3


def require_positive(name: str, value: float, *, finite: bool = True) -> float:
    """`value > 0` (and finite unless `finite=False`), e.g. sigma, epsilon, sensitivity."""
    if not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if finite and math.isinf(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def require_delta(delta: float, *, zero: bool = False, one: bool = False, name: str = "delta") -> float:
    """`delta` in (0, 1), a guarantee's failure probability: the one range check of delta in privbench.

    An audit's delta may also be 0 (`zero`: an (epsilon, 0) claim, pure DP, is a curve it can test) or 1
    (`one`: a claim that holds trivially), which a plan's delta may not; `name` says which delta (a split of one)."""
    above = isinstance(delta, numbers.Real) and (0 <= delta if zero else 0 < delta)
    if not (above and (delta <= 1 if one else delta < 1)):
        raise ValueError(f"{name} must lie in {'[' if zero else '('}0, 1{']' if one else ')'}, got {delta}")
    return float(delta)


def require_sample_rate(sample_rate: float) -> float:
    if not isinstance(sample_rate, (int, float)) or not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate}")
    return float(sample_rate)


def require_steps(steps: int) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps}")
    return steps


def require_fraction(name: str, value: float) -> float:
    """A split of delta: strictly inside (0, 1) so that both parts stay positive."""
    if not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"{name} must lie in (0, 1), got {value}")
    return float(value)
