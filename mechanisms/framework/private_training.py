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
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
from opacus.data_loader import dtype_safe, shape_safe, wrap_collate_with_empty
from opacus.grad_sample import GradSampleModule
from opacus.grad_sample.utils import prepare_module
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping, DPPerLayerOptimizer
from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
from torch.utils.data import DataLoader, Dataset, default_collate

from mechanisms.clipping_engine import BookkeepingEngine, BookkeepingLoss
from mechanisms.clipping_engine.norms import clip_factors
from mechanisms.framework.integrity.guard import StepGuard, apply_state, copied
from mechanisms.parts.clipping import GRAD_SAMPLE_MODES
from mechanisms.parts.grouping import RowGroups, Units, augment_crop_flip, crop_padding, group_rows
from mechanisms.parts.noise_addition import NoiseAddition, NoiseMap, RunNoise
from mechanisms.parts.releases import ExampleView, Release, Released


class ReleaseObserver(Protocol):
    """Sees every release: `before_noise` may read or change `p.summed_grad` (e.g. inject an auditing
    canary); `after_noise` reads `p.grad`, the privatised sum (before it is scaled by the batch size)."""

    def before_noise(self, optimizer: PrivateOptimizerMixin) -> None: ...

    def after_noise(self, optimizer: PrivateOptimizerMixin) -> None: ...


class CanaryProbe(Protocol):
    """privbench's in-step auditor (`PrivateOptimizerMixin.attach_probe`): `before_noise` runs first in
    `add_noise`, before any release observer, and pushes its canaries into `p.summed_grad` at the norm the
    engine clips them to (`clipped_norm`); `after_noise` reads `p.grad`, the release, before any observer
    sees it. What the observers then do to the sums or the release is inside what the probe measures."""

    def before_noise(self, optimizer: PrivateOptimizerMixin) -> None: ...

    def after_noise(self, optimizer: PrivateOptimizerMixin) -> None: ...


AfterStep = Callable[["PrivateOptimizerMixin"], None]


class PlanViolation(RuntimeError):
    """The executed process left the accounted one (more updates than the plan composed)."""


StateUpdate = Callable[[Mapping[str, torch.Tensor], Released], Mapping[str, torch.Tensor]]


ReleasedHook = Callable[[Released, Mapping[str, torch.Tensor]], Any]


