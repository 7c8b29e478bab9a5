"""Clopper-Pearson bounds on an error rate measured from k events in n independent trials.

Exact (never below the nominal coverage), which is what a lower bound on epsilon needs: an
approximate interval that under-covers would turn noise into a false "violated".
"""

from __future__ import annotations

import numpy as np
import scipy.stats
from numpy.typing import ArrayLike


def clopper_pearson_upper(k: ArrayLike, n: int, significance: float) -> np.ndarray:
    """p_ub with P[Binomial(n, p) <= k] <= significance for every p >= p_ub (one-sided).

    1.0 when k == n (nothing excludes p = 1).
    """
    if not 0 < significance < 1:
        raise ValueError(f"significance must lie in (0, 1), got {significance}")
    k = np.asarray(k)
    if np.any(k < 0) or np.any(k > n):
        raise ValueError("counts must lie in [0, n]")
    safe_k = np.minimum(k, n - 1)
    # isf(s), not ppf(1 - s): 1 - s rounds to 1 below s ~ 1e-16, where a p-value search (step_audit) looks
    return np.where(k < n, scipy.stats.beta.isf(significance, safe_k + 1, n - safe_k), 1.0)


def clopper_pearson_lower(k: ArrayLike, n: int, significance: float) -> np.ndarray:
    """p_lb with P[Binomial(n, p) >= k] <= significance for every p <= p_lb; 0.0 when k == 0."""
    k = np.asarray(k)
    return 1.0 - clopper_pearson_upper(n - k, n, significance)
