"""DP-SGD whose noise multiplier is chosen with the mu-GDP central limit theorem (Bu, Dong, Long, Su 2020).

Training is exactly `dpsgd`; only the analysis differs. The CLT is an approximation: with few steps or
small q*T it under-reports epsilon (research/seed_003_gdp.md section 8), so the sigma it picks is
certified by PLD at that same sigma and the leaderboard shows both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mechanisms import dpsgd
from mechanisms.accountants import DpsgdEvents, calibrate_sigma, epsilon, gdp
from mechanisms.auditing import tradeoff
from mechanisms.plan import PrivacyPlan, PrivacySpec

ID = "dpsgd-gdp"
AUDIT_COORDINATEWISE = True  # DP-SGD's noise


def claimed_step_tradeoff(sigma: float, **_: Any) -> tradeoff.TradeOff:
    """The CLT formula at q = 1, T = 1: mu = sqrt(e^{1/sigma^2} - 1) (> 1/sigma: conservative for one step)."""
    return tradeoff.Gaussian(mu=gdp.mu_poisson(sigma, 1.0, 1))


def _gdp_sampler(sampler: str) -> str:
    return "poisson" if sampler == "poisson" else "uniform"


def plan(spec: PrivacySpec) -> PrivacyPlan:
    """`claimed` calibration: the CLT's sigma for the target (the paper); `certified`: PLD's sigma."""
    events = DpsgdEvents(spec.sample_rate, spec.steps, spec.sampler, spec.dataset_size)
    sampler = _gdp_sampler(spec.sampler)
    if spec.sigma is not None:
        sigma = spec.sigma
    elif spec.calibration == "claimed":
        sigma = gdp.sigma_for_epsilon(spec.epsilon, spec.delta, spec.sample_rate, spec.steps, sampler)
    else:
        sigma = calibrate_sigma(events, spec.epsilon, spec.delta, spec.accountant).sigma
    mu = gdp.mu_of(sigma, spec.sample_rate, spec.steps, sampler)
    claimed = gdp.epsilon_from_mu(mu, spec.delta)
    certified = epsilon(events(sigma), spec.delta, "pld")
    return PrivacyPlan(
        mechanism=ID, sigma=sigma, sample_rate=spec.sample_rate, steps=spec.steps, delta=spec.delta,
        sampler=spec.sampler, accountant=spec.accountant, claimed_by=f"gdp-clt ({sampler})",
        epsilon_claimed=claimed, epsilon_certified=certified, effective_event=events(sigma),
        notes="CLT under-reports epsilon here" if certified is not None and certified > claimed else "",
        extra={"mu_claimed": mu},
    )


make_private = dpsgd.make_private


def privatize_step(sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator, **kw: Any) -> np.ndarray:
    """The noise is DP-SGD's: only the analysis that picked sigma differs."""
    return dpsgd.privatize_step(sums, sigma, clip, rng, **kw)
