"""DP-SGD (Abadi et al. 2016) through Opacus: Poisson sampling, flat per-sample clipping, Gaussian noise.

The reference mechanism: its claimed epsilon is the reference accountant's, so claimed == certified.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mechanisms.accountants import DpsgdEvents, calibrate_sigma, epsilon
from mechanisms.plan import PrivacyPlan, PrivacySpec

ID = "dpsgd"


def events_for(spec: PrivacySpec) -> DpsgdEvents:
    return DpsgdEvents(spec.sample_rate, spec.steps, spec.sampler, spec.dataset_size)


def plan(spec: PrivacySpec) -> PrivacyPlan:
    events = events_for(spec)
    sigma = spec.sigma if spec.sigma is not None else calibrate_sigma(
        events, spec.epsilon, spec.delta, spec.accountant).sigma
    eps = epsilon(events(sigma), spec.delta, spec.accountant)
    return PrivacyPlan(
        mechanism=ID, sigma=sigma, sample_rate=spec.sample_rate, steps=spec.steps, delta=spec.delta,
        sampler=spec.sampler, accountant=spec.accountant, claimed_by=spec.accountant,
        epsilon_claimed=eps, epsilon_certified=eps, effective_event=events(sigma),
    )


def make_private(model: Any, optimizer: Any, loader: Any, plan: PrivacyPlan, *, criterion: Any,
                 clip: float = 1.0, grad_sample_mode: str = "hooks", noise_generator: Any = None,
                 **_: Any) -> tuple[Any, Any, Any, Any]:
    """Opacus' wrap: the loader Poisson-samples, the optimizer clips per sample and adds noise.

    Returns (model, optimizer, loader, criterion); in Opacus' `ghost` mode the criterion is wrapped so
    that `loss.backward()` runs the two-pass ghost clipping.
    """
    from opacus import PrivacyEngine

    engine = PrivacyEngine(accountant="prv")  # Opacus' accountant is unused: we account from the plan
    wrapped = engine.make_private(
        module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=plan.sigma,
        max_grad_norm=clip, poisson_sampling=plan.sampler == "poisson", grad_sample_mode=grad_sample_mode,
        noise_generator=noise_generator, criterion=criterion,
    )
    if len(wrapped) == 4:  # ghost mode: Opacus returns (module, optimizer, criterion, loader)
        module, optimizer, criterion, loader = wrapped
        return module, optimizer, loader, criterion
    return (*wrapped, criterion)


def privatize_step(sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator,
                   **_: Any) -> np.ndarray:
    """One release of clipped-gradient sums (rows): add N(0, (sigma clip)^2) to every coordinate."""
    sums = np.asarray(sums, dtype=np.float64)
    return sums + rng.standard_normal(sums.shape) * (sigma * clip)
