"""Shuffled DP-SGD's own accountant (Yang, Ji, Xiang 2024; arXiv 2407.15414).

A *claimed* accountant. Per step, Theorem 6 approximates the shuffled Gaussian's privacy loss with a
Fenton-Wilkinson log-normal fit and calls the result a bound; the paper itself says it is "an
approximated lower bound to delta", and an adaptive audit refutes it (arXiv 2407.15414 §4.3). Never certify
with it. Reproduce it faithfully so the platform can expose the gap.

Theorem 6 (Eq. 25/26), noise multiplier sigma (noise std sigma c), released vector norm <= c',
model dimension d; with x = 1/sigma^2, a1 = d c'/((d-1) c sigma^2), a2 = d (c + c')/((d-1) c sigma^2):

    zeta1 = -log(1 + (d-1) e^{-a1})              zeta2 = -log(1 + (d-1) e^{-a2}) - x
    s_i^2 = log[(1 + (d-1) e^{-2 a_i}) / (1 + (d-1) e^{-a_i})^2 (e^x - 1) + 1]
    h = Phi(s1/2 + (zeta1 - eps)/s1) - e^eps Phi(s2/2 + (zeta2 - eps)/s2)  <=  delta      (claimed DP)

At d = 1, zeta1 = 0, zeta2 = -x, s1 = s2 = 1/sigma and h is exactly the analytic Gaussian mechanism's
delta. Every term is evaluated with logaddexp / log_ndtr, so d up to 1e9 and tiny sigma are stable.
h drops off a cliff near sigma^2 ~ (c'/c) / log d and is negative beyond, so the inverse looks for the
*first* crossing from above.

Across steps (paper §IV, Steinke 2022 Thm 22 and Thm 29): advanced composition with slack
delta' = delta_split * delta, per-step delta (1 - delta_split) delta / T, then "de-amplification" by
the sampling rate q. `batch_clip_ratio` = c'/c; without batch clipping the sum of B clipped gradients
has norm <= B c, so `batch_size` stands in for it. The paper gives neither c' nor the split: both are
parameters here, defaulting to our reading (split 1/2).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from scipy import optimize, special

from mechanisms.accounting.composition import (
    advanced_composition,
    advanced_composition_step,
    amplify,
    deamplify,
)
from mechanisms.accounting.validation import (
    require_delta,
    require_fraction,
    require_positive,
    require_sample_rate,
    require_steps,
)

SIGMA_MIN, SIGMA_MAX = 1e-3, 1e6


if TYPE_CHECKING:
    from mechanisms.accounting.events import DpsgdRun

def _logaddexp0(x: float) -> float:
    """log(1 + e^x) without overflow."""
    return x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))


def check_dim(dim: float) -> float:
    if not isinstance(dim, (int, float)) or math.isnan(dim) or dim < 1 or math.isinf(dim):
        raise ValueError(f"dim must be a finite number >= 1, got {dim}")
    return float(dim)


def batch_clip_ratio_of(batch_clip_ratio: float | None = None, batch_size: int | None = None) -> float:
    """c'/c: the batch-clipping ratio if the mechanism clips the summed gradient, else the batch size."""
    if batch_clip_ratio is not None:
        return require_positive("batch_clip_ratio", batch_clip_ratio)
    if batch_size is not None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return float(batch_size)
    raise ValueError("the Fenton-Wilkinson accountant needs batch_clip_ratio (c'/c) or batch_size")


