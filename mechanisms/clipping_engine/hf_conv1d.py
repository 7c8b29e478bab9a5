"""Hugging Face `Conv1D` (GPT-2's projections): y = x W + b with W stored (in, out).

The same linear map as `nn.Linear` with the weight transposed, so the same per-sample gradients
(linear.record_linear with `transpose=True`: the (out, in) gradient G_i, transposed to W's layout).
transformers is imported only when a module from it is seen.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from mechanisms.clipping_engine.linear import record_linear
from mechanisms.clipping_engine.rules import Rule, Tap, register


def _matches(module: nn.Module) -> bool:
    cls = type(module)
    if cls.__name__ != "Conv1D" or not cls.__module__.startswith("transformers"):
        return False

    return cls is Conv1D


class _Conv1D(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tap: Tap) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.tap, ctx.bias = tap, bias
        out = x.reshape(-1, x.shape[-1]).matmul(weight)
        if bias is not None:
            out = out + bias
        return out.view(*x.shape[:-1], weight.shape[1])

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        grad_x = g.matmul(weight.t().to(g.dtype)) if ctx.needs_input_grad[0] else None
        record_linear(ctx.tap, x, g, weight if ctx.needs_input_grad[1] else None,
                      ctx.bias if ctx.needs_input_grad[2] else None, transpose=True)
        return grad_x, None, None, None


def forward(module: nn.Module, tap: Tap, x: torch.Tensor) -> torch.Tensor:
    if not tap.live():
        return type(module).forward(module, x)
    return _Conv1D.apply(x, module.weight, module.bias, tap)


RULE = register(Rule("hf-conv1d", _matches, ("weight", "bias"), forward))