class PrivateOptimizerMixin:
    """What privbench adds to an Opacus DP optimizer: every release of the plan's parts, the mechanism's
    state, observers, a step count, and the per-step integrity checks (`guard`).

    `add_noise` hands the clipped sums to `noise.release` (the same code the one-step audit runs), then makes
    every other release of the parts from the examples' norms, hands all of them (`Released`) to the
    observers, and copies of them to the state update, and nothing else; after every parameter update,
    `after_step(optimizer)` runs privbench's own post-processing (e.g. a weight permutation) and then the
    mechanism's `released_hook` sees copies of the releases and the state (it returns nothing); `steps_taken`
    counts real updates and may never exceed `planned_steps`. `mechanism_state` holds the mechanism's state as
    device tensors, updated in place so that the clipping engine and the noise read the bound in force without a
    host synchronisation.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, noise: NoiseAddition, planned_steps: int,
                 after_step: AfterStep | None = None, noise_map: NoiseMap | None = None,
                 releases: tuple[Release, ...] = (), state: dict[str, torch.Tensor] | None = None,
                 update_state: StateUpdate | None = None, bound_key: str | None = None,
                 declared_bound: float | None = None, released_hook: ReleasedHook | None = None,
                 **kwargs: Any) -> None:
        super().__init__(optimizer, **kwargs)  # type: ignore[call-arg]
        self.noise, self.planned_steps = noise, planned_steps
        # a correlated-noise part keeps its state across steps in a stream (one per run); memoryless parts have none
        self.noise_stream = noise.start() if isinstance(noise, RunNoise) else None
        self.after_step, self.noise_map = after_step, noise_map
        self.releases, self.mechanism_state, self.update_state = releases, state or {}, update_state
        self.released_hook = released_hook
        self.bound_key, self.declared_bound = bound_key, declared_bound
        self.example_weights: torch.Tensor | None = None  # 0 on padding rows of the batch in flight
        self._row_groups: RowGroups | None = None
        self.last_released: Released | None = None
        self.steps_taken = 0
        self.observers: list[ReleaseObserver] = []
        self.probe: CanaryProbe | None = None
        self.update_applied = False
        self.guard: Any = None  # integrity.StepGuard, set by `make_private`
        self._hook_copy: Released | None = None
        if bound_key is not None:
            self.max_grad_norm = self.mechanism_state[bound_key]  # type: ignore[has-type]

    @property
    def row_groups(self) -> RowGroups | None:
        """The batch in flight's privacy units, when a unit's rows are clipped together (`Batch.groups`): set
        before the forward pass, so that the book-keeping engine, which clips during the backward pass, sees
        them too; Opacus' per-row gradients are summed by them before clipping (`pre_step`)."""
        return self._row_groups

    @row_groups.setter
    def row_groups(self, groups: RowGroups | None) -> None:
        self._row_groups = groups
        engine = getattr(self, "engine", None)
        if engine is not None and hasattr(engine, "groups"):
            engine.groups = groups

    def observe_releases(self, observer: ReleaseObserver) -> None:
        self.observers.append(observer)

    def attach_probe(self, probe: CanaryProbe | None) -> None:
        """Set (or, with None, remove) the one-run audit's canary probe: it sees the step before every observer."""
        if probe is not None and self.probe is not None:
            raise RuntimeError("this optimizer already carries a canary probe")
        self.probe = probe

    def clipped_norm(self, norm: torch.Tensor) -> torch.Tensor:
        """The norm an example's gradient of norm `norm` (a device scalar) keeps after the clipping that runs in
        this step: the engine that clips the batch (the book-keeping engine, Opacus' ghost module, or Opacus'
        optimizer) at the bound it holds now, by the rule it clips with (min(1, C / (|g| + 1e-6)) |g|). Per-layer
        clipping: an example of norm `norm` in every tensor, sqrt(sum_l C_l^2) once clipped.

        The one-run audit's canaries enter the step as such examples (`CanaryProbe`): a bound changed after
        planning, wherever it was changed, moves them as it moves every example."""
        engine = getattr(self, "engine", None)
        if engine is not None and getattr(engine, "clipping", "flat") == "per_layer":
            bounds: list[Any] = list(engine._bounds.values())
        elif engine is not None:
            bounds = [engine.max_grad_norm]
        elif hasattr(self, "max_grad_norms"):
            bounds = list(self.max_grad_norms)
        else:
            bounds = [self.max_grad_norm]  # type: ignore[attr-defined]
        kept = [clip_factors(norm, c) * norm for c in bounds]
        return kept[0] if len(kept) == 1 else torch.stack(kept).square().sum().sqrt()

    @property
    def bound(self) -> torch.Tensor | float:
        """The clip bound in force (a device scalar when the state sets it)."""
        return self.max_grad_norm  # type: ignore[attr-defined]

    def example_norms(self) -> torch.Tensor:
        """The step's per-example gradient norms (before clipping), over all trainable tensors."""
        per_param = [g.reshape(len(g), -1).norm(2, dim=-1) for g in self.grad_samples]  # type: ignore[attr-defined]
        return torch.stack(per_param, dim=1).norm(2, dim=1)

    def add_noise(self) -> None:
        params, guard = self.params, self.guard  # type: ignore[attr-defined]
        if guard is not None:
            guard.before_release()
        probe = self.probe
        if probe is not None:  # before the observers: what they do to the sums is part of what it measures
            probe.before_noise(self)
        for observer in self.observers:
            observer.before_noise(self)
        sums = [p.summed_grad.unsqueeze(0) for p in params]
        scale = self.bound / self.declared_bound if self.bound_key is not None else None
        source = self.noise_stream if self.noise_stream is not None else self.noise
        released = source.release(sums, self.noise_multiplier, self.generator,  # type: ignore[attr-defined]
                                      secure=self.secure_mode, noise_map=self.noise_map,  # type: ignore[attr-defined]
                                      scale=scale)
        for p, r in zip(params, released, strict=True):
            p.grad = r.squeeze(0).view_as(p)
        if probe is not None:  # the release as it left the noise, before any observer sees it
            probe.after_noise(self)
        values = {}
        if self.releases:
            view = ExampleView(self.example_norms(), self.bound, self.example_weights)
            values = {r.name: r.release(view, self.noise_multiplier, self.generator,  # type: ignore[attr-defined]
                                        secure=self.secure_mode) for r in self.releases}  # type: ignore[attr-defined]
        self.last_released = Released(tuple(p.grad for p in params), values)
        if guard is not None:
            guard.after_release(params)
        for observer in self.observers:
            observer.after_noise(self)
        self._hook_copy = None
        trace = guard.trace if guard is not None else None
        if self.released_hook is not None:  # the hooks' own copies: nothing they do reaches the step
            self._hook_copy = copied(self.last_released)
            if trace is not None:
                trace.mark_read()
        elif self.update_state is not None:  # the gradient copied only if the update reads it (before normalising)
            self._hook_copy = copied(self.last_released, lazy=True,
                                     on_read=trace.mark_read if trace is not None else None)
        if self.update_state is not None:
            state = {k: v.clone() for k, v in self.mechanism_state.items()}
            new = self.update_state(state, self._hook_copy)
            if guard is not None:
                guard.apply_state(self.mechanism_state, new)
            else:
                apply_state(self.mechanism_state, new, None, (0.0, math.inf))
        if trace is not None:
            trace.add(self.last_released, self.mechanism_state)

    def pre_step(self, closure: Callable[[], float] | None = None) -> bool:
        if self._row_groups is not None and getattr(self, "engine", None) is None:  # Opacus' per-row gradients:
            for p in self.params:  # type: ignore[attr-defined]  # a unit's rows become one example before clipping
                p.grad_sample = group_rows(self._get_flat_grad_sample(p), self._row_groups)  # type: ignore[attr-defined]
        self.update_applied = bool(super().pre_step(closure))  # type: ignore[misc]
        return self.update_applied

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        result = super().step(closure)  # type: ignore[misc]
        if self.update_applied:
            self.steps_taken += 1
            if self.steps_taken > self.planned_steps:
                raise PlanViolation(f"update {self.steps_taken} exceeds the {self.planned_steps} steps the plan "
                                    "accounted for")
            if self.guard is not None:
                self.guard.after_update()
            if self.after_step is not None:  # privbench's own post-processing (the plan's parts say which)
                self.after_step(self)
                if self.guard is not None:
                    self.guard.after_post_processing()
            if self.released_hook is not None:
                state = {k: v.clone() for k, v in self.mechanism_state.items()}
                returned = self.released_hook(self._hook_copy, state)
                if returned is not None and self.guard is not None:
                    self.guard.fail("hooks", f"after_step returned {type(returned).__qualname__}; it returns "
                                             "nothing (it sees copies of the releases, and nothing it returns runs)")
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

    engine: Any = None  # the BookkeepingEngine that clips (set by `make_private`)

    def example_norms(self) -> torch.Tensor:
        """The engine's per-example norms of the step (flat clipping: over all trainable tensors)."""
        if self.engine is None or self.engine.per_sample_norms is None:
            raise RuntimeError("book-keeping: no per-example norms (the engine clips per layer, or did not run)")
        return self.engine.per_sample_norms

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
    loader: ResidentBatches | StreamedBatches
    criterion: Any

    def __iter__(self):  # unpacks like Opacus' (module, optimizer, loader) plus the criterion
        return iter((self.module, self.optimizer, self.loader, self.criterion))


