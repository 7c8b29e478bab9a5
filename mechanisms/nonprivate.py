"""The utility and speed reference: the same training loop and batch geometry, with no DP work at all."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from mechanisms.mechanism import Mechanism

if TYPE_CHECKING:
    import torch

    from mechanisms.parts.plan import PrivacyPlan, PrivacySpec
    from mechanisms.private_training import PrivateTraining

ID = "nonprivate"


class NonPrivate(Mechanism):
    ID = ID
    private = False

    def plan(self, spec: PrivacySpec) -> PrivacyPlan:
        """No privacy: no sigma, no epsilons; the sampler is shuffling, as ordinary training."""
        import dp_accounting

        from mechanisms.parts.plan import PrivacyPlan

        selection = dataclasses.replace(spec, sampler="shuffle").batch_selection
        return PrivacyPlan(
            mechanism=ID, sigma=None, sample_rate=selection.sample_rate, steps=selection.steps, delta=spec.delta,
            sampler=selection.name, accountant=spec.accountant, claimed_by=None, epsilon_claimed=None,
            epsilon_certified=None, effective_event=dp_accounting.NonPrivateDpEvent(), extra={"options": {}},
            batch=selection,
        )

    def make_private(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Any, plan: PrivacyPlan, *,
                     criterion: Any, generator: torch.Generator, **_: Any) -> PrivateTraining:
        from mechanisms.private_training import PrivateTraining, plan_loader

        return PrivateTraining(module, optimizer, plan_loader(data, plan, generator), criterion)

    def privatize_step(self, sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator,
                       **_: Any) -> np.ndarray:
        """No privatisation: what the auditor sees is the clipped sum itself."""
        return np.asarray(sums, dtype=np.float64)

    def claimed_step_tradeoff(self, sigma: float, **_: Any) -> None:
        """Claims nothing."""
        return None


mechanism = NonPrivate()

__all__ = ["ID", "NonPrivate", "mechanism"]
