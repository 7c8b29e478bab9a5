"""`make_private`: wrap an ordinary model, optimizer and dataset into the process a plan accounts for.

Opacus' `PrivacyEngine.make_private` derives the sampling rate from the loader it is given (1 / len(loader))
and the expected batch size from that, so a plan computed elsewhere can disagree with what runs. Here
everything comes from the plan's parts: the loader draws its batches from `plan.parts.sampler`, the
optimizer clips with `plan.parts.clipper`'s bounds, normalises by the sampler's expected batch size and
adds `plan.parts.noise`, and counts its updates against `plan.steps`.

Opacus is extended only through public classes and methods: its grad-sample modules
(`opacus.grad_sample.prepare_module`), its optimizers subclassed (`add_noise`, `pre_step`, `step`
overridden), its empty-batch collate (`opacus.data_loader.wrap_collate_with_empty`) and ghost-clipping
loss (`opacus.utils.fast_gradient_clipping_utils.DPLossFastGradientClipping`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import torch
from opacus.data_loader import dtype_safe, shape_safe, wrap_collate_with_empty
from opacus.grad_sample import GradSampleModule
from opacus.grad_sample.utils import prepare_module
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping, DPPerLayerOptimizer
from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
from torch.utils.data import DataLoader, Dataset, default_collate

from mechanisms.parts.clipping import GRAD_SAMPLE_MODES
from mechanisms.parts.noise_addition import NoiseAddition, NoiseMap


class ReleaseObserver(Protocol):
    """Sees every release: `before_noise` may read or change `p.summed_grad` (e.g. inject an auditing
    canary); `after_noise` reads `p.grad`, the privatised sum (before it is scaled by the batch size)."""

    def before_noise(self, optimizer: PrivateOptimizerMixin) -> None: ...

    def after_noise(self, optimizer: PrivateOptimizerMixin) -> None: ...


AfterStep = Callable[["PrivateOptimizerMixin"], None]


class PlanViolation(RuntimeError):
    """The executed process left the accounted one (more updates than the plan composed)."""


class PrivateOptimizerMixin:
    """What privbench adds to an Opacus DP optimizer: the plan's noise part, observers, and a step count.

    `add_noise` hands the clipped sums to `noise.release` (the same code the one-step audit runs);
    `after_step(optimizer)` runs after every parameter update (e.g. a weight permutation);
    `steps_taken` counts real updates and may never exceed `planned_steps`.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, noise: NoiseAddition, planned_steps: int,
                 after_step: AfterStep | None = None, noise_map: NoiseMap | None = None, **kwargs: Any) -> None:
        super().__init__(optimizer, **kwargs)  # type: ignore[call-arg]
        self.noise, self.planned_steps = noise, planned_steps
        self.after_step, self.noise_map = after_step, noise_map
        self.steps_taken = 0
        self.observers: list[ReleaseObserver] = []
        self.update_applied = False

    def observe_releases(self, observer: ReleaseObserver) -> None:
        self.observers.append(observer)

    def stop_observing(self, observer: ReleaseObserver) -> None:
        self.observers.remove(observer)

    def add_noise(self) -> None:
        params = self.params  # type: ignore[attr-defined]
        for observer in self.observers:
            observer.before_noise(self)
        sums = [p.summed_grad.unsqueeze(0) for p in params]
        released = self.noise.release(sums, self.noise_multiplier, self.generator,  # type: ignore[attr-defined]
                                      secure=self.secure_mode, noise_map=self.noise_map)  # type: ignore[attr-defined]
        for p, r in zip(params, released, strict=True):
            p.grad = r.squeeze(0).view_as(p)
        for observer in self.observers:
            observer.after_noise(self)

    def pre_step(self, closure: Callable[[], float] | None = None) -> bool:
        self.update_applied = bool(super().pre_step(closure))  # type: ignore[misc]
        return self.update_applied

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        result = super().step(closure)  # type: ignore[misc]
        if self.update_applied:
            self.steps_taken += 1
            if self.steps_taken > self.planned_steps:
                raise PlanViolation(f"update {self.steps_taken} exceeds the {self.planned_steps} steps the plan "
                                    "accounted for")
            if self.after_step is not None:
                self.after_step(self)
        return result


class PrivateDPOptimizer(PrivateOptimizerMixin, DPOptimizer):
    """Flat clipping on instantiated per-sample gradients (Opacus hooks, functorch, ew)."""


class PrivatePerLayerOptimizer(PrivateOptimizerMixin, DPPerLayerOptimizer):
    """Per-layer clipping: each parameter tensor has its own bound."""


class PrivateGhostOptimizer(PrivateOptimizerMixin, DPOptimizerFastGradientClipping):
    """Ghost clipping: the gradients arrive clipped and summed (Opacus' two-pass `ghost` mode)."""


