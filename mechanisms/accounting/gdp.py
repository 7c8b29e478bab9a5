"""mu-GDP central limit theorem accountant (Bu, Dong, Long, Su 2020; arXiv 1911.11607).

A *claimed* accountant: the CLT is an approximation, not a bound. It under-reports epsilon for few
steps or small sample_rate * steps (up to ~5x), and over-reports at sample_rate = 1 (arXiv 1911.11607 §8).
Use it for `epsilon_claimed` of `dpsgd-gdp`, never for `epsilon_certified`.

    mu_poisson = q sqrt(T (e^{1/sigma^2} - 1))                                      (paper, Poisson)
    mu_uniform = sqrt(2) q sqrt(T) sqrt(e^{1/sigma^2} Phi(1.5/sigma) + 3 Phi(-0.5/sigma) - 2)
                                                         (TF-Privacy `compute_mu_uniform`, same authors)
    delta(epsilon; mu) = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2)  (exact dual)

The dual is the analytic-Gaussian curve with ratio mu, so conversions reuse `analytic_gaussian`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from scipy import optimize
from scipy.stats import norm

from mechanisms.accounting.analytic_gaussian import gaussian_epsilon, gaussian_log_delta
from mechanisms.accounting.validation import (
    require_delta,
    require_positive,
    require_sample_rate,
    require_steps,
)

if TYPE_CHECKING:
    from mechanisms.accounting.events import DpsgdRun

SAMPLERS = ("poisson", "uniform")


def _expm1_inv_sq(sigma: float) -> float:
    """e^{1/sigma^2} - 1, inf (not an OverflowError) for sigma below ~0.038."""
    x = 1.0 / (sigma * sigma)
    return math.inf if x > 700 else math.expm1(x)


def mu_poisson(sigma: float, sample_rate: float, steps: int) -> float:
    """CLT mu of T Poisson-subsampled Gaussian steps (the paper's Theorem, p sqrt(T) -> nu)."""
    require_positive("sigma", sigma)
    require_sample_rate(sample_rate)
    require_steps(steps)
    return sample_rate * math.sqrt(steps * _expm1_inv_sq(sigma))


def mu_uniform(sigma: float, sample_rate: float, steps: int) -> float:
    """CLT mu for fixed-size batches drawn uniformly (TF-Privacy's `compute_mu_uniform`)."""
    require_positive("sigma", sigma)
    require_sample_rate(sample_rate)
    require_steps(steps)
    if 1.0 / sigma**2 > 700:
        return math.inf
    inner = (math.exp(1.0 / sigma**2) * norm.cdf(1.5 / sigma) + 3 * norm.cdf(-0.5 / sigma) - 2)
    return math.sqrt(2) * sample_rate * math.sqrt(steps) * math.sqrt(inner)


def mu_of(sigma: float, sample_rate: float, steps: int, sampler: str = "poisson") -> float:
    if sampler == "poisson":
        return mu_poisson(sigma, sample_rate, steps)
    if sampler == "uniform":
        return mu_uniform(sigma, sample_rate, steps)
    raise ValueError(f"unknown GDP sampler {sampler!r}; known: {', '.join(SAMPLERS)}")


def delta_from_mu(epsilon: float, mu: float) -> float:
    """Exact delta(epsilon) of a mu-GDP mechanism (log space: no overflow of e^epsilon)."""
    require_positive("mu", mu)
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    return math.exp(gaussian_log_delta(epsilon, mu))


def epsilon_from_mu(mu: float, delta: float) -> float:
    """Smallest epsilon with delta(epsilon; mu) <= delta (TF-Privacy's `eps_from_mu`, unbounded bracket)."""
    require_positive("mu", mu, finite=False)
    require_delta(delta)
    if math.isinf(mu):
        return math.inf
    return gaussian_epsilon(mu, delta)


def mu_from_epsilon(epsilon: float, delta: float) -> float:
    """Largest mu whose mu-GDP guarantee implies (epsilon, delta)-DP (delta increases with mu)."""
    require_positive("epsilon", epsilon)
    require_delta(delta)
    log_delta = math.log(delta)

    def gap(log_mu: float) -> float:
        return gaussian_log_delta(epsilon, math.exp(log_mu)) - log_delta

    lo, hi = -1.0, 1.0
    while gap(lo) > 0:
        lo -= 2
    while gap(hi) < 0:
        hi += 2
    log_mu = optimize.brentq(gap, lo, hi, xtol=1e-14, maxiter=500)
    while gap(log_mu) > 0:  # keep mu on the private side
        log_mu -= 1e-14
    return math.exp(log_mu)


def epsilon(sigma: float, sample_rate: float, steps: int, delta: float, sampler: str = "poisson") -> float:
    """What the CLT claims for T steps of DP-SGD with noise multiplier sigma."""
    return epsilon_from_mu(mu_of(sigma, sample_rate, steps, sampler), delta)


def sigma_for_epsilon(epsilon: float, delta: float, sample_rate: float, steps: int,
                      sampler: str = "poisson") -> float:
    """Noise multiplier the CLT picks for a target: closed form for Poisson, root-finding for uniform.

    Poisson: e^{1/sigma^2} - 1 = mu*^2 / (q^2 T)  =>  sigma = 1 / sqrt(log1p(mu*^2 / (q^2 T))).
    """
    require_sample_rate(sample_rate)
    require_steps(steps)
    mu_target = mu_from_epsilon(epsilon, delta)
    if sampler == "poisson":
        sigma = 1.0 / math.sqrt(math.log1p(mu_target**2 / (sample_rate**2 * steps)))
        while mu_poisson(sigma, sample_rate, steps) > mu_target:  # rounding guard
            sigma *= 1 + 1e-13
        return sigma
    if sampler == "uniform":
        def gap(log_sigma: float) -> float:
            return mu_uniform(math.exp(log_sigma), sample_rate, steps) - mu_target

        lo, hi = -1.0, 1.0
        while gap(lo) < 0:
            lo -= 1
        while gap(hi) > 0:
            hi += 1
        log_sigma = optimize.brentq(gap, lo, hi, xtol=1e-14, maxiter=500)
        while gap(log_sigma) > 0:
            log_sigma += 1e-14
        return math.exp(log_sigma)
    raise ValueError(f"unknown GDP sampler {sampler!r}; known: {', '.join(SAMPLERS)}")


def run_epsilon(run: DpsgdRun, delta: float) -> float:
    """The CLT's epsilon of a DP-SGD run (`events.DpsgdRun`): what `accountant.GDP` reports."""
    sampler = "poisson" if run.sampler == "poisson" else "uniform"
    return epsilon(run.noise_multiplier, run.sampling_probability, run.steps, delta, sampler)
