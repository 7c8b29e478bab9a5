"""Trade-off functions: a privacy claim as a whole curve, and the conversions an audit needs.

A mechanism is f-DP when every test between two neighbouring inputs has type II error
beta >= f(alpha) at type I error alpha (arXiv 1911.11607). An audit measures one
(alpha, beta) point with confidence bounds; the point proves a claim false when it lies strictly
below the claimed curve. Comparing curves, not one epsilon, matters: a Gaussian claim G_mu is
much stronger in the middle of the curve than the single (epsilon, delta) pair it implies, and a
mechanism with half the noise it claims is caught there first.

Conventions: alpha = P[guess "canary" | no canary] (false positive rate), beta = P[guess "no
canary" | canary] (false negative rate). Everything is vectorised over alpha/beta and NumPy/SciPy only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol, runtime_checkable

import numpy as np
import scipy.optimize
import scipy.stats
from numpy.typing import ArrayLike

from mechanisms.accounting.validation import require_delta

_norm = scipy.stats.norm


@runtime_checkable
class TradeOff(Protocol):
    """A claimed trade-off curve f: beta >= f(alpha) for every test of the claim's neighbours."""

    def __call__(self, alpha: ArrayLike) -> np.ndarray: ...

    @property
    def label(self) -> str: ...

    @property
    def mu(self) -> float | None:
        """The GDP parameter when the claim is exactly mu-GDP, else None."""


@dataclasses.dataclass(frozen=True)
class Gaussian:
    """G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu): the curve of N(0, 1) against N(mu, 1).

    One step of the Gaussian mechanism with sensitivity C and noise std sigma C is exactly
    G_{1/sigma}; computed through the survival function so that tiny alphas keep their precision.
    """

    mu: float

    def __post_init__(self) -> None:
        if not (self.mu >= 0 and math.isfinite(self.mu)):
            raise ValueError(f"mu must be a finite number >= 0, got {self.mu}")

    def __call__(self, alpha: ArrayLike) -> np.ndarray:
        alpha = np.clip(np.asarray(alpha, dtype=np.float64), 0.0, 1.0)
        return _norm.cdf(_norm.isf(alpha) - self.mu)

    @property
    def label(self) -> str:
        return f"G_mu(mu={self.mu:.6g})"


@dataclasses.dataclass(frozen=True)
class ApproxDP:
    """f_{eps,delta}(alpha) = max(0, 1 - delta - e^eps alpha, e^-eps (1 - delta - alpha)).

    The curve of an (epsilon, delta)-DP claim; a mechanism whose analysis gives one pair per step
    claims exactly this.
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not self.epsilon >= 0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}")
        require_delta(self.delta, zero=True, one=True)

    def __call__(self, alpha: ArrayLike) -> np.ndarray:
        alpha = np.clip(np.asarray(alpha, dtype=np.float64), 0.0, 1.0)
        if math.isinf(self.epsilon):
            return np.zeros_like(alpha)
        one = 1.0 - self.delta
        return np.maximum.reduce([np.zeros_like(alpha), one - math.exp(self.epsilon) * alpha,
                                  math.exp(-self.epsilon) * (one - alpha)])

    @property
    def label(self) -> str:
        return f"f_eps_delta(eps={self.epsilon:.6g}, delta={self.delta:.3g})"

    @property
    def mu(self) -> float | None:
        return None


@dataclasses.dataclass(frozen=True)
class Envelope:
    """Pointwise maximum of several claims that hold at once (e.g. a privacy profile eps(delta)).

    A mechanism that is f_i-DP for every i is max_i f_i-DP, so the envelope is itself a claim.
    """

    curves: tuple[TradeOff, ...]

    def __post_init__(self) -> None:
        if not self.curves:
            raise ValueError("an envelope needs at least one curve")

    def __call__(self, alpha: ArrayLike) -> np.ndarray:
        return np.maximum.reduce([np.asarray(c(alpha), dtype=np.float64) for c in self.curves])

    @property
    def label(self) -> str:
        return f"max of {len(self.curves)} curves"

    @property
    def mu(self) -> float | None:
        return None


def lies_below(curve: TradeOff, alpha: ArrayLike, beta: ArrayLike) -> np.ndarray:
    """True where (alpha, beta) is strictly below the curve: a test the claim says cannot exist.

    Fed with upper confidence bounds on both errors, a True is a refutation at that confidence,
    because a trade-off curve is non-increasing: beta <= beta_ub < f(alpha_ub) <= f(alpha).
    """
    return np.asarray(beta, dtype=np.float64) < curve(alpha)


def mu_from_errors(alpha: ArrayLike, beta: ArrayLike) -> np.ndarray:
    """The mu of the Gaussian curve through (alpha, beta): Phi^-1(1 - alpha) - Phi^-1(beta), >= 0.

    Fed with upper confidence bounds it is a lower bound on the mechanism's GDP parameter.
    """
    alpha = np.clip(np.asarray(alpha, dtype=np.float64), 0.0, 1.0)
    beta = np.clip(np.asarray(beta, dtype=np.float64), 0.0, 1.0)
    with np.errstate(invalid="ignore"):
        mu = _norm.isf(alpha) - _norm.ppf(beta)
    return np.maximum(np.nan_to_num(mu, nan=0.0), 0.0)


def epsilon_from_errors(alpha: ArrayLike, beta: ArrayLike, delta: float) -> np.ndarray:
    """Eq. 45 (arXiv 2407.15414): the largest eps with (alpha, beta) on f_{eps,delta}.

    eps = max(ln((1 - alpha - delta) / beta), ln((1 - beta - delta) / alpha), 0). Both logs come
    from the same test (the two linear pieces of f_{eps,delta}); with upper confidence bounds on
    alpha and beta the result is a lower bound on epsilon at that delta.
    """
    alpha = np.asarray(alpha, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.where((1 - alpha - delta > 0), np.log(1 - alpha - delta) - np.log(beta), -np.inf)
        second = np.where((1 - beta - delta > 0), np.log(1 - beta - delta) - np.log(alpha), -np.inf)
    return np.maximum(np.maximum(first, second), 0.0)


def gaussian_delta(mu: float, epsilon: float) -> float:
    """delta(eps; mu) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2): mu-GDP as (eps, delta)-DP.

    Exact for one Gaussian step; computed in log space so that large eps does not lose precision.
    """
    if mu <= 0:
        return 0.0
    a = _norm.logcdf(-epsilon / mu + mu / 2)
    b = epsilon + _norm.logcdf(-epsilon / mu - mu / 2)
    if b >= a:
        return 0.0
    return float(math.exp(a) * -math.expm1(b - a))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Smallest eps with mu-GDP implying (eps, delta)-DP (brentq on the dual formula, as TF-Privacy)."""
    require_delta(delta)
    if mu <= 0 or gaussian_delta(mu, 0.0) <= delta:
        return 0.0
    hi = 1.0
    while gaussian_delta(mu, hi) > delta:
        hi *= 2
    return float(scipy.optimize.brentq(lambda e: gaussian_delta(mu, e) - delta, 0.0, hi, xtol=1e-12))


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The mu whose Gaussian curve gives exactly (epsilon, delta): the GDP view of an (eps, delta) claim."""
    require_delta(delta)
    if math.isinf(epsilon):
        return math.inf
    hi = 1.0
    while gaussian_delta(hi, epsilon) < delta:
        hi *= 2
    return float(scipy.optimize.brentq(lambda m: gaussian_delta(m, epsilon) - delta, 1e-12, hi, xtol=1e-12))