def per_step_delta(sigma: float, epsilon: float, dim: float, batch_clip_ratio: float = 1.0) -> float:
    """Theorem 6's h (may be negative): the delta the paper claims for one shuffled Gaussian step."""
    require_positive("sigma", sigma)
    dim = check_dim(dim)
    ratio = require_positive("batch_clip_ratio", batch_clip_ratio)
    x = 1.0 / (sigma * sigma)
    log_expm1_x = x + math.log(-math.expm1(-x))  # log(e^x - 1)
    if dim == 1:
        l1 = l1b = l2 = l2b = 0.0
    else:
        log_dm1 = math.log(dim - 1)
        a1 = dim * ratio * x / (dim - 1)
        a2 = dim * (1 + ratio) * x / (dim - 1)
        l1, l1b = _logaddexp0(log_dm1 - a1), _logaddexp0(log_dm1 - 2 * a1)
        l2, l2b = _logaddexp0(log_dm1 - a2), _logaddexp0(log_dm1 - 2 * a2)
    zeta1, zeta2 = -l1, -l2 - x
    s1 = math.sqrt(_logaddexp0(l1b - 2 * l1 + log_expm1_x))
    s2 = math.sqrt(_logaddexp0(l2b - 2 * l2 + log_expm1_x))
    log_a = float(special.log_ndtr(s1 / 2 + (zeta1 - epsilon) / s1))
    log_b = epsilon + float(special.log_ndtr(s2 / 2 + (zeta2 - epsilon) / s2))
    return math.exp(log_a) - math.exp(log_b)


def per_step_epsilon(sigma: float, delta_step: float, dim: float, batch_clip_ratio: float = 1.0) -> float:
    """Smallest per-step epsilon the paper's condition accepts at noise multiplier sigma (0 if any)."""
    require_delta(delta_step)

    def gap(eps: float) -> float:
        return per_step_delta(sigma, eps, dim, batch_clip_ratio) - delta_step

    if gap(0.0) <= 0:
        return 0.0
    hi = 1.0
    while gap(hi) > 0:
        hi *= 2
        if hi > 1e6:
            return math.inf
    eps = optimize.brentq(gap, 0.0, hi, xtol=1e-13, maxiter=500)
    while gap(eps) > 0:
        eps = eps * (1 + 1e-12) + 1e-15
    return float(eps)


def per_step_sigma(epsilon_step: float, delta_step: float, dim: float, batch_clip_ratio: float = 1.0) -> float:
    """Smallest sigma with h <= delta_step: the first crossing from above, scanning up from SIGMA_MIN."""
    require_positive("epsilon_step", epsilon_step)
    require_delta(delta_step)

    def gap(log_sigma: float) -> float:
        return per_step_delta(math.exp(log_sigma), epsilon_step, dim, batch_clip_ratio) - delta_step

    step = math.log(1.25)
    lo = math.log(SIGMA_MIN)
    if gap(lo) <= 0:
        raise ValueError(f"the per-step condition already holds at sigma {SIGMA_MIN}; widen SIGMA_MIN")
    hi = lo + step
    while gap(hi) > 0:
        lo, hi = hi, hi + step
        if hi > math.log(SIGMA_MAX):
            raise ValueError(f"no sigma <= {SIGMA_MAX:g} meets the per-step condition "
                             f"(epsilon_step={epsilon_step}, delta_step={delta_step})")
    log_sigma = optimize.brentq(gap, lo, hi, xtol=1e-13, maxiter=500)
    while gap(log_sigma) > 0:
        log_sigma += 1e-13
    return math.exp(log_sigma)


@dataclasses.dataclass(frozen=True)
class StepBudget:
    """How the paper splits a total (epsilon, delta) into one step's budget."""

    epsilon_step: float  # per step, before amplification by subsampling
    delta_step: float
    epsilon_amplified: float  # per step, after amplification (what advanced composition composes)
    delta_amplified: float
    delta_slack: float  # delta' of advanced composition


def step_budget(epsilon: float, delta: float, sample_rate: float, steps: int,
                delta_split: float = 0.5) -> StepBudget:
    """Invert advanced composition and amplification: the per-step (epsilon_s, delta_s) Thm 6 must meet."""
    require_positive("epsilon", epsilon)
    require_delta(delta)
    require_sample_rate(sample_rate)
    require_steps(steps)
    require_fraction("delta_split", delta_split)
    delta_slack = delta_split * delta
    delta_amplified = (1 - delta_split) * delta / steps
    eps_amplified = advanced_composition_step(epsilon, steps, delta_slack)
    eps_step, delta_step = deamplify(eps_amplified, delta_amplified, sample_rate)
    if not delta_step < 1:
        raise ValueError(f"per-step delta {delta_step:g} >= 1: delta is too large for this sample_rate")
    return StepBudget(eps_step, delta_step, eps_amplified, delta_amplified, delta_slack)


