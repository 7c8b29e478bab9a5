"""`nn.LayerNorm`'s affine parameters.

y = xhat * w + b with xhat = (x - mean) * rstd over the normalised dimensions. Per-sample gradients are
small (the normalised shape) and instantiated: w_i = sum over positions of g_i * xhat_i, b_i = sum over
positions of g_i. Forward and input gradient are aten's fused `native_layer_norm` and its backward, asked
for the input gradient only; xhat is rebuilt from the saved mean and rstd.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mechanisms.clipping_engine.norms import instantiated
from mechanisms.clipping_engine.rules import Rule, Tap, exact_type, register


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                tap: Tap) -> torch.Tensor:
        module = tap.module
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, list(module.normalized_shape), weight, bias,
                                                           module.eps)
        ctx.save_for_backward(x, mean, rstd, weight, bias)
        ctx.tap = tap
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        x, mean, rstd, weight, bias = ctx.saved_tensors
        tap = ctx.tap
        shape = list(tap.module.normalized_shape)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.ops.aten.native_layer_norm_backward(g, x, shape, mean, rstd, weight, bias,
                                                               [True, False, False])[0]
        batch = x.shape[0]
        g3 = tap.grouped(g.reshape(batch, -1, *shape), scaled=True)
        if ctx.needs_input_grad[1]:
            xhat = tap.grouped(((x - mean) * rstd).reshape(batch, -1, *shape))
            tap.record(weight, *instantiated((g3 * xhat).sum(1)))
        if ctx.needs_input_grad[2]:
            tap.record(bias, *instantiated(g3.sum(1)))
        return grad_x, None, None, None


def forward(module: nn.LayerNorm, tap: Tap, x: torch.Tensor) -> torch.Tensor:
    if not tap.live():
        return type(module).forward(module, x)
    return _LayerNorm.apply(x, module.weight, module.bias, tap)


RULE = register(Rule("layernorm", exact_type(nn.LayerNorm), ("weight", "bias"), forward))
