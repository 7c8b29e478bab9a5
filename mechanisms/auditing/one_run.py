"""Steinke, Nasr & Jagielski (NeurIPS 2023), "Privacy auditing with one (1) training run".

m canaries are each included independently with probability 1/2; after one run the auditor
guesses "in" for some canaries and abstains on the rest. If the run is (eps, delta)-DP with respect
to every canary, the number of correct guesses W among r guesses satisfies

    P[W >= v] <= P[Binomial(r, e^eps / (1 + e^eps)) >= v] + 2 m delta max_{1<=i<=v} (tail(v-i) - tail(v)) / i

(their Theorem 3 with the delta term; the same p-value as jax_privacy's `_one_run_p_value`). The
epsilon lower bound is the largest eps whose p-value is still below the significance level.
"""

from __future__ import annotations

import numpy as np
import scipy.optimize
import scipy.special
import scipy.stats

_binom = scipy.stats.binom


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
    if not 0 <= delta <= 1:
        raise ValueError(f"delta must lie in [0, 1], got {delta}")

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
