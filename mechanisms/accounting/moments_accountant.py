"""The moments accountant as papers published it (Abadi et al. 2016 / TF-Privacy before 2020).

A *claimed* accountant, kept because published DP-SGD numbers used it: RDP of the Poisson-subsampled
Gaussian at TF-Privacy's orders, converted with the classic rule epsilon = min_a [T RDP(a) +
log(1/delta) / (a - 1)]. It is sound but loose: the MNIST tutorial setting (sigma 1.1, q 256/60000,
60 epochs) gives 3.01 here, 2.60 with the improved RDP conversion and 2.39 with PLD (anchors §2.3).
It is also what the GDP paper compares against (arXiv 1911.11607 §7.3: 1.35 and 8.68 for its Figure 4).
RDP values come from Opacus' public `compute_rdp`, an implementation independent of dp-accounting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from opacus.accountants.analysis.rdp import compute_rdp

from mechanisms.accounting.validation import (
    require_delta,
    require_positive,
    require_sample_rate,
    require_steps,
)

TF_PRIVACY_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


if TYPE_CHECKING:
    from mechanisms.accounting.events import DpsgdRun

def epsilon_classic(sigma: float, sample_rate: float, steps: int, delta: float,
                    orders: tuple[float, ...] = TF_PRIVACY_ORDERS, once: tuple[float, ...] = ()) -> float:
    """Epsilon of T Poisson-subsampled Gaussian steps with the classic RDP -> (epsilon, delta) conversion, composed
    (RDP adds up) with one unsampled Gaussian release per multiplier in `once`."""
    require_positive("sigma", sigma)
    require_sample_rate(sample_rate)
    require_steps(steps)
    require_delta(delta)

    order_array = np.asarray(orders, dtype=np.float64)
    rdp = np.asarray(compute_rdp(q=sample_rate, noise_multiplier=sigma, steps=steps, orders=list(orders)))
    for z in once:
        require_positive("a one-time release's noise multiplier", z)
        rdp = rdp + np.asarray(compute_rdp(q=1.0, noise_multiplier=z, steps=1, orders=list(orders)))
    return float(np.min(rdp + np.log(1 / delta) / (order_array - 1)))


def run_epsilon(run: DpsgdRun, delta: float) -> float:
    """The classic moments accountant's epsilon of a Poisson-sampled DP-SGD run: what `accountant.MA_CLASSIC`
    reports."""
    return epsilon_classic(run.noise_multiplier, run.sampling_probability, run.steps, delta, once=run.once)
