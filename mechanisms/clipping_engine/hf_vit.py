"""Hugging Face `ViTEmbeddings`' own parameters: the [CLS] token and the position embeddings.

Both are added to every example unchanged: cls_token (1, 1, h) is concatenated in front of the patch
embeddings, position_embeddings (1, N + 1, h) is added to all positions. A parameter P broadcast over the
batch has per-sample gradient P_i = the gradient of example i's copy, so it is instantiated exactly by
giving every example its own copy (`_PerSampleCopy`: forward expands P to (B, ...), backward receives
(B, ...) = the per-sample gradients). The replaced forward is the Hugging Face one without masking or
position interpolation (those options are refused); the patch projection is an `nn.Conv2d` (conv.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.models.vit.modeling_vit import ViTEmbeddings

from mechanisms.clipping_engine.norms import instantiated
from mechanisms.clipping_engine.rules import Rule, Tap, register


def _matches(module: nn.Module) -> bool:
    cls = type(module)
    if cls.__name__ != "ViTEmbeddings" or not cls.__module__.startswith("transformers"):
        return False

    return cls is ViTEmbeddings


def _check(module: nn.Module) -> str | None:
    mask = getattr(module, "mask_token", None)
    if mask is not None and mask.requires_grad:
        return "a trainable mask_token (masked image modelling is not supported)"
    return None


class _PerSampleCopy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, param: torch.Tensor, batch: int, tap: Tap) -> torch.Tensor:
        ctx.tap, ctx.param = tap, param
        return param.detach().expand(batch, *param.shape[1:])

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        norm2, clipped, up = instantiated(ctx.tap.grouped(g.unsqueeze(1), scaled=True).sum(1))
        ctx.tap.record(ctx.param, norm2, lambda c: clipped(c).unsqueeze(0), up)
        return None, None, None


def _copies(param: torch.Tensor, batch: int, tap: Tap) -> torch.Tensor:
    if param.requires_grad:
        return _PerSampleCopy.apply(param, batch, tap)
    return param.expand(batch, *param.shape[1:])


def forward(module: nn.Module, tap: Tap, pixel_values: torch.Tensor, bool_masked_pos: Any = None,
            interpolate_pos_encoding: bool = False) -> torch.Tensor:
    if not tap.live():
        return type(module).forward(module, pixel_values, bool_masked_pos, interpolate_pos_encoding)
    if bool_masked_pos is not None or interpolate_pos_encoding:
        raise ValueError(f"book-keeping: {tap.name} (ViTEmbeddings) with bool_masked_pos or "
                         "interpolate_pos_encoding is not supported")
    batch, _, height, width = pixel_values.shape
    if (height, width) != tuple(module.image_size):
        raise ValueError(f"Input image size ({height}*{width}) doesn't match model ({module.image_size}).")
    embeddings = module.patch_embeddings(pixel_values)
    embeddings = torch.cat((_copies(module.cls_token, batch, tap), embeddings), dim=1)
    embeddings = embeddings + _copies(module.position_embeddings, batch, tap)
    return module.dropout(embeddings)


RULE = register(Rule("hf-vit-embeddings", _matches, ("cls_token", "position_embeddings", "mask_token"),
                     forward, _check))
