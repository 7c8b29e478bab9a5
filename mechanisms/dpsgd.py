"""DP-SGD (Abadi et al. 2016) through Opacus: Poisson sampling, flat per-sample clipping, Gaussian noise.

The reference mechanism: its claimed epsilon is the reference accountant's, so claimed == certified.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numpy as np

from mechanisms.accountants import DpsgdEvents, calibrate_sigma, epsilon
from mechanisms.auditing import tradeoff
from mechanisms.plan import PrivacyPlan, PrivacySpec

ID = "dpsgd"
AUDIT_COORDINATEWISE = True  # Gaussian noise, independent per coordinate


def claimed_step_tradeoff(sigma: float, **_: Any) -> tradeoff.TradeOff:
    """One un-subsampled step is the Gaussian mechanism: exactly G_{1/sigma}."""
    return tradeoff.Gaussian(mu=1.0 / sigma)


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


NoiseAdder = Callable[[Any], None]  # replaces DPOptimizer.add_noise: summed_grad -> grad, per parameter
AfterStep = Callable[[Any, Any], None]  # (model, optimizer) after every update, e.g. a weight permutation


def make_private(model: Any, optimizer: Any, loader: Any, plan: PrivacyPlan, *, criterion: Any,
                 clip: float = 1.0, grad_sample_mode: str = "hooks", noise_generator: Any = None,
                 add_noise: NoiseAdder | None = None, after_step: AfterStep | None = None,
                 clipping: str = "flat", **_: Any) -> tuple[Any, Any, Any, Any]:
    """Opacus' wrap: the loader Poisson-samples, the optimizer clips per sample and adds noise.

    Mechanisms that differ from DP-SGD in one part pass that part: `add_noise(optimizer)` replaces
    Opacus' Gaussian noise step (it reads `p.summed_grad`, writes `p.grad`, before averaging), and
    `after_step(model, optimizer)` runs after each parameter update. Returns (model, optimizer, loader,
    criterion); in Opacus' `ghost` mode and in `bk` mode the criterion is wrapped so `loss.backward()` clips.
    """
    if grad_sample_mode == "bk":  # book-keeping clipping in one backward pass (mechanisms/bookkeeping)
        from mechanisms.bookkeeping.private import make_private as bk_make_private

        module, dp_optimizer, loader, criterion = bk_make_private(
            model, optimizer, loader, noise_multiplier=plan.sigma, max_grad_norm=clip, criterion=criterion,
            poisson_sampling=plan.sampler == "poisson", clipping=clipping, noise_generator=noise_generator)
        wrapped = (module, dp_optimizer, criterion, loader)  # the ghost mode's order
    else:
        from opacus import PrivacyEngine

        engine = PrivacyEngine(accountant="prv")  # Opacus' accountant is unused: we account from the plan
        wrapped = engine.make_private(
            module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=plan.sigma,
            max_grad_norm=clip, poisson_sampling=plan.sampler == "poisson", grad_sample_mode=grad_sample_mode,
            noise_generator=noise_generator, criterion=criterion, clipping=clipping,
        )
    if len(wrapped) == 4:  # ghost and bk: (module, optimizer, criterion, loader)
        module, dp_optimizer, criterion, loader = wrapped
    else:
        module, dp_optimizer, loader = wrapped
    if add_noise is not None:
        dp_optimizer.add_noise = types.MethodType(add_noise, dp_optimizer)
    if after_step is not None:
        step = dp_optimizer.step

        def step_then(closure: Any = None) -> Any:
            result = step(closure)
            if not dp_optimizer._is_last_step_skipped:
                after_step(module, dp_optimizer)
            return result

        dp_optimizer.step = step_then
    return module, dp_optimizer, loader, criterion


def privatize_step(sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator,
                   **_: Any) -> np.ndarray:
    """One release of clipped-gradient sums (rows): add N(0, (sigma clip)^2) to every coordinate."""
    sums = np.asarray(sums, dtype=np.float64)
    return sums + rng.standard_normal(sums.shape) * (sigma * clip)