# The share of the device's free memory a training set may take to live there (`resident`): the rest is left to
# the model, its per-example norms, the optimizer and the evaluation.
RESIDENT_SHARE = 0.3


class Batch(tuple):
    """One step's tensors, unpacking as `(*inputs, labels)` like a DataLoader's batch, with how many of its rows
    are examples (`size`, a host integer: no synchronisation to count them) and, when it is padded, each row's
    weight (`weights`: 1 for an example, 0 for a padding row; None when every row is an example). `groups`: which
    rows one privacy unit owns, when they are clipped together (declared units, augmentation with multiplicity)."""

    size: int
    weights: torch.Tensor | None
    groups: RowGroups | None

    def __new__(cls, tensors: Any, size: int, weights: torch.Tensor | None = None,
                groups: RowGroups | None = None) -> Batch:
        batch = super().__new__(cls, tensors)
        batch.size, batch.weights, batch.groups = size, weights, groups
        return batch


def resident(tensors: Any, device: torch.device) -> bool:
    """Whether a training set lives on `device`: always on the CPU (it is in memory already); on an accelerator
    when its tensors take at most RESIDENT_SHARE of the device's free memory."""
    device = torch.device(device)
    if device.type == "cpu":
        return True
    if device.type != "cuda":
        return False
    size = sum(t.element_size() * t.numel() for t in tensors)
    return size <= RESIDENT_SHARE * torch.cuda.mem_get_info(device)[0]


