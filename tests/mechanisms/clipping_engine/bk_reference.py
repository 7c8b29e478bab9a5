"""The slow references the engine is checked against: Opacus' hooks (`GradSampleModule`) and one example
at a time (micro-batches of one), each giving per-sample norms and Opacus-style clipped sums."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from mechanisms.clipping_engine import BookkeepingEngine, BookkeepingLoss


def no_dropout(module: nn.Module) -> nn.Module:
    """Deterministic training-mode forwards (Opacus' hooks record only in training mode)."""
    for sub in module.modules():
        if isinstance(sub, nn.Dropout):
            sub.p = 0.0
    return module


def clipped(per_sample: list[torch.Tensor], bounds: float | Sequence[float]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Opacus' DPOptimizer (flat) and DPPerLayerOptimizer (a list of bounds) clipping of per-sample grads."""
    batch = per_sample[0].shape[0]
    per_param = [g.reshape(batch, -1).norm(2, dim=-1) for g in per_sample]
    if isinstance(bounds, Sequence):
        factors = [(c / (n + 1e-6)).clamp(max=1.0) for c, n in zip(bounds, per_param, strict=True)]
        norms = torch.stack(per_param, 1)
    else:
        norms = torch.stack(per_param, 1).norm(2, dim=1)
        factors = [(bounds / (norms + 1e-6)).clamp(max=1.0)] * len(per_sample)
    return norms, [torch.einsum("i,i...", f, g) for f, g in zip(factors, per_sample, strict=True)]


def opacus_hooks(model: nn.Module, inputs: Sequence[torch.Tensor], y: torch.Tensor, bounds: float | Sequence[float],
                 chunk: int = 64, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Per-sample norms and clipped sums from Opacus' hooks, `chunk` examples at a time (per-sample
    gradients of a 30k-token embedding take V d floats per example), in float64 by default: Opacus in
    float32 is itself up to ~1e-5 off the exact norms on MiniLM, while the engine in float32 is within 1e-8
    of them there, so the float64 run is the reference the engine's float32 results are held to."""
    from opacus import GradSampleModule

    inputs = [x.to(dtype) if x.is_floating_point() else x for x in inputs]
    gsm = GradSampleModule(copy.deepcopy(model).to(dtype), batch_first=True, loss_reduction="sum")
    norms, sums = [], None
    for start in range(0, y.shape[0], chunk):
        part = slice(start, start + chunk)
        gsm.zero_grad(set_to_none=True)
        F.cross_entropy(gsm(*[x[part] for x in inputs]), y[part], reduction="sum").backward()
        grads = [p.grad_sample for p in gsm.parameters() if p.requires_grad]
        n, s = clipped(grads, bounds)
        norms.append(n)
        sums = s if sums is None else [a + b for a, b in zip(sums, s, strict=True)]
        for p in gsm.parameters():
            p.grad_sample = None
    return torch.cat(norms).float(), [s.float() for s in sums]  # type: ignore[union-attr]


def one_at_a_time(model: nn.Module, inputs: Sequence[torch.Tensor], y: torch.Tensor,
                  bounds: float | Sequence[float]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The definition: each example's gradient from its own backward pass (no batching at all)."""
    model = copy.deepcopy(model)
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(y.shape[0]):
        grads = torch.autograd.grad(F.cross_entropy(model(*[x[i:i + 1] for x in inputs]), y[i:i + 1],
                                                    reduction="sum"), params, allow_unused=True)
        rows.append([torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)])
    return clipped([torch.stack(g) for g in zip(*rows, strict=True)], bounds)


def bookkeeping(model: nn.Module, inputs: Sequence[torch.Tensor], y: torch.Tensor, bounds: float | Sequence[float],
                norm_mode: str = "mixed") -> tuple[torch.Tensor, list[torch.Tensor], BookkeepingEngine]:
    """The engine on a copy of `model`: (norms as `clipped` returns them, clipped sums, engine)."""
    model = copy.deepcopy(model)
    per_layer = isinstance(bounds, Sequence)
    engine = BookkeepingEngine(model, list(bounds) if per_layer else bounds,
                               clipping="per_layer" if per_layer else "flat", norm_mode=norm_mode)
    BookkeepingLoss(engine, nn.CrossEntropyLoss())(model(*inputs), y).backward()
    params = [p for p in model.parameters() if p.requires_grad]
    if per_layer:
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        norms = torch.stack([engine.param_norms[n] for n in names], 1)
    else:
        norms = engine.per_sample_norms
    return norms, [p.grad for p in params], engine


def assert_close(expected: tuple[torch.Tensor, list[torch.Tensor]], got: tuple[torch.Tensor, list[torch.Tensor]],
                 rel: float = 1e-5) -> None:
    """Norms elementwise and every clipped sum as a whole within `rel` relative error.

    A tensor whose gradient is zero in exact arithmetic (attention key biases: softmax is invariant to
    adding one constant to every score; the float64 reference holds ~1e-17 there) holds rounding noise only:
    its error is measured relative to the whole clipped gradient's norm, since any float32 computation of it
    is noise of that order (1e-8 to 1e-9 of the whole, depending on the attention kernel transformers picks).
    Every other tensor is held to its own norm, floored at 1e-3 of the whole."""
    norms, sums = expected
    got_norms, got_sums = got[0], got[1]
    assert got_norms.shape == norms.shape
    scale = norms.abs().clamp_min(1e-3 * norms.abs().max().item() + 1e-12)  # same floor, per tensor norms
    worst = ((got_norms - norms).abs() / scale).max().item() if norms.numel() else 0.0
    assert worst <= rel, f"per-sample norms differ by {worst:.2e} relative"
    assert len(sums) == len(got_sums)
    whole = torch.stack([a.norm() for a in sums]).norm().clamp_min(1e-12)
    for i, (a, b) in enumerate(zip(sums, got_sums, strict=True)):
        scale = whole if a.norm() <= 1e-10 * whole else torch.maximum(a.norm(), 1e-3 * whole)
        err = ((a - b).norm() / scale).item()
        assert err <= rel, f"clipped sum of trainable tensor {i} differs by {err:.2e} relative"


class MeanOverPositions(nn.Module):
    """`layer` then the mean over positions (dimension 1): a (batch, classes) output from a layer applied at every
    position, so that one layer family can be checked alone."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x).mean(1)


def frozen_head(features: int, classes: int = 3) -> nn.Linear:
    """A linear head that is not trained, so that only the layer before it has per-sample gradients."""
    return nn.Linear(features, classes).requires_grad_(False)
