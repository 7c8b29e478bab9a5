"""Steinke, Nasr & Jagielski (NeurIPS 2023), "Privacy auditing with one (1) training run".

m canaries are each included independently with probability 1/2; after one run the auditor
guesses "in" for some canaries and abstains on the rest. If the run is (eps, delta)-DP with respect
to every canary, the number of correct guesses W among r guesses satisfies

    P[W >= v] <= P[Binomial(r, e^eps / (1 + e^eps)) >= v] + 2 m delta max_{1<=i<=v} (tail(v-i) - tail(v)) / i

(their Theorem 3 with the delta term; the same p-value as jax_privacy's `_one_run_p_value`). The
epsilon lower bound is the largest eps whose p-value is still below the significance level.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import dp_accounting
import numpy as np
import scipy.optimize
import scipy.special
import scipy.stats

from mechanisms.accounting.validation import require_delta

_binom = scipy.stats.binom
ndtr, ndtri = scipy.special.ndtr, scipy.special.ndtri


def one_run_p_value(m: int, n_guess: int, n_correct: int, epsilon: float, delta: float) -> float:
    """Probability of >= n_correct right guesses out of n_guess under an (epsilon, delta) claim."""
    if not 0 <= n_correct <= n_guess <= m:
        raise ValueError(f"need 0 <= n_correct <= n_guess <= m, got {n_correct}, {n_guess}, {m}")
    q = scipy.special.expit(epsilon)
    tail = _binom.sf(n_correct - 1, n_guess, q)  # P[Binomial >= n_correct]
    if delta == 0 or n_correct == 0:
        return float(tail)
    i = np.arange(1, n_correct + 1)
    extra = (_binom.sf(n_correct - i - 1, n_guess, q) - tail) / i
    return float(min(tail + 2 * m * delta * max(float(np.max(extra)), 0.0), 1.0))


def epsilon_one_run(m: int, n_guess: int, n_correct: int, significance: float, delta: float,
                    epsilon_floor: float = 0.0) -> float:
    """Largest eps whose (eps, delta) claim the guesses reject at `significance`, or `epsilon_floor`.

    `epsilon_floor` lets a search over thresholds skip claims already rejected at a better one.
    """
    if not 0 < significance < 1:
        raise ValueError(f"significance must lie in (0, 1), got {significance}")
    require_delta(delta, zero=True, one=True)

    def rejected_by(eps: float) -> float:  # > 0 when the claim (eps, delta) is rejected
        return significance - one_run_p_value(m, n_guess, n_correct, eps, delta)

    # With delta = 0 the p-value is smallest; if even that does not reject, nothing above the floor does.
    if one_run_p_value(m, n_guess, n_correct, epsilon_floor, 0.0) > significance:
        return epsilon_floor
    if rejected_by(epsilon_floor) <= 0:
        return epsilon_floor
    lo, hi = epsilon_floor, max(1.0, 2 * epsilon_floor)
    while rejected_by(hi) > 0:
        lo, hi = hi, 2 * hi
    return float(scipy.optimize.brentq(rejected_by, lo, hi, xtol=1e-6))


# -- Mahloujifar, Melis & Chaudhuri (2024, arXiv 2410.22235): the same guesses, tested against a curve --------

FDP_FAMILIES = ("gdp", "approx-dp")


@functools.lru_cache(maxsize=4096)
def _blow_up_inverse(family: str, epsilon: float, delta: float) -> Callable[[float], float]:
    """x -> the smallest alpha whose blow-up 1 - f(alpha) reaches x, for the curve f of the claim.

    `gdp`: f = G_mu with mu the GDP parameter whose (epsilon, delta) profile passes through (epsilon,
    delta) (jax_privacy's choice); `approx-dp`: f = f_{epsilon, delta}, the weakest curve of any
    (epsilon, delta)-DP mechanism, so a rejection holds for every mechanism, Gaussian-shaped or not.
    """
    if family == "gdp":
        sigma = dp_accounting.get_sigma_gaussian(epsilon, delta)
        if sigma == 0:
            return lambda x: float(x == 1.0)
        mu = 1.0 / sigma
        return lambda x: float(ndtr(ndtri(x) - mu))
    if family == "approx-dp":
        e_pos, e_neg = math.exp(-epsilon), math.exp(min(epsilon, 700.0))
        return lambda x: max(0.0, (x - delta) * e_pos, 1.0 - delta - e_neg * (1.0 - x))
    raise ValueError(f"family must be one of {FDP_FAMILIES}, got {family!r}")


def fdp_objective(m: int, n_guess: int, n_correct: int, epsilon: float, delta: float, significance: float,
                  family: str = "gdp") -> float:
    """> 0 when the guesses reject the claim "f-DP with respect to every canary" at `significance`.

    The recursion of the paper's `audit_rh_with_cap` (as jax_privacy's `_epsilon_one_run_fdp`):
    r and h bound the expected fractions of right and wrong guesses any f-DP run can produce once
    the observed counts are reached with probability `significance`; the claim is rejected when
    r + h falls short of the fraction of canaries actually guessed.
    """
    return curve_objective(m, n_guess, n_correct, _blow_up_inverse(family, float(epsilon), float(delta)), significance)


def curve_objective(m: int, n_guess: int, n_correct: int, inv: Callable[[float], float], significance: float) -> float:
    """`fdp_objective` against any claimed curve, given as its blow-up inverse `inv` (see `_blow_up_inverse`)."""
    r = significance * n_correct / m
    h = significance * (n_guess - n_correct) / m
    for i in range(n_correct - 1, -1, -1):
        h_new = max(h, inv(r))
        if h_new == h:  # neither h nor r can change any more
            break
        r = min(r + (i / (n_guess - i)) * (h_new - h), 1.0)
        h = h_new
    return r + h - n_guess / m


def epsilon_one_run_fdp(m: int, n_guess: int, n_correct: int, significance: float, delta: float,
                        epsilon_floor: float = 0.0, family: str = "gdp") -> float:
    """Largest eps whose curve (see `_blow_up_inverse`) the guesses reject, or `epsilon_floor`."""
    if not 0 < significance < 1:
        raise ValueError(f"significance must lie in (0, 1), got {significance}")
    require_delta(delta)
    if not 0 <= n_correct <= n_guess <= m:
        raise ValueError(f"need 0 <= n_correct <= n_guess <= m, got {n_correct}, {n_guess}, {m}")

    def rejected_by(eps: float) -> float:
        return fdp_objective(m, n_guess, n_correct, eps, delta, significance, family)

    if n_correct == 0 or rejected_by(epsilon_floor) <= 0:
        return epsilon_floor
    lo, hi = epsilon_floor, max(1.0, 2 * epsilon_floor)
    while rejected_by(hi) > 0:
        lo, hi = hi, 2 * hi
        if hi > 1e3:  # every guess right and no curve short of non-private fits: report the bracket
            return lo
    return float(scipy.optimize.brentq(rejected_by, lo, hi, xtol=1e-6))
