"""Analytic Gaussian mechanism (Balle & Wang 2018) and analytic matrix Gaussian mechanism (arXiv 2309.06746).

One release of `f(X) + N(0, sigma^2 I)` whose L2 sensitivity is `S` is (epsilon, delta)-DP **iff**

    delta(epsilon; r) = Phi(r/2 - epsilon/r) - e^epsilon Phi(-r/2 - epsilon/r) <= delta,  r = S / sigma

(Balle & Wang 2018, Thm 8; DP-Forward Lemma 5 / Eq. 4). The same curve is the mu-GDP dual with
mu = r (see `gdp.py`) and Theorem 6 of the shuffling paper at d = 1 (see `fenton_wilkinson.py`), so
all three share `gaussian_log_delta`, computed in log space so that e^epsilon never overflows.

`analytic_bound` is DP-Forward's Algorithm 1 with both branches: the largest ratio r = B(epsilon,
delta) that is still private. Theorem 6 then says matrix-Gaussian noise MN(0, Sigma, Psi) is
(epsilon, delta)-DP iff S / B <= sigma_min(U) sigma_min(V), with Sigma = U U^T and Psi = V V^T; only the
smallest eigenvalues of Sigma and Psi matter, so with scaled identities aMGM *is* aGM.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import optimize, special

from mechanisms.accounting.validation import require_delta, require_positive

_XTOL = 1e-14
_RTOL = 4 * np.finfo(float).eps


def _log_ndtr(x: float) -> float:
    return float(special.log_ndtr(x))


def _log_diff(log_a: float, log_b: float) -> float:
    """log(e^log_a - e^log_b), -inf when the difference is not positive."""
    if log_b >= log_a:
        return -math.inf
    return log_a + math.log(-math.expm1(log_b - log_a))


def gaussian_log_delta(epsilon: float, ratio: float) -> float:
    """log delta(epsilon; r) of one Gaussian release with sensitivity-to-noise ratio r (exact curve)."""
    if ratio == 0:
        return -math.inf
    if math.isinf(ratio):
        return 0.0
    log_a = _log_ndtr(ratio / 2 - epsilon / ratio)
    log_b = epsilon + _log_ndtr(-ratio / 2 - epsilon / ratio)
    return _log_diff(log_a, log_b)


def gaussian_delta(epsilon: float, ratio: float) -> float:
    """delta(epsilon; r) = Phi(r/2 - eps/r) - e^eps Phi(-r/2 - eps/r): the tight delta of a Gaussian."""
    return math.exp(gaussian_log_delta(epsilon, ratio))


def gaussian_epsilon(ratio: float, delta: float) -> float:
    """Smallest epsilon >= 0 with delta(epsilon; ratio) <= delta (never below the true value)."""
    log_delta = math.log(delta)

    def gap(eps: float) -> float:
        return gaussian_log_delta(eps, ratio) - log_delta

    if gap(0.0) <= 0:
        return 0.0
    hi = max(1.0, ratio * ratio)
    while gap(hi) > 0:
        hi *= 2
    eps = optimize.brentq(gap, 0.0, hi, xtol=_XTOL, rtol=_RTOL, maxiter=500)
    while gap(eps) > 0:  # brentq's root may sit a hair on the wrong side: step up to the safe side
        eps = eps * (1 + 1e-13) + 1e-15
    return float(eps)


@dataclasses.dataclass(frozen=True)
class AnalyticBound:
    """DP-Forward Algorithm 1's output: the largest private ratio B, and how it was found."""

    value: float  # B(epsilon, delta) = sensitivity / sigma of the analytic Gaussian mechanism
    delta0: float  # delta(epsilon; sqrt(2 epsilon)), the value at alpha = 1 that picks the branch
    branch: str  # "alpha<=1" (delta >= delta0) or "alpha>1" (delta < delta0, the usual case)


def analytic_bound(epsilon: float, delta: float) -> AnalyticBound:
    """Algorithm 1, A(epsilon, delta): B such that a Gaussian with S / sigma = B is exactly (eps, delta)-DP.

    Substituting r = sqrt(2 eps) / alpha turns delta(eps; r) into g+(v) (alpha <= 1, increasing in
    v = (1/alpha - alpha)^2 / 2) or g-(u) (alpha > 1, decreasing in u = (alpha - 1/alpha)^2 / 2). Both are
    solved with a bracketing root-finder (the released code's bisection of the u-branch runs the wrong
    way for delta >= delta0; here each branch keeps its own monotonicity). Computed in log space.
    """
    require_positive("epsilon", epsilon)
    require_delta(delta)
    eps = float(epsilon)
    log_delta0 = _log_diff(math.log(0.5), eps + _log_ndtr(-math.sqrt(2 * eps)))
    delta0 = math.exp(log_delta0)
    log_delta = math.log(delta)
    if log_delta >= log_delta0:
        # g+(v) = Phi(sqrt(eps v)) - e^eps Phi(-sqrt(eps (v + 2))), increasing; v* = sup{v : g+(v) <= delta}.
        def g_plus(v: float) -> float:
            log_a = math.log1p(-math.exp(_log_ndtr(-math.sqrt(eps * v))))
            return _log_diff(log_a, eps + _log_ndtr(-math.sqrt(eps * (v + 2)))) - log_delta

        hi = 1.0
        while g_plus(hi) < 0:
            hi *= 2
        v = optimize.brentq(g_plus, 0.0, hi, xtol=_XTOL, rtol=_RTOL, maxiter=500)
        while v > 0 and g_plus(v) > 0:  # sup{v : g+ <= delta}: stay on the private side
            v = max(0.0, v * (1 - 1e-13) - 1e-15)
        alpha = math.sqrt(1 + v / 2) - math.sqrt(v / 2)
        branch = "alpha<=1"
    else:
        # g-(u) = Phi(-sqrt(eps u)) - e^eps Phi(-sqrt(eps (u + 2))), decreasing; u* = inf{u : g-(u) <= delta}.
        def g_minus(u: float) -> float:
            return _log_diff(_log_ndtr(-math.sqrt(eps * u)),
                             eps + _log_ndtr(-math.sqrt(eps * (u + 2)))) - log_delta

        hi = 1.0
        while g_minus(hi) > 0:
            hi *= 2
        u = optimize.brentq(g_minus, 0.0, hi, xtol=_XTOL, rtol=_RTOL, maxiter=500)
        while g_minus(u) > 0:
            u = u * (1 + 1e-13) + 1e-15
        alpha = math.sqrt(1 + u / 2) + math.sqrt(u / 2)
        branch = "alpha>1"
    return AnalyticBound(value=math.sqrt(2 * eps) / alpha, delta0=delta0, branch=branch)


