"""Opacus' wrap with the book-keeping engine in place of its per-sample gradient modes.

Mirrors `opacus.PrivacyEngine.make_private` for `grad_sample_mode="bk"`: the loader Poisson-samples
(Opacus' `DPDataLoader`), the engine leaves sum_i c_i G_i in `p.grad`, and Opacus'
`DPOptimizerFastGradientClipping` (the optimizer of its ghost mode) accumulates that into `p.summed_grad`,
adds N(0, (sigma C)^2) per coordinate and divides by the expected batch size: the noise step is Opacus'
own, so mechanisms that replace `add_noise` (reading `p.summed_grad`) work unchanged. Per-layer clipping
uses the flat-equivalent bound sqrt(sum_j C_j^2) for the noise, as Opacus' `DPPerLayerOptimizer` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mechanisms.bookkeeping.engine import BookkeepingEngine, BookkeepingLoss


def make_private(module: torch.nn.Module, optimizer: torch.optim.Optimizer, data_loader: Any, *,
                 noise_multiplier: float, max_grad_norm: float | Sequence[float], criterion: Any,
                 poisson_sampling: bool = True, clipping: str = "flat", noise_generator: Any = None,
                 norm_mode: str = "mixed") -> tuple[torch.nn.Module, Any, Any, BookkeepingLoss]:
    """Returns (module, optimizer, loader, criterion) like Opacus' ghost mode; the module is the same
    object with the engine attached (`module.bookkeeping` is the engine)."""
    from opacus.data_loader import DPDataLoader
    from opacus.optimizers import DPOptimizerFastGradientClipping

    clipping = "per_layer" if clipping in ("per_layer", "per-layer") else clipping
    engine = BookkeepingEngine(module, max_grad_norm, clipping=clipping, norm_mode=norm_mode)
    module.bookkeeping = engine
    if clipping == "per_layer":
        flat_bound = torch.norm(torch.Tensor(list(max_grad_norm)), p=2).item()  # Opacus' DPPerLayerOptimizer
    else:
        flat_bound = float(max_grad_norm)  # type: ignore[arg-type]
    sample_rate = 1 / len(data_loader)
    expected_batch_size = int(len(data_loader.dataset) * sample_rate)
    if poisson_sampling:
        data_loader = DPDataLoader.from_data_loader(data_loader, generator=None, distributed=False)
    reduction = getattr(criterion, "reduction", "mean")
    dp_optimizer = DPOptimizerFastGradientClipping(
        optimizer, noise_multiplier=noise_multiplier, max_grad_norm=flat_bound,
        expected_batch_size=expected_batch_size, loss_reduction=reduction, generator=noise_generator)
    return module, dp_optimizer, data_loader, BookkeepingLoss(engine, criterion)
