"""`nn.Linear`, with or without positions between the batch and feature dimensions, and its bias.

y_it = W a_it + b for every position t of example i (all dimensions between the first and the last are
positions). Per-sample gradients: G_i = sum_t g_it a_it^T (norms.outer_sum: ghost norm or instantiated,
by the mixed rule) and b_i = sum_t g_it (always instantiated, B x d). The backward pass computes only
dL/da = g W; the weight gradient of autograd is never formed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from mechanisms.clipping_engine.norms import instantiated, outer_sum, prefer_ghost
from mechanisms.clipping_engine.rules import Rule, Tap, autocast_weight, exact_type, register


def record_linear(tap: Tap, a: torch.Tensor, g: torch.Tensor, weight: torch.Tensor | None,
                  bias: torch.Tensor | None, transpose: bool = False) -> None:
    """Report weight and bias of a linear map from activations a (B, ..., p) and output grads g (B, ..., d).

    `transpose`: the weight is stored (p, d) (Hugging Face `Conv1D`), so its gradient is G_i^T.
    """
    batch = a.shape[0]
    a3 = tap.grouped(a.reshape(batch, -1, a.shape[-1]))
    g3 = tap.grouped(g.reshape(batch, -1, g.shape[-1]), scaled=True)
    if weight is not None:
        ghost = prefer_ghost(a3.shape[1], a3.shape[2], g3.shape[2], tap.norm_mode)
        norm2, clipped, up = outer_sum(a3, g3, ghost)
        tap.record(weight, norm2, (lambda c: clipped(c).t()) if transpose else clipped, up)
    if bias is not None:
        tap.record(bias, *instantiated(g3.sum(1)))


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tap: Tap) -> torch.Tensor:
        low = autocast_weight(weight)
        ctx.save_for_backward(x, low)
        ctx.tap, ctx.bias, ctx.weight = tap, bias, weight
        return F.linear(x, low, bias)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        x, low = ctx.saved_tensors
        tap = ctx.tap
        grad_x = g.matmul(low.to(g.dtype)) if ctx.needs_input_grad[0] else None
        record_linear(tap, x, g, ctx.weight if ctx.needs_input_grad[1] else None,
                      ctx.bias if ctx.needs_input_grad[2] else None)
        return grad_x, None, None, None


def forward(module: nn.Linear, tap: Tap, x: torch.Tensor) -> torch.Tensor:
    if not tap.live():
        return F.linear(x, module.weight, module.bias)
    return _Linear.apply(x, module.weight, module.bias, tap)


RULE = register(Rule("linear", exact_type(nn.Linear), ("weight", "bias"), forward))
