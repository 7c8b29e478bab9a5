"""Generic (epsilon, delta) composition and amplification rules used by the papers' own analyses.

These are *claimed*-side tools: loose but simple rules that seed papers use (shuffled DP-SGD composes
per-step guarantees with advanced composition; DP-Forward adds label randomized response by basic
composition). Sound in themselves, they are only as good as the per-step guarantee fed in.

* Basic composition: (sum eps_j, sum delta_j).
* Advanced composition (Steinke 2022, Thm 22, as the shuffling paper quotes it as its Thm 1): for any
  delta_slack > 0, eps = min{sum eps_j, 1/2 sum eps_j^2 + sqrt(2 log(1/delta_slack) sum eps_j^2)},
  delta = sum delta_j + delta_slack.
* Amplification by subsampling (Steinke 2022, Thm 29; Balle et al. 2018): (eps, delta) ->
  (log(1 + p (e^eps - 1)), p delta), with p the largest probability that a record is used.
* Randomized response on labels (Warner 1965): keep the label with probability e^eps / (e^eps + K - 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mechanisms.accounting.validation import (
    require_delta,
    require_positive,
    require_sample_rate,
    require_steps,
)


def basic_composition(epsilons: Sequence[float], deltas: Sequence[float] | None = None) -> tuple[float, float]:
    """(sum of epsilons, sum of deltas): e.g. Gaussian noise (eps1, delta) + label RR (eps2, 0)."""
    if not epsilons:
        raise ValueError("basic_composition needs at least one epsilon")
    deltas = list(deltas) if deltas is not None else [0.0] * len(epsilons)
    if len(deltas) != len(epsilons):
        raise ValueError("epsilons and deltas must have the same length")
    if any(e < 0 for e in epsilons) or any(d < 0 for d in deltas):
        raise ValueError("epsilons and deltas must be >= 0")
    return float(sum(epsilons)), float(sum(deltas))


def advanced_composition(epsilon_step: float, steps: int, delta_slack: float,
                         delta_step: float = 0.0) -> tuple[float, float]:
    """T-fold composition of an (epsilon_step, delta_step) mechanism: (epsilon, delta) (Steinke Thm 22)."""
    if not epsilon_step >= 0:
        raise ValueError(f"epsilon_step must be >= 0, got {epsilon_step}")
    require_steps(steps)
    require_delta(delta_slack)
    require_delta(delta_step, zero=True, name="delta_step")
    sum_sq = steps * epsilon_step**2
    advanced = sum_sq / 2 + math.sqrt(2 * math.log(1 / delta_slack) * sum_sq)
    return min(steps * epsilon_step, advanced), steps * delta_step + delta_slack


def advanced_composition_step(epsilon: float, steps: int, delta_slack: float) -> float:
    """Largest per-step epsilon whose T-fold advanced composition stays <= epsilon (inverse of the above).

    Both branches of the min increase with the per-step epsilon, so the answer is the larger of
    epsilon / T and the positive root of T x^2 / 2 + x sqrt(2 T log(1/delta_slack)) = epsilon.
    """
    require_positive("epsilon", epsilon)
    require_steps(steps)
    require_delta(delta_slack)
    b = math.sqrt(2 * steps * math.log(1 / delta_slack))
    # positive root of (T/2) x^2 + b x - epsilon = 0, written to avoid cancellation when b^2 >> T eps
    root = 2 * epsilon / (b + math.sqrt(b * b + 2 * steps * epsilon))
    return max(epsilon / steps, root)


def amplify(epsilon: float, delta: float, sample_rate: float) -> tuple[float, float]:
    """Privacy amplification by subsampling: (log(1 + p (e^eps - 1)), p delta)."""
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    require_sample_rate(sample_rate)
    if sample_rate == 1:
        return epsilon, delta
    if epsilon > 1.0:  # log(q e^eps + 1 - q) without overflow for huge epsilon (inf stays inf)
        return float(np.logaddexp(math.log(sample_rate) + epsilon, math.log1p(-sample_rate))), sample_rate * delta
    return math.log1p(sample_rate * math.expm1(epsilon)), sample_rate * delta


def deamplify(epsilon: float, delta: float, sample_rate: float) -> tuple[float, float]:
    """The per-step (eps, delta) before subsampling that amplifies to (epsilon, delta): `amplify`'s inverse."""
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    require_sample_rate(sample_rate)
    return math.log1p(math.expm1(epsilon) / sample_rate), delta / sample_rate


def rr_keep_probability(epsilon: float, num_classes: int) -> float:
    """Probability of keeping the true label under epsilon-DP K-ary randomized response."""
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    return 1.0 / (1.0 + (num_classes - 1) * math.exp(-epsilon))


def rr_epsilon(keep_probability: float, num_classes: int) -> float:
    """Epsilon of K-ary randomized response keeping the label with probability p (others uniform).

    epsilon = log(p (K - 1) / (1 - p)); e.g. DP-Forward's binary labels with p = 0.9 give log 9.
    """
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if not 1.0 / num_classes <= keep_probability < 1:
        raise ValueError(f"keep_probability must lie in [1/K, 1), got {keep_probability}")
    return math.log(keep_probability * (num_classes - 1) / (1 - keep_probability))