class ResidentBatches:
    """The plan's batches gathered from tensors on the training device: per step, the sampler's index tensor
    (drawn on the device) and one `index_select` per tensor. No host synchronisation, no Python per example.

    `lengths` (each example's length, on the host) cuts every batch to its longest example: the indices are then
    drawn on the host, where the batch's length is read for free, and copied to the device with the step."""

    def __init__(self, tensors: Any, selection: Any, generator: torch.Generator,
                 device_generator: torch.Generator | None, pad_to: int | None, lengths: Any = None,
                 grouping: Grouping | None = None) -> None:
        self.tensors, self.selection, self.lengths, self.grouping = tensors, selection, lengths, grouping
        self.generator, self.device_generator, self.pad_to = generator, device_generator, pad_to

    def __len__(self) -> int:
        return self.selection.steps_per_epoch

    def __iter__(self) -> Any:
        if self.grouping is not None:
            yield from self.grouping.batches(self)
            return
        if self.lengths is None:
            for step in self.selection.epoch(self.generator, self.device_generator, self.pad_to):
                yield Batch([t.index_select(0, step.index) for t in self.tensors], step.size, step.weights)
            return
        device = self.tensors[0].device
        for step in self.selection.epoch(self.generator, None, self.pad_to):
            longest = int(self.lengths[step.index.numpy()].max()) if len(step.index) else 1  # host arrays: no sync
            index = step.index.to(device, non_blocking=True)
            weights = None if step.weights is None else step.weights.to(device, non_blocking=True)
            last = len(self.tensors) - 1
            yield Batch([_cut(t.index_select(0, index), longest, i == last) for i, t in enumerate(self.tensors)],
                        step.size, weights)


