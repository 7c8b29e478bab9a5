"""The book-keeping engine: per-sample clipping in one backward pass (Bu, Wang, Zha, Karypis, ICML 2023,
arXiv 2210.00038), with the per-layer choice of mixed ghost clipping (Bu, Mao, Xu, NeurIPS 2022, arXiv
2205.10683).

One step, for a batch of B examples with per-sample losses l_i:
1. forward: every module holding trainable parameters runs its rule's forward (registry.py), which
   saves what its per-sample gradients need (activations) through a custom autograd Function;
2. one backward pass of sum_i l_i: each Function returns the input gradient only and gives its Tap the
   output gradient; the Tap computes each parameter's per-sample squared norms |G_i|^2 (ghost norm or
   instantiated, by the mixed rule) and keeps a recipe for sum_i c_i G_i (the activations and output
   gradients for a ghost layer, the per-sample gradients for an instantiated one): the book-keeping;
3. after the backward pass: flat clipping combines the norms of all parameters, c_i = min(1, C / (|G_i|
   + 1e-6)) (Opacus' formula), and every recipe is evaluated with those c_i. Per-layer clipping
   (`max_grad_norm` a list, one bound per trainable tensor) knows c_i per tensor as soon as that tensor's
   norms exist, so its recipe is evaluated (and its activations released) during the backward pass.
Afterwards every trainable `p.grad` holds sum_i c_i G_i: the clipped sum, not averaged, no noise, what
Opacus' `DPOptimizerFastGradientClipping` expects.

Never a silent wrong gradient: modules with trainable parameters and no rule, rule options it cannot
handle, and parameters shared between modules are refused when the engine attaches (the message names
them); a module called twice in one step, a parameter that receives a gradient outside its module's
forward, a module whose leading dimension is not the batch, and a backward pass not started by the
engine raise during the backward pass.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from mechanisms.clipping_engine.norms import (
    NORM_MODES,
    ClippedSum,
    certified_factors,
    clip_factors,
    gamma,
    inflate,
    norm_dtype,
)
from mechanisms.clipping_engine.rules import Tap, UnsupportedModule, rule_for
from mechanisms.parts.clipping import CLIPPINGS as CLIPPING_RULES
from mechanisms.parts.grouping import RowGroups

CLIPPINGS = tuple(rule.opacus_clipping for rule in CLIPPING_RULES.values())  # Opacus' spelling of each rule


def unsupported(module: nn.Module) -> list[str]:
    """Why the engine cannot clip `module` per sample: one line per offending submodule; empty if it can."""
    problems, owner = [], {}
    for name, sub in module.named_modules():
        own = [(n, p) for n, p in sub.named_parameters(recurse=False) if p.requires_grad]
        for n, p in own:
            if id(p) in owner:
                problems.append(f"{name}.{n} is the same tensor as {owner[id(p)]} (tied weights are not supported)")
            owner[id(p)] = f"{name}.{n}" if name else n
        if not own:
            continue
        label = f"{name or '<root>'} ({type(sub).__name__})"
        rule = rule_for(sub)
        if rule is None:
            problems.append(f"{label} has trainable parameters {[n for n, _ in own]} and no book-keeping rule "
                            "(supported: Linear, Conv2d, Embedding, LayerNorm, HF Conv1D, HF ViTEmbeddings)")
            continue
        extra = [n for n, _ in own if n not in rule.params]
        if extra:
            problems.append(f"{label}: the {rule.name} rule does not clip its parameters {extra}")
        why = rule.check(sub)
        if why:
            problems.append(f"{label}: {why}")
    return problems


class BookkeepingEngine:
    """Attach to `module`; `backward(loss_per_sample)` leaves the clipped per-sample sum in each `p.grad`.

    `max_grad_norm`: one float (flat clipping) or, with `clipping="per_layer"`, one bound per trainable
    tensor in the order of `[p for p in module.parameters() if p.requires_grad]` (the optimizer's order,
    as Opacus' per-layer optimizer). `norm_mode`: `mixed` (the rule in norms.py), or force `ghost` /
    `instantiate` for every weight (benchmarks, tests). After a step, `per_sample_norms` holds the flat
    per-sample norms (B,) and `param_norms` each tensor's (name -> (B,)); under bf16 / fp16 flat clipping,
    `per_sample_bounds` holds the certified upper bounds on those norms that set the factors (norms.py),
    else it is None.
    """

    def __init__(self, module: nn.Module, max_grad_norm: float | Sequence[float], *, clipping: str = "flat",
                 norm_mode: str = "mixed") -> None:
        if clipping not in CLIPPINGS:
            raise ValueError(f"clipping must be one of {CLIPPINGS}, got {clipping!r}")
        if norm_mode not in NORM_MODES:
            raise ValueError(f"norm_mode must be one of {NORM_MODES}, got {norm_mode!r}")
        problems = unsupported(module)
        if problems:
            raise UnsupportedModule("book-keeping clipping cannot handle " + "; ".join(problems))
        self.module, self.clipping, self.norm_mode = module, clipping, norm_mode
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        self._names = {id(p): n for n, p in named}
        if clipping == "per_layer":
            bounds = [float(c) for c in max_grad_norm]  # type: ignore[union-attr]
            if len(bounds) != len(self.params):
                raise ValueError(f"per-layer clipping needs {len(self.params)} bounds (one per trainable tensor), "
                                 f"got {len(bounds)}")
        else:
            if isinstance(max_grad_norm, Sequence):
                raise ValueError("flat clipping takes one max_grad_norm; a list means clipping='per_layer'")
            bounds = [float(max_grad_norm)] * len(self.params)
        if any(not c > 0 for c in bounds):
            raise ValueError(f"max_grad_norm must be > 0, got {bounds}")
        self.max_grad_norm = float(max_grad_norm) if clipping == "flat" else None  # type: ignore[arg-type]
        self._bounds = {id(p): c for p, c in zip(self.params, bounds, strict=True)}
        self.enabled = True
        self.groups: RowGroups | None = None  # the step's privacy units, when a unit's rows are clipped together
        self._batch: int | None = None
        self._pending: dict[int, tuple[torch.Tensor, ClippedSum, torch.Tensor | None]] = {}
        self._done: dict[int, torch.Tensor] = {}
        self.per_sample_norms: torch.Tensor | None = None
        self.per_sample_bounds: torch.Tensor | None = None
        self._param_norms: dict[str, torch.Tensor] = {}
        self._stacked: tuple[list[str], torch.Tensor] | None = None
        self._restore: list[tuple[nn.Module, Any]] = []
        self._guards = []
        for name, sub in module.named_modules():
            if not any(p.requires_grad for p in sub.parameters(recurse=False)):
                continue
            rule = rule_for(sub)
            tap = Tap(self, name, sub, norm_mode)
            self._restore.append((sub, sub.__dict__.get("forward")))
            sub.forward = functools.partial(rule.forward, sub, tap)
        for p in self.params:
            self._guards.append(p.register_hook(functools.partial(_leak, self._names[id(p)])))

    # ---- one step ----------------------------------------------------------------------------------
    def backward(self, loss_per_sample: torch.Tensor) -> None:
        """Backpropagate sum_i l_i once and write sum_i c_i G_i into every trainable `p.grad`."""
        if loss_per_sample.dim() != 1:
            raise ValueError(f"expected one loss per example (B,), got shape {tuple(loss_per_sample.shape)}")
        groups = self.groups
        if groups is not None and groups.index.shape[0] != loss_per_sample.shape[0]:
            raise ValueError(f"the step's groups cover {groups.index.shape[0]} rows, its loss has "
                             f"{loss_per_sample.shape[0]}")
        self._batch = loss_per_sample.shape[0] if groups is None else groups.count  # what is clipped: rows or groups
        self._pending, self._done, self._param_norms, self._stacked = {}, {}, {}, None
        self.per_sample_bounds = None
        try:
            if loss_per_sample.requires_grad and self._batch > 0:
                loss_per_sample.sum().backward()
            self._finish()
        finally:
            self._batch = None
            self._pending = {}

    def contribute(self, param: torch.Tensor, norm2: torch.Tensor, clipped_sum: ClippedSum,
                   norm2_up: torch.Tensor | None = None) -> None:
        """Called by a Tap during the backward pass with one parameter's squared per-sample norms, and under
        mixed precision their certified upper bounds, which set the clipping factors (norms.py)."""
        name = self._names.get(id(param), "<unknown parameter>")
        if self._batch is None:
            raise RuntimeError(f"book-keeping: {name} got a gradient from a backward pass the engine did not "
                               "start; call backward through the engine's loss wrapper")
        if norm2.shape[0] != self._batch:
            raise RuntimeError(f"book-keeping: {name} saw a leading dimension of {norm2.shape[0]} but the batch "
                               f"has {self._batch} examples; the engine needs batch-first inputs to every layer")
        if id(param) in self._pending or id(param) in self._done:
            raise RuntimeError(f"book-keeping: {name} was used more than once in one step (a module called "
                               "twice, or shared weights); its per-sample gradient has cross terms")
        norm2 = norm2.to(norm_dtype(norm2))  # norms and factors in (at least) fp32 under mixed precision
        if self.clipping == "per_layer":
            norms = norm2.clamp_min(0).sqrt()
            self._param_norms[name] = norms
            bound = self._bounds[id(param)]
            factors = clip_factors(norms, bound) if norm2_up is None else certified_factors(norm2_up, bound)
            self._done[id(param)] = clipped_sum(factors)
        else:
            self._pending[id(param)] = (norm2, clipped_sum, norm2_up)

    def _finish(self) -> None:
        """Flat clipping: combine the pending norms and evaluate every recipe. The per-tensor squared norms
        are stacked once (one kernel, not one add per tensor: the step is launch-bound on a GPU), and
        `param_norms` is derived from that stack only when read."""
        batch = self._batch or 0
        if self.clipping == "flat" and self._pending:
            keys = [id(p) for p in self.params if id(p) in self._pending]
            stacked = torch.stack([self._pending[k][0] for k in keys])  # (tensors, B)
            self._stacked = ([self._names[k] for k in keys], stacked)
            self.per_sample_norms = stacked.sum(0).clamp_min(0).sqrt()
            if any(self._pending[k][2] is not None for k in keys):  # mixed precision: the certified bounds
                # a tensor the run kept in fp32 (LayerNorm, Embedding under autocast) enters with its computed
                # norm: its fp32 rounding is not certified (docs/clipping.md, "What is not covered")
                ups = torch.stack([self._pending[k][0].clamp_min(0) if self._pending[k][2] is None else
                                   self._pending[k][2] for k in keys]).to(stacked.dtype)
                total = inflate(ups.sum(0), 2 * gamma(len(keys) + 1, stacked.dtype))
                self.per_sample_bounds = total.sqrt()
                factors = certified_factors(total, self.max_grad_norm)  # type: ignore[arg-type]
            else:
                factors = clip_factors(self.per_sample_norms, self.max_grad_norm)  # type: ignore[arg-type]
            for key, (_, clipped_sum, _) in self._pending.items():
                self._done[key] = clipped_sum(factors)
        elif self.clipping == "flat":
            self.per_sample_norms = torch.zeros(batch, device=self.params[0].device if self.params else None)
        for p in self.params:  # an unused parameter (or an empty batch) has zero per-sample gradients
            grad = self._done.get(id(p))
            grad = torch.zeros_like(p) if grad is None else grad.to(p.dtype).view_as(p)
            if p.grad is None:
                p.grad = grad
            else:
                p.grad.add_(grad)

    @property
    def param_norms(self) -> dict[str, torch.Tensor]:
        """Each trainable tensor's per-sample norms of the last step (name -> (B,)), computed on demand."""
        if self._stacked is not None:
            names, stacked = self._stacked
            norms = stacked.clamp_min(0).sqrt()
            self._param_norms.update(zip(names, norms.unbind(0), strict=True))
            self._stacked = None
        return self._param_norms

    # ---- lifecycle ---------------------------------------------------------------------------------
    def detach(self) -> nn.Module:
        """Restore the original forwards and remove the guards; returns the module."""
        for sub, previous in self._restore:
            if previous is None:
                del sub.forward
            else:
                sub.forward = previous
        for handle in self._guards:
            handle.remove()
        self._restore, self._guards, self.enabled = [], [], False
        return self.module


def _leak(name: str, grad: torch.Tensor | None) -> None:
    if grad is None:  # what the engine's Functions return for a parameter: autograd still calls the hook
        return
    raise RuntimeError(f"book-keeping: parameter {name} received an autograd gradient outside its module's "
                       "forward (used directly by another module, or tied); its clipped gradient would be wrong")


class BookkeepingLoss:
    """Criterion wrapper (as Opacus' `DPLossFastGradientClipping`): `criterion(out, y)` gives a value whose
    `backward()` runs the engine's single backward pass; `item()` is the criterion's usual reduction.
    `weights` (one per row, 0 for a padding row) multiply the per-sample losses, so a padding row has a zero
    gradient, norm and clipped contribution."""

    def __init__(self, engine: BookkeepingEngine, criterion: Any) -> None:
        reduction = getattr(criterion, "reduction", "mean")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"the criterion's reduction must be 'mean' or 'sum', got {reduction!r}")
        self.engine, self.criterion, self.reduction = engine, criterion, reduction

    def __call__(self, *args: Any, weights: torch.Tensor | None = None, **kwargs: Any) -> BookkeepingLossValue:
        old = self.criterion.reduction
        self.criterion.reduction = "none"
        try:
            per_sample = self.criterion(*args, **kwargs)
        finally:
            self.criterion.reduction = old
        if weights is not None:
            per_sample = per_sample * weights.to(per_sample.dtype)
        return BookkeepingLossValue(self.engine, per_sample, self.reduction, weights)


class BookkeepingLossValue:
    """The per-sample losses of one batch; reads as the reduced loss over its examples (padding rows left out),
    backpropagates through the engine."""

    def __init__(self, engine: BookkeepingEngine, per_sample: torch.Tensor, reduction: str,
                 weights: torch.Tensor | None = None) -> None:
        self.engine, self.per_sample, self.reduction, self.weights = engine, per_sample, reduction, weights

    def detach(self) -> torch.Tensor:
        if self.reduction == "sum":
            return self.per_sample.sum().detach()
        if self.weights is None:
            return self.per_sample.mean().detach()
        return (self.per_sample.sum() / self.weights.sum().clamp_min(1)).detach()

    def item(self) -> float:
        return float(self.detach().item())

    def backward(self) -> None:
        self.engine.backward(self.per_sample)

    def __repr__(self) -> str:
        return f"BookkeepingLossValue(reduction={self.reduction}, batch={self.per_sample.shape[0]})"
