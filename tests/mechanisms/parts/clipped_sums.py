"""Per-example gradients and the clipped sums Opacus' optimizer really computes from them, for the tests of the
clipping and noise parts' declared sensitivities."""

from __future__ import annotations

import math

import dp_accounting
import torch
from opacus.optimizers import DPOptimizer, DPPerLayerOptimizer

ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE = dp_accounting.NeighboringRelation.REPLACE_ONE
SHAPES = [(3, 4), (4,), (2, 2, 2)]


def grads(batch: int, scale: float, gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(batch, *s, generator=gen, dtype=torch.float64) * scale for s in SHAPES]


def opacus_clipped_sum(clipper, per_example: list[torch.Tensor]) -> list[torch.Tensor]:
    """The clipping that really runs: Opacus' optimizer on explicit per-sample gradients."""
    params = [torch.nn.Parameter(torch.zeros(g.shape[1:], dtype=torch.float64)) for g in per_example]
    for p, g in zip(params, per_example, strict=True):
        p.grad_sample = g.clone()
    cls = DPOptimizer if clipper.opacus_clipping == "flat" else DPPerLayerOptimizer
    opt = cls(torch.optim.SGD(params, lr=0.1), noise_multiplier=0.0, max_grad_norm=clipper.max_grad_norm,
              expected_batch_size=len(per_example[0]))
    opt.clip_and_accumulate()
    return [p.summed_grad for p in params]


def distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(((x - y) ** 2).sum()) for x, y in zip(a, b, strict=True)))