@dataclasses.dataclass(frozen=True)
class Grouping:
    """How a step's rows form its privacy units (`mechanisms.parts.grouping`): the training set's declared
    `units` (the sampler draws units; every row of a drawn unit joins the step), and `augmult` K (each drawn
    record's image cropped and flipped K times, the copies' gradients averaged). The batches carry the grouping
    (`Batch.groups`) by which the clipping engine clips a unit's rows as one example."""

    units: Units | None = None
    augmult: int = 1

    @classmethod
    def of(cls, data: Any) -> Grouping | None:
        """The grouping a training set asks for (its `units` and `augmult` attributes); None: one row per unit."""
        units, augmult = getattr(data, "units", None), int(getattr(data, "augmult", 1) or 1)
        return cls(units, augmult) if units is not None or augmult > 1 else None

    def batches(self, source: ResidentBatches) -> Any:
        """`source`'s steps, drawn by its sampler (over units when declared: their indices are drawn on the host,
        which maps them to rows), gathered and, with augmult, augmented on the device."""
        tensors, k = source.tensors, self.augmult
        device = tensors[0].device
        host = self.units is not None  # the rows of drawn units are found on the host, where the draw is
        for step in source.selection.epoch(source.generator, None if host else source.device_generator):
            if self.units is not None:
                rows_np, group_np, slot_np = self.units.expand(step.index.numpy())
                rows, group, slot = (torch.from_numpy(a).to(device, non_blocking=True)
                                     for a in (rows_np, group_np, slot_np))
                width = int(slot_np.max()) + 1 if len(slot_np) else 1
                longest = int(source.lengths[rows_np].max()) if source.lengths is not None and len(rows_np) else None
            else:
                rows, group, longest = step.index, torch.arange(step.size, device=device), None
                slot, width = torch.zeros_like(group), 1
            if k > 1:  # each row k times in a row (expanded, not `repeat_interleave`: no size to read back)
                rows, group, slot = (t.unsqueeze(1).expand(-1, k).reshape(-1) for t in (rows, group, slot * k))
                slot = slot + torch.arange(k, device=device).repeat(len(rows) // k)
                width *= k
            batch = [t.index_select(0, rows) for t in tensors]
            if k > 1:
                generator = source.device_generator or source.generator
                batch[:-1] = [augment_crop_flip(x, generator, crop_padding(x.shape[2])) for x in batch[:-1]]
            if longest is not None:
                batch = [_cut(t, longest, i == len(batch) - 1) for i, t in enumerate(batch)]
            yield Batch(batch, len(rows), None, RowGroups(group, step.size, 1.0 / k, slot, width))


def _cut(tensor: torch.Tensor, length: int, labels: bool) -> torch.Tensor:
    """An input of shape (B, L, ...) cut to its first `length` positions (labels are left as they are)."""
    return tensor if labels or tensor.dim() < 2 else tensor[:, :max(1, length)].contiguous()


class StreamedBatches:
    """The plan's batches for data that stays on the host: a DataLoader over the sampler's batches, each batch
    copied to the device."""

    def __init__(self, loader: DataLoader, device: torch.device, trim_by: int | None = None) -> None:
        self.loader, self.device, self.trim_by = loader, device, trim_by

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Any:
        for tensors in self.loader:
            if self.trim_by is not None and len(tensors[-1]):  # host tensors: their length is read for free
                longest = int(tensors[self.trim_by].sum(dim=1).max())
                tensors = [_cut(t, longest, i == len(tensors) - 1) for i, t in enumerate(tensors)]
            yield Batch([t.to(self.device, non_blocking=True) for t in tensors], len(tensors[-1]))


def plan_loader(data: Dataset, plan: Any, generator: torch.Generator, *, device: torch.device | None = None,
                pad_to: int | None = None) -> ResidentBatches | StreamedBatches:
    """The batches of exactly `plan.steps` steps (over `epochs` iterations) drawn by the plan's sampler.

    A `TensorDataset` that fits on `device` (`resident`) is moved there once and batches are gathered on it,
    drawn from a device generator seeded from `generator` (on the CPU, `generator` itself); `pad_to` pads each
    step to a multiple of rows of weight 0. Other data streams through a DataLoader; an empty Poisson batch then
    comes from Opacus' collate wrapper, shaped like the dataset's items.
    """
    sampler = plan.batch_selection
    grouping = Grouping.of(data)
    units = grouping.units if grouping is not None else None
    size, what = (units.count, "privacy units") if units is not None else (len(data), "examples")  # type: ignore[arg-type]
    if size != sampler.dataset_size:
        raise ValueError(f"the plan accounts for {sampler.dataset_size} {what}, the data has {size}")
    device = torch.device(device or "cpu")
    tensors = getattr(data, "tensors", None)
    if grouping is not None and (tensors is None or pad_to or not resident(tensors, device)):
        raise ValueError("declared privacy units and augmult need the training set's tensors resident on the "
                         "training device, unpadded")
    if tensors is not None and resident(tensors, device):
        device_generator = generator
        if device.type != "cpu":
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
            device_generator = torch.Generator(device=device).manual_seed(seed)
        trim_by = getattr(data, "trim_by", None)
        lengths = None if trim_by is None else tensors[trim_by].sum(dim=1).cpu().numpy()
        return ResidentBatches([t.to(device) for t in tensors], sampler, generator, device_generator, pad_to,
                               lengths, grouping)
    first = data[0]
    collate = wrap_collate_with_empty(collate_fn=default_collate,
                                      sample_empty_shapes=[(0, *shape_safe(x)) for x in first],
                                      dtypes=[dtype_safe(x) for x in first])
    return StreamedBatches(DataLoader(data, batch_sampler=sampler.batch_sampler(generator), collate_fn=collate),
                           device, getattr(data, "trim_by", None))


def make_private(module: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Dataset, plan: Any, *,
                 criterion: Any, generator: torch.Generator, grad_sample_mode: str = "hooks",
                 noise_generator: torch.Generator | None = None, secure_mode: bool = False,
                 after_step: AfterStep | None = None, noise_map: NoiseMap | None = None,
                 state: Mapping[str, float] | None = None, update_state: StateUpdate | None = None,
                 released_hook: ReleasedHook | None = None, pad_to: int | None = None,
                 guard: bool = True) -> PrivateTraining:
    """DP-SGD's wrap, every part taken from `plan.parts` (sampler, clipper, noise, other releases), with the
    mechanism's `state` (name -> initial value, kept as device tensors), its `update_state` and its
    `released_hook` (each sees copies of the releases), privbench's post-processing `after_step`; batches on
    the module's device (`plan_loader`, padded to multiples of `pad_to` rows when given). `guard`: the
    optimizer checks every step against the plan (`integrity.StepGuard`; its findings after training), and
    keeps the state trajectory for the replay when the mechanism updates a state."""
    parts = plan.parts
    clipper = parts.clipper
    opt_cls = optimizer_class(clipper.opacus_clipping, grad_sample_mode)
    if isinstance(module, GradSampleModule):
        raise ValueError("make_private takes the plain module, not one Opacus already wrapped")
    if pad_to and grad_sample_mode != "bk":  # Opacus' hooks scale per-sample gradients by the rows, padding included
        raise ValueError(f"padded batches (pad_to) need grad_sample_mode bk, got {grad_sample_mode!r}")
    if Grouping.of(data) is not None and grad_sample_mode == "ghost":  # Opacus' ghost clips rows, never sees groups
        raise ValueError("declared privacy units and augmult clip a unit's rows together (grad_sample_mode bk, "
                         "hooks, functorch or ew), not ghost")
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    tensors = {name: torch.tensor(float(value), device=device) for name, value in (state or {}).items()}
    bound_key = clipper.state_key
    if bound_key is not None and bound_key not in tensors:
        raise ValueError(f"{plan.mechanism}: the clipper reads its bound from state {bound_key!r}, which the "
                         f"mechanism's initial_state does not give (it gives {sorted(tensors)})")
    needs_norms = bool(parts.releases) or bound_key is not None
    if needs_norms and (grad_sample_mode == "ghost" or clipper.opacus_clipping != "flat"):
        raise ValueError(f"{plan.mechanism}: releases besides the gradient and a state-set clip bound need flat "
                         f"clipping with per-example norms (grad_sample_mode bk, hooks, functorch or ew), not "
                         f"{grad_sample_mode} with {clipper.name} clipping")
    kwargs: dict[str, Any] = {"batch_first": True, "loss_reduction": "mean"}
    if grad_sample_mode == "ghost":
        kwargs["max_grad_norm"] = clipper.max_grad_norm
    max_grad_norm: Any = clipper.max_grad_norm
    engine = None
    if grad_sample_mode == "bk":  # one backward pass leaves sum_i c_i G_i in p.grad (docs/clipping.md)
        engine = BookkeepingEngine(module, max_grad_norm, clipping=clipper.opacus_clipping)
        if bound_key is not None:
            engine.max_grad_norm = tensors[bound_key]  # the engine reads the bound in force each step
        wrapped, max_grad_norm = module, clipper.bound  # the optimizer's scalar bound: the example's bound
    else:
        wrapped = prepare_module(module, grad_sample_mode, True, **kwargs)
    dp_optimizer = opt_cls(
        optimizer, noise=parts.noise, planned_steps=plan.steps, after_step=after_step, noise_map=noise_map,
        releases=parts.releases, state=tensors, update_state=update_state, bound_key=bound_key,
        declared_bound=clipper.bound, noise_multiplier=plan.sigma, max_grad_norm=max_grad_norm,
        expected_batch_size=parts.sampler.batch_size, loss_reduction="mean", generator=noise_generator,
        secure_mode=secure_mode, released_hook=released_hook)
    if grad_sample_mode == "ghost":
        dp_optimizer.engine = wrapped  # Opacus' ghost module clips, at its own max_grad_norm (`clipped_norm`)
        criterion = DPLossFastGradientClipping(wrapped, dp_optimizer, criterion, "mean")
    elif engine is not None:
        dp_optimizer.engine = engine
        criterion = BookkeepingLoss(engine, criterion)
    if guard:

        dp_optimizer.guard = StepGuard(dp_optimizer, plan, engine=engine, generator=noise_generator,
                                       trace=update_state is not None, module=module)
    return PrivateTraining(wrapped, dp_optimizer, plan_loader(data, plan, generator, device=device, pad_to=pad_to),
                           criterion)


__all__ = ["GRAD_SAMPLE_MODES", "Batch", "CanaryProbe", "Grouping", "PlanViolation", "PrivateBookkeepingOptimizer",
           "PrivateDPOptimizer", "PrivateGhostOptimizer", "PrivateOptimizerMixin", "PrivatePerLayerOptimizer",
           "PrivateTraining", "ReleaseObserver", "ReleasedHook", "ResidentBatches", "StateUpdate", "StreamedBatches",
           "make_private", "optimizer_class", "plan_loader", "resident"]
