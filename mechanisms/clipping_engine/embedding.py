"""`nn.Embedding`: per-sample norms and clipped sums over the rows each example touches.

Example i with token ids (k_i1, ..., k_iT) and output gradients g_it has the sparse per-sample gradient
G_i = sum_t e_{k_it} g_it^T: row k of G_i is r_ik = sum_{t: k_it = k} g_it. The ghost form
||G_i||^2 = sum_{s,t} [k_is = k_it] (g_is . g_it) costs T^2 d per example; we instead instantiate only
the touched rows (at most T per example, B T d floats, the size of g itself): unique (example, id) pairs,
an index_add of the output gradients onto them, then ||G_i||^2 = sum_k |r_ik|^2. The clipped sum is
sum_i c_i G_i = index_add over ids of c_i r_ik. Positions holding `padding_idx` get no gradient, as in
torch's embedding backward. `max_norm` (renormalises weights in the forward), `scale_grad_by_freq` (a
per-batch rescaling) and `sparse` gradients are refused.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from mechanisms.clipping_engine.norms import gamma, inflate, narrow, sq_norms, unit_roundoff
from mechanisms.clipping_engine.rules import Rule, Tap, exact_type, register


def _check(module: nn.Embedding) -> str | None:
    if module.max_norm is not None:
        return "max_norm (renormalises weights inside the forward)"
    if module.scale_grad_by_freq:
        return "scale_grad_by_freq (a batch-dependent gradient rescaling)"
    if module.sparse:
        return "sparse=True (the engine writes dense gradients)"
    return None


def record_embedding(tap: Tap, weight: torch.Tensor, ids: torch.Tensor, g: torch.Tensor,
                     padding_idx: int | None) -> None:
    vocab, dim = weight.shape
    ids2 = tap.grouped(ids.reshape(ids.shape[0], -1, 1)).squeeze(2)  # a group's rows, one example's positions
    g2 = tap.grouped(g.reshape(ids.shape[0], -1, dim), scaled=True)
    batch = ids2.shape[0]
    if padding_idx is not None:
        g2 = g2 * (ids2 != padding_idx).unsqueeze(-1).to(g2.dtype)
    sample = torch.arange(batch, device=ids.device).unsqueeze(1)
    keys, where = torch.unique((sample * vocab + ids2).reshape(-1), return_inverse=True)
    rows = g2.new_zeros(keys.shape[0], dim).index_add_(0, where, g2.reshape(-1, dim))
    owner, row_id = keys // vocab, keys % vocab
    norms = sq_norms(rows)  # fp32 at least
    norm2 = norms.new_zeros(batch).index_add_(0, owner, norms)

    up = None
    if narrow(rows.dtype):  # each row's norm and the sum over an example's rows, then c and rows * c rounded
        u = unit_roundoff(rows.dtype)
        up = inflate(norm2, 2 * gamma(dim + ids2.shape[1] + 2, norms.dtype) + (1 + u) ** 4 - 1)

    def clipped_sum(c: torch.Tensor) -> torch.Tensor:
        return rows.new_zeros(vocab, dim).index_add_(0, row_id, rows * c.to(rows.dtype)[owner].unsqueeze(1))

    tap.record(weight, norm2, clipped_sum, up)


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, weight: torch.Tensor, tap: Tap) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.tap, ctx.weight = tap, weight
        return F.embedding(ids, weight, tap.module.padding_idx)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        (ids,) = ctx.saved_tensors
        record_embedding(ctx.tap, ctx.weight, ids, g, ctx.tap.module.padding_idx)
        return None, None, None


def forward(module: nn.Embedding, tap: Tap, ids: torch.Tensor) -> torch.Tensor:
    if not tap.live():
        return type(module).forward(module, ids)
    return _Embedding.apply(ids, module.weight, tap)


RULE = register(Rule("embedding", exact_type(nn.Embedding), ("weight",), forward, _check))