def sigma_for_epsilon(epsilon: float, delta: float, sample_rate: float, steps: int, dim: float, *,
                      batch_clip_ratio: float | None = None, batch_size: int | None = None,
                      delta_split: float = 0.5) -> float:
    """Noise multiplier the paper's accountant picks for a target (at `dim` = 1: unshuffled, aGM-based)."""
    ratio = batch_clip_ratio_of(batch_clip_ratio, batch_size)
    budget = step_budget(epsilon, delta, sample_rate, steps, delta_split)
    return per_step_sigma(budget.epsilon_step, budget.delta_step, dim, ratio)


def epsilon(sigma: float, sample_rate: float, steps: int, delta: float, dim: float, *,
            batch_clip_ratio: float | None = None, batch_size: int | None = None,
            delta_split: float = 0.5) -> float:
    """What the paper's accountant claims for T steps at noise multiplier sigma (inverse of the above)."""
    require_positive("sigma", sigma)
    require_sample_rate(sample_rate)
    require_steps(steps)
    require_delta(delta)
    require_fraction("delta_split", delta_split)
    ratio = batch_clip_ratio_of(batch_clip_ratio, batch_size)
    delta_slack = delta_split * delta
    delta_step = (1 - delta_split) * delta / steps / sample_rate
    if not delta_step < 1:
        raise ValueError(f"per-step delta {delta_step:g} >= 1: delta is too large for this sample_rate")
    eps_step = per_step_epsilon(sigma, delta_step, dim, ratio)
    if math.isinf(eps_step):
        return math.inf
    eps_amplified, _ = amplify(eps_step, delta_step, sample_rate)
    return advanced_composition(eps_amplified, steps, delta_slack)[0]


@dataclasses.dataclass(frozen=True)
class ShuffledCalibration:
    """Algorithm 1's noise choice: the shuffled sigma, unless the plain (d = 1) one is smaller."""

    sigma: float  # the noise multiplier the mechanism uses
    sigma_shuffled: float  # Theorem 6 at the model dimension
    sigma_unshuffled: float  # the same pipeline at d = 1 (the paper's sigma_0)
    shuffled: bool  # False when Algorithm 1 falls back to plain DP-SGD (sigma_shuffled >= sigma_0)


def calibrate(epsilon: float, delta: float, sample_rate: float, steps: int, dim: float, *,
              batch_clip_ratio: float | None = None, batch_size: int | None = None,
              delta_split: float = 0.5) -> ShuffledCalibration:
    """The paper's full noise choice (Alg. 1 line 3: fall back to sigma_0 when shuffling does not help)."""
    kwargs = dict(batch_clip_ratio=batch_clip_ratio, batch_size=batch_size, delta_split=delta_split)
    shuffled = sigma_for_epsilon(epsilon, delta, sample_rate, steps, dim, **kwargs)
    plain = sigma_for_epsilon(epsilon, delta, sample_rate, steps, 1, **kwargs)
    return ShuffledCalibration(min(shuffled, plain), shuffled, plain, shuffled < plain)


def run_epsilon(run: DpsgdRun, delta: float) -> float:
    """Theorem 6 + advanced composition for a DP-SGD run carrying d and c'/c (or B): what
    `accountant.FENTON_WILKINSON` reports."""
    return epsilon(run.noise_multiplier, run.sampling_probability, run.steps, delta, run.dim,
                   batch_clip_ratio=run.batch_clip_ratio, batch_size=run.batch_size, delta_split=run.delta_split)