class PrivateBookkeepingOptimizer(PrivateGhostOptimizer):
    """Book-keeping (`bk`): the engine writes each step's clipped sum into a fresh `p.grad` (or adds it to a
    `p.grad` the caller kept), so `accumulate` hands that tensor to `p.summed_grad` instead of Opacus' deep
    copy (a copy of every gradient per step: 17 MB on bert-tiny) and leaves `p.grad` empty until `add_noise`
    writes the release. After a skipped step (Opacus' virtual steps) the next clipped sum is added to the
    kept one, as Opacus does. Noise, scaling and the plan are the parent's."""

    def accumulate(self) -> None:
        for p in self.params:  # type: ignore[attr-defined]
            if p.grad is None:
                raise RuntimeError("book-keeping: a trainable parameter has no gradient at the optimizer step; "
                                   "call the engine's loss backward() before step()")
            if p.summed_grad is not None:
                p.summed_grad.add_(p.grad)
            else:
                p.summed_grad = p.grad
            p.grad = None

    def scale_grad(self) -> None:
        """Opacus' division by the expected batch size as one multi-tensor kernel (it loops per tensor)."""
        if self.loss_reduction == "mean":  # type: ignore[attr-defined]
            grads = [p.grad for p in self.params]  # type: ignore[attr-defined]
            if grads:
                torch._foreach_div_(grads, self.expected_batch_size * self.accumulated_iterations)  # type: ignore[attr-defined]


def optimizer_class(clipping: str, grad_sample_mode: str) -> type[PrivateOptimizerMixin]:
    if grad_sample_mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"unknown grad_sample_mode {grad_sample_mode!r}; known: {', '.join(GRAD_SAMPLE_MODES)}")
    if grad_sample_mode == "bk":  # clipped sums arrive in p.grad, flat or per-layer (book-keeping engine)
        return PrivateBookkeepingOptimizer
    if grad_sample_mode == "ghost":
        if clipping != "flat":
            raise ValueError("Opacus' ghost mode clips flat only; use grad_sample_mode hooks for per-layer clipping")
        return PrivateGhostOptimizer
    return PrivateDPOptimizer if clipping == "flat" else PrivatePerLayerOptimizer


@dataclasses.dataclass
class PrivateTraining:
    """What `make_private` returns: use them as their ordinary counterparts in the training loop."""

    module: torch.nn.Module
    optimizer: Any  # a PrivateOptimizerMixin subclass, or the plain optimizer when nothing is private
    loader: DataLoader
    criterion: Any

    def __iter__(self):  # unpacks like Opacus' (module, optimizer, loader) plus the criterion
        return iter((self.module, self.optimizer, self.loader, self.criterion))


def plan_loader(data: Dataset, plan: Any, generator: torch.Generator) -> DataLoader:
    """The loader of exactly `plan.steps` batches (over `epochs` iterations) drawn by the plan's sampler.

    Poisson batches can be empty: Opacus' collate wrapper then returns tensors of batch size 0 shaped
    like the dataset's items.
    """
    sampler = plan.batch_selection
    if len(data) != sampler.dataset_size:  # type: ignore[arg-type]
        raise ValueError(f"the plan accounts for {sampler.dataset_size} examples, the data has {len(data)}")  # type: ignore[arg-type]
    first = data[0]
    collate = wrap_collate_with_empty(collate_fn=default_collate,
                                      sample_empty_shapes=[(0, *shape_safe(x)) for x in first],
                                      dtypes=[dtype_safe(x) for x in first])
    return DataLoader(data, batch_sampler=sampler.batch_sampler(generator), collate_fn=collate)


def make_private(module: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Dataset, plan: Any, *,
                 criterion: Any, generator: torch.Generator, grad_sample_mode: str = "hooks",
                 noise_generator: torch.Generator | None = None, secure_mode: bool = False,
                 after_step: AfterStep | None = None, noise_map: NoiseMap | None = None) -> PrivateTraining:
    """DP-SGD's wrap, every part taken from `plan.parts` (sampler, clipper, noise)."""
    parts = plan.parts
    clipper = parts.clipper
    opt_cls = optimizer_class(clipper.opacus_clipping, grad_sample_mode)
    kwargs: dict[str, Any] = {"batch_first": True, "loss_reduction": "mean"}
    if grad_sample_mode == "ghost":
        kwargs["max_grad_norm"] = clipper.max_grad_norm
    if isinstance(module, GradSampleModule):
        raise ValueError("make_private takes the plain module, not one Opacus already wrapped")
    max_grad_norm = clipper.max_grad_norm
    if grad_sample_mode == "bk":  # one backward pass leaves sum_i c_i G_i in p.grad (docs/clipping.md)
        from mechanisms.bookkeeping import BookkeepingEngine, BookkeepingLoss

        engine = BookkeepingEngine(module, max_grad_norm, clipping=clipper.opacus_clipping)
        wrapped, max_grad_norm = module, clipper.bound  # the optimizer's scalar bound: the example's bound
    else:
        wrapped = prepare_module(module, grad_sample_mode, True, **kwargs)
    dp_optimizer = opt_cls(
        optimizer, noise=parts.noise, planned_steps=plan.steps, after_step=after_step, noise_map=noise_map,
        noise_multiplier=plan.sigma, max_grad_norm=max_grad_norm,
        expected_batch_size=parts.sampler.batch_size, loss_reduction="mean", generator=noise_generator,
        secure_mode=secure_mode)
    if grad_sample_mode == "ghost":
        criterion = DPLossFastGradientClipping(wrapped, dp_optimizer, criterion, "mean")
    elif grad_sample_mode == "bk":
        criterion = BookkeepingLoss(engine, criterion)
    return PrivateTraining(wrapped, dp_optimizer, plan_loader(data, plan, generator), criterion)


__all__ = ["GRAD_SAMPLE_MODES", "PlanViolation", "PrivateBookkeepingOptimizer", "PrivateDPOptimizer",
           "PrivateGhostOptimizer", "PrivateOptimizerMixin", "PrivatePerLayerOptimizer", "PrivateTraining",
           "ReleaseObserver", "make_private", "optimizer_class", "plan_loader"]