def agm_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest noise std of an (epsilon, delta)-DP Gaussian mechanism: sensitivity / B(epsilon, delta)."""
    require_positive("sensitivity", sensitivity)
    bound = analytic_bound(epsilon, delta).value
    sigma = sensitivity / bound
    while gaussian_log_delta(epsilon, sensitivity / sigma) > math.log(delta):  # rounding guard
        sigma *= 1 + 1e-13
    return sigma


def agm_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """Exact epsilon at `delta` of one Gaussian release with noise std `sigma` (inverse of `agm_sigma`)."""
    require_positive("sigma", sigma)
    require_delta(delta)
    require_positive("sensitivity", sensitivity)
    return gaussian_epsilon(sensitivity / sigma, delta)


def agm_delta(epsilon: float, sigma: float, sensitivity: float = 1.0) -> float:
    """Exact delta at `epsilon` of one Gaussian release with noise std `sigma`."""
    require_positive("sigma", sigma)
    require_positive("sensitivity", sensitivity)
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    return gaussian_delta(epsilon, sensitivity / sigma)


# --- analytic matrix Gaussian mechanism (DP-Forward, Theorem 6) --------------------------------------


def _smallest_singular_value(cov: np.ndarray, name: str) -> float:
    """sigma_min(U) for cov = U U^T, i.e. sqrt(lambda_min(cov)); cov must be symmetric positive definite."""
    cov = np.atleast_2d(np.asarray(cov, dtype=np.float64))
    if cov.ndim != 2 or cov.shape[0] != cov.shape[1]:
        raise ValueError(f"{name} must be a square matrix, got shape {cov.shape}")
    if not np.allclose(cov, cov.T, rtol=1e-10, atol=1e-12):
        raise ValueError(f"{name} must be symmetric")
    lam = float(np.linalg.eigvalsh(cov)[0])
    if not lam > 0:
        raise ValueError(f"{name} must be positive definite (smallest eigenvalue {lam})")
    return math.sqrt(lam)


def amgm_sigma(epsilon: float, delta: float, sensitivity: float = 1.0, releases: int = 1) -> float:
    """i.i.d. entry std of aMGM with Sigma, Psi scaled identities (the paper's choice): sqrt(k) S / B.

    `releases` = k independent releases of the same input with the same noise compose *exactly* into one
    Gaussian with ratio sqrt(k) S / sigma (privacy-loss variables of Gaussians add), so the total budget
    (epsilon, delta) over k releases needs sqrt(k) times the single-release noise.
    """
    if releases < 1:
        raise ValueError(f"releases must be >= 1, got {releases}")
    return agm_sigma(epsilon, delta, sensitivity) * math.sqrt(releases)


def amgm_scale(row_cov: np.ndarray, col_cov: np.ndarray, epsilon: float, delta: float,
               sensitivity: float = 1.0, releases: int = 1) -> float:
    """Smallest s such that noise MN(0, s^2 Sigma, Psi) is (epsilon, delta)-DP (Theorem 6).

    Theorem 6: private iff S / B <= sigma_n(U) sigma_d(V); scaling U by s scales sigma_n(U) by s.
    Sample the noise as s * U Z' V^T with Z' i.i.d. N(0, 1) (Lemma 7).
    """
    su = _smallest_singular_value(row_cov, "row_cov")
    sv = _smallest_singular_value(col_cov, "col_cov")
    return amgm_sigma(epsilon, delta, sensitivity, releases) / (su * sv)


def amgm_epsilon(row_cov: np.ndarray, col_cov: np.ndarray, delta: float, sensitivity: float = 1.0,
                 releases: int = 1) -> float:
    """Exact epsilon of MN(0, Sigma, Psi) noise: aGM epsilon at effective std sigma_n(U) sigma_d(V)."""
    if releases < 1:
        raise ValueError(f"releases must be >= 1, got {releases}")
    su = _smallest_singular_value(row_cov, "row_cov")
    sv = _smallest_singular_value(col_cov, "col_cov")
    return agm_epsilon(su * sv / math.sqrt(releases), delta, sensitivity)


def amgm_is_private(row_cov: np.ndarray, col_cov: np.ndarray, epsilon: float, delta: float,
                    sensitivity: float = 1.0, releases: int = 1) -> bool:
    """Theorem 6's condition sqrt(k) S / B(epsilon, delta) <= sigma_n(U) sigma_d(V)."""
    su = _smallest_singular_value(row_cov, "row_cov")
    sv = _smallest_singular_value(col_cov, "col_cov")
    return amgm_sigma(epsilon, delta, sensitivity, releases) <= su * sv * (1 + 1e-12)
