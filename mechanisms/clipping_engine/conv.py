"""`nn.Conv2d` (groups = 1, zero padding) through unfold, and its bias.

With A_i = unfold(x_i) in R^{(C kh kw) x T} (one column per output position, T = H_out W_out) the
convolution is y_i = W A_i + b, W reshaped to d x (C kh kw): a linear layer over T positions with
p = C kh kw, so per-sample norms and clipped sums are norms.outer_sum's (ghost: Gram matrices of the
unfolded patches and of the output gradients, T x T each; instantiated: G_i = g_i A_i^T). The bias
gradient is b_i = sum over positions of g_i. The patches are a strided view of the padded input copied once
(`patches`), faster than aten's im2col, which loops over the examples.
The input gradient is aten's convolution backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from mechanisms.clipping_engine.norms import instantiated, outer_sum, prefer_ghost
from mechanisms.clipping_engine.rules import Rule, Tap, exact_type, register


def _check(module: nn.Conv2d) -> str | None:
    if module.groups != 1:
        return f"groups={module.groups} (only groups=1 is supported)"
    if module.padding_mode != "zeros":
        return f"padding_mode={module.padding_mode!r} (only 'zeros' is supported)"
    if isinstance(module.padding, str) and module.padding != "valid":
        return f"padding={module.padding!r} (give explicit padding)"
    return None


def _padding(module: nn.Conv2d) -> tuple[int, ...]:
    return (0, 0) if isinstance(module.padding, str) else tuple(module.padding)


def patches(x: torch.Tensor, kernel: tuple[int, ...], dilation: tuple[int, ...], padding: tuple[int, ...],
            stride: tuple[int, ...]) -> torch.Tensor:
    """`F.unfold(x, ...)`, (B, C kh kw, H_out W_out), as one strided view of the padded input and one copy.

    aten's im2col loops over the examples; the view (Tensor.unfold over height and width, every
    `dilation`-th tap of a window of the dilated kernel's extent) is copied once into the same layout.
    """
    batch, channels = x.shape[:2]
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel, dilation, padding, stride
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    view = x.unfold(2, (kh - 1) * dh + 1, sh)[..., ::dh].unfold(3, (kw - 1) * dw + 1, sw)[..., ::dw]
    h_out, w_out = view.shape[2], view.shape[3]  # view: (B, C, H_out, W_out, kh, kw)
    return view.permute(0, 1, 4, 5, 2, 3).reshape(batch, channels * kh * kw, h_out * w_out)


class _Conv2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tap: Tap) -> torch.Tensor:
        module = tap.module
        ctx.save_for_backward(x, weight)
        ctx.tap, ctx.bias = tap, bias
        return F.conv2d(x, weight, bias, module.stride, _padding(module), module.dilation, 1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        tap = ctx.tap
        module = tap.module
        padding = _padding(module)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.nn.grad.conv2d_input(x.shape, weight.to(g.dtype), g, module.stride, padding,
                                                module.dilation, 1)
        batch, fan_out = g.shape[:2]
        g3 = tap.grouped(g.reshape(batch, fan_out, -1).transpose(1, 2), scaled=True)  # (B, T, d)
        if ctx.needs_input_grad[1]:
            a = tap.grouped(patches(x, module.kernel_size, module.dilation, padding, module.stride).transpose(1, 2))
            ghost = prefer_ghost(a.shape[1], a.shape[2], fan_out, tap.norm_mode)
            norm2, clipped, up = outer_sum(a, g3, ghost)
            shape = weight.shape
            tap.record(weight, norm2, lambda c: clipped(c).reshape(shape), up)
        if ctx.needs_input_grad[2]:
            tap.record(ctx.bias, *instantiated(g3.sum(1)))
        return grad_x, None, None, None


def forward(module: nn.Conv2d, tap: Tap, x: torch.Tensor) -> torch.Tensor:
    if not tap.live():
        return type(module).forward(module, x)
    return _Conv2d.apply(x, module.weight, module.bias, tap)


RULE = register(Rule("conv2d", exact_type(nn.Conv2d), ("weight", "bias"), forward, _check))
