"""What the integrity checks measure while the private step runs, on the device and without waiting on the host:
the step's guard (`StepGuard`: the plan's objects, the bound's range, the noise stream, the observers), the
model-update shadow (`ModelShadow`), the state trajectory the analysis replays (`StateTrace`), and the copies
hooks get (`copied`). privbench's private optimizer runs them; `verdict` turns what they saw into findings."""

from __future__ import annotations

import base64
import itertools
import math
import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mechanisms.framework.integrity.findings import Finding
from mechanisms.framework.integrity.trust import own_class

if TYPE_CHECKING:
    import torch

    from mechanisms.parts.plan import PrivacyPlan

SHADOW_COORDINATES = 4  # k coordinates per parameter tensor the model-update shadow recomputes each step
SHADOW_RTOL = 1e-3  # a coordinate's mismatch allowed, relative to its update (floating-point order of operations)
SHADOW_BLOCK = 64  # steps the model-update shadow records on the device before it compares them at once
STATE_COORDINATES = 16  # coordinates per untrained state tensor (buffer, frozen parameter) the state watch reads
STATE_FULL_VALUES = 2**24  # untrained state values kept whole, to compare every one after training
REPLAY_RTOL, REPLAY_ATOL = 1e-4, 1e-6  # the replayed state against the recorded one (device vs CPU arithmetic)
TRACE_GRADIENT_VALUES = 2**20  # released gradient coordinates (over all steps) a trace keeps for the replay
TRACE_CHUNK = 256  # rows (steps) of the state trace allocated at a time on the device

# ---- training: every step ------------------------------------------------------------------------------------
def copied(released: Any, *, lazy: bool = False, on_read: Any = None) -> Any:
    """A copy of a step's releases for a hook: its own tensors, so nothing it does reaches the step. `lazy`: the
    gradient is copied when the hook first reads it (`on_read()` is called then), which is only sound while the
    step has not normalised it yet (the state update, inside the release)."""
    import torch  # lazy: heavy (torch)

    from mechanisms.parts.releases import Released  # lazy: keeps grid validation light

    if not lazy:
        gradient = tuple(torch._foreach_mul([g.detach() for g in released.gradient], 1.0)) if released.gradient \
            else ()
        return Released(gradient, {k: v.detach().clone() for k, v in released.values.items()})
    return _LazyReleased(released, on_read)


def _lazy_class() -> type:
    from mechanisms.parts.releases import Released  # lazy: keeps grid validation light

    class LazyReleased(Released):
        """Copies of a step's releases: the other releases at once, the gradient on first read."""

        def __init__(self, source: Any, on_read: Any) -> None:  # noqa: D107 - frozen: set through object
            object.__setattr__(self, "values", {k: v.detach().clone() for k, v in source.values.items()})
            object.__setattr__(self, "_source", tuple(source.gradient))
            object.__setattr__(self, "_copy", None)
            object.__setattr__(self, "_on_read", on_read)

        @property
        def gradient(self) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
            import torch  # lazy: heavy (torch)

            if self._copy is None:
                object.__setattr__(self, "_copy", tuple(torch._foreach_mul([g.detach() for g in self._source], 1.0)))
                if self._on_read is not None:
                    self._on_read()
            return self._copy

    return LazyReleased


def _LazyReleased(source: Any, on_read: Any) -> Any:  # noqa: N802 - builds the class on first use (torch-light)
    global _LAZY
    if _LAZY is None:
        _LAZY = _lazy_class()
    return _LAZY(source, on_read)


_LAZY: Any = None


class StepGuard:
    """The trainer's per-step checks (`CHECKS`), run by privbench's private optimizer inside every step.

    No check waits on the host: what is compared on the device (the bound in force against its range, the
    model-update shadow) accumulates into device flags read once, by `findings()`, after training; what lives
    on the host (which objects and numbers the step uses, the generator's state) is compared on the host.
    The expected values are snapshots taken by `make_private`, before any mechanism hook has run: they are
    the plan's.
    """

    def __init__(self, optimizer: Any, plan: PrivacyPlan, *, engine: Any = None, generator: Any = None,
                 shadow_coordinates: int = SHADOW_COORDINATES, trace: bool = False,
                 module: torch.nn.Module | None = None) -> None:
        import torch  # lazy: heavy (torch)

        parts = plan.parts
        self.optimizer, self.plan, self.generator = optimizer, plan, generator
        self.clipper, self.noise = parts.clipper, parts.noise
        self.bound_key = self.clipper.state_key
        self.range = (float(getattr(self.clipper, "min_bound", self.clipper.bound)), float(self.clipper.max_bound))
        params = list(optimizer.params)
        device = params[0].device if params else torch.device("cpu")
        self._clamped = torch.zeros((), dtype=torch.int32, device=device)  # steps whose state bound was clamped
        self._out_of_range = torch.zeros((), dtype=torch.int32, device=device)  # steps whose bound in force was out
        self.failures: dict[str, list[str]] = {}
        self.steps = 0
        watched: list[tuple[str, Any, str]] = [
            ("the optimizer's clip bound", optimizer, "max_grad_norm"), ("the noise part", optimizer, "noise"),
            ("sigma", optimizer, "noise_multiplier"), ("the expected batch size", optimizer, "expected_batch_size"),
            ("the other releases", optimizer, "releases"), ("the noise map", optimizer, "noise_map"),
            ("the state update", optimizer, "update_state")]
        if hasattr(optimizer, "max_grad_norms"):
            watched.append(("the per-layer bounds", optimizer, "max_grad_norms"))
        if engine is not None:
            watched.append(("the clipping engine's bound", engine, "max_grad_norm"))
        self._watched = [(label, obj, attr, getattr(obj, attr)) for label, obj, attr in watched]
        # the same, per object: one C-level fetch of its watched attributes and an identity test (a value that is
        # not the planned object goes to the full comparison)
        fetch: dict[int, tuple[Any, list[str], list[Any]]] = {}
        for _, obj, attr, expected in self._watched:
            _, attrs, values = fetch.setdefault(id(obj), (obj, [], []))
            attrs.append(attr)
            values.append(expected)
        self._fetch = [(obj, operator.attrgetter(*attrs, attrs[0]), (*values, values[0]))  # 2+ names: a tuple
                       for obj, attrs, values in fetch.values()]
        self._stream: Any = None
        self.stream_checked = generator is not None and getattr(self.noise, "continues_stream", True)
        if self.stream_checked:
            try:
                generator.get_state()
            except (RuntimeError, NotImplementedError):  # a secure generator has no readable state
                self.stream_checked = False
        self.shadow = ModelShadow.for_optimizer(optimizer, shadow_coordinates)
        # the rest of the model's state (`module`: the model the optimizer trains), which nothing releases
        self.state_watch = StateWatch(module, params) if module is not None else None
        self.trace = StateTrace(sum(p.numel() for p in params)) if trace else None

    # -- host checks ------------------------------------------------------------------------------------------
    def fail(self, check: str, reason: str, *, during: bool = True) -> None:
        """Record a failure once (`during` training: with the step it was first seen at)."""
        seen = self.failures.setdefault(check, [])
        if reason not in {r.split(" (first at step")[0] for r in seen} and len(seen) < 5:
            seen.append(f"{reason} (first at step {self.steps + 1})" if during else reason)

    def before_release(self) -> None:
        """At the start of each release: the plan's objects and numbers, the noise stream, the observers, and the
        bound in force against its range."""
        import torch  # lazy: heavy (torch)

        opt = self.optimizer
        for obj, fetch, expected in self._fetch:
            try:
                if all(map(operator.is_, fetch(obj), expected)):
                    continue
            except AttributeError:
                pass
            self._compare_watched()
            break
        if opt.generator is not self.generator:
            self.fail("noise_stream", "the optimizer's noise generator was replaced")
        elif self.stream_checked and self._stream is not None and not torch.equal(self.generator.get_state(),
                                                                                  self._stream):
            self.fail("noise_stream", "the noise generator was reseeded, rewound or drawn from between two steps: "
                                      "the noise is no longer fresh")
        for observer in opt.observers:
            if not own_class(type(observer)):
                cls = type(observer)
                self.fail("observers", f"a release observer of the mechanism's own ({cls.__module__}."
                                       f"{cls.__qualname__}) sees and may change the releases")
        if self.bound_key is not None and self.trace is None:  # a traced state is replayed, tampering included
            bound = opt.mechanism_state[self.bound_key]
            middle, half = (self.range[0] + self.range[1]) / 2, (self.range[1] - self.range[0]) / 2
            self._out_of_range.add_((bound - middle).abs_() > half * (1 + 1e-6) + 1e-12 * middle)

    def _compare_watched(self) -> None:
        """Which of the plan's objects and numbers changed (a value equal to the planned number is not a change)."""
        import torch  # lazy: heavy (torch)

        for label, obj, attr, expected in self._watched:
            value = getattr(obj, attr, None)
            if value is not expected and (isinstance(value, torch.Tensor) or isinstance(expected, torch.Tensor)
                                          or value != expected):
                self.fail("plan_parameters", f"{label} changed after planning (from {_show(expected)} to "
                                             f"{_show(value)})")

    def after_release(self, params: Sequence[torch.Tensor]) -> None:
        """After every draw of the step: where the noise stream stands, and the released gradient the update may
        use (`params[i].grad`, before the batch normalisation)."""
        if self.stream_checked:
            self._stream = self.generator.get_state()
        if self.shadow is not None:
            self.shadow.capture(params)

    def apply_state(self, state: dict[str, torch.Tensor], new: Mapping[str, Any]) -> None:
        """The state update's entries copied into the state (in place: the engine and the noise hold these
        tensors), the bound clamped to the clipper's declared range; a clamp is recorded."""
        if not new.keys() <= state.keys():
            self.fail("hooks", f"update_state returned entries {sorted(set(new) - set(state))} the initial state "
                               "does not have")
            new = {k: v for k, v in new.items() if k in state}
        clamped = apply_state(state, new, self.bound_key, self.range)
        if clamped is not None:
            self._clamped.add_(clamped)

    def after_update(self) -> None:
        """After the optimizer's update: the shadow's recomputed coordinates against the parameters, and the
        model's untrained state against what it was (`StateWatch`, when the guard was given the model)."""
        self.steps += 1
        if self.shadow is not None:
            self.shadow.check(self.optimizer)
        if self.state_watch is not None:
            self.state_watch.check()

    def after_post_processing(self) -> None:
        """privbench's own post-processing (a weight permutation) moved the parameters and the optimizer's
        state: the shadow and the state watch read them again."""
        if self.shadow is not None:
            self.shadow.resync(self.optimizer)
        if self.state_watch is not None:
            self.state_watch.resync()

    # -- the verdict ----------------------------------------------------------------------------------------------
    def findings(self) -> list[Finding]:
        """Every check's finding; reads the device flags once (after training)."""
        import torch  # lazy: heavy (torch)

        clamped, out_of_range = (int(x) for x in torch.stack([self._clamped, self._out_of_range]).tolist())
        if clamped:
            self.fail("clip_range", f"the mechanism's state set the clip bound outside the clipper's declared range "
                                    f"[{self.range[0]:g}, {self.range[1]:g}] in {clamped} step(s): it was clamped",
                      during=False)
        if out_of_range:
            self.fail("clip_range", f"the clip bound in force was outside the declared range [{self.range[0]:g}, "
                                    f"{self.range[1]:g}] at {out_of_range} step(s)", during=False)
        if self.shadow is not None and (why := self.shadow.verdict()):
            self.fail("model_update", why, during=False)
        if self.state_watch is not None and (why := self.state_watch.verdict()):
            self.fail("model_state", why, during=False)
        checks = ["hooks", "clip_range", "plan_parameters", "noise_stream", "observers", "model_update"]
        out = [Finding(c, c not in self.failures, "; ".join(self.failures.get(c, ()))) for c in checks]
        if self.shadow is None:
            out[-1] = Finding("model_update", True, "not checked: the optimizer is not SGD, Adam or AdamW")
        if not self.stream_checked and "noise_stream" not in self.failures:
            out[3] = Finding("noise_stream", True, "stream not checked (a secure generator, or a noise part that "
                                                   "declares it rewinds its stream); the generator's identity was")
        if self.state_watch is not None:
            out.append(Finding("model_state", "model_state" not in self.failures,
                               "; ".join(self.failures.get("model_state", ()))))
        return out


def apply_state(state: dict[str, torch.Tensor], new: Mapping[str, Any], bound_key: str | None,
                bounds: tuple[float, float]) -> torch.Tensor | None:
    """Copy `new` into `state` in place, the clip bound (`bound_key`) clamped to `bounds`; returns whether the
    bound was clamped (a device bool), None when no bound was set. Training and the replay apply state alike."""
    import torch  # lazy: heavy (torch)

    clamped = None
    for name, value in new.items():
        target = state[name]
        if not (isinstance(value, torch.Tensor) and value.dtype == target.dtype and value.device == target.device
                and value is not target):
            value = torch.as_tensor(value, dtype=target.dtype, device=target.device).clone()
        if value.shape != target.shape:
            value = value.reshape(target.shape)
        if name == bound_key:  # clamped as it is written: no tensor allocated but the flag
            torch.clamp(value, *bounds, out=target)
            clamped = target != value
        else:
            target.copy_(value)
    return clamped


def _show(value: Any) -> str:
    import torch  # lazy: heavy (torch)

    if isinstance(value, torch.Tensor):
        return "a tensor"
    text = repr(value)
    return text if len(text) <= 60 else type(value).__qualname__


def _coordinate_views(tensor: torch.Tensor, index: Sequence[int]) -> list[torch.Tensor]:
    """One-element views of `tensor` at the flat (row-major) positions `index`: they follow its in-place updates."""
    if tensor.is_contiguous():
        flat = tensor.view(-1)
        return [flat[i:i + 1] for i in index]
    views = []
    for i in index:
        at = []
        for size in reversed(tensor.shape):
            at.append(i % size)
            i //= size
        views.append(tensor[tuple(reversed(at))].reshape(1))
    return views


_BASE = operator.attrgetter("_base")
_CONTIGUOUS = operator.methodcaller("is_contiguous")
_OFFSET = operator.methodcaller("storage_offset")


class ModelShadow:
    """The model-update check: on `k` random coordinates of every trainable tensor, the optimizer's update
    recomputed from the released gradient (SGD with momentum, dampening, Nesterov and weight decay; Adam and AdamW
    with AMSGrad: all coordinate-wise), with the shadow's own copy of the optimizer's state, and compared with
    what the parameters did. A mismatch means the model saw something that was not released.

    A coordinate fails when |actual - expected| > SHADOW_RTOL |expected - before| + 1e-6 |before| (the second
    term allows for the rounding of before + update). Every step, into buffers allocated once: one gather of the
    released gradient's coordinates (one per tensor when the noise part did not release it as views of one buffer,
    as privbench's Gaussian noise does), the update on k x tensors coordinates written as the step's row of
    expected coordinates, and one `cat` of one-element views of the parameters (made once, whatever the number of
    tensors) written as its row of actual ones. The rows of a block of steps are then compared at once (about ten
    vector operations for the block instead of about ten per step): when it fills, before privbench's
    post-processing moves the parameters, and for the verdict. Every step is checked; the count of steps with a
    mismatched coordinate stays on the device. Nothing allocated per step scales with the model, and nothing is
    read on the host."""

    def __init__(self, optimizer: Any, k: int, kind: str) -> None:
        import torch  # lazy: heavy (torch)

        self.kind, self.params = kind, list(optimizer.params)
        self.decoupled = isinstance(optimizer.original_optimizer, torch.optim.AdamW)
        draws = torch.Generator().manual_seed(0x5EED)  # its own stream: training's draws are untouched
        drawn = [torch.randint(p.numel(), (min(k, p.numel()),), generator=draws) for p in self.params]
        self._host_index = [i.tolist() for i in drawn]  # the same, on the host: views are made from them
        self.index = [i.to(p.device) for i, p in zip(drawn, self.params, strict=True)]
        groups = {id(p): g for g in optimizer.original_optimizer.param_groups for p in g["params"]}
        spans: list[tuple[dict[str, Any], int, int]] = []
        start = 0
        for p, idx in zip(self.params, self.index, strict=True):
            group, end = groups[id(p)], start + len(idx)
            if spans and spans[-1][0] is group and spans[-1][2] == start:
                spans[-1] = (group, spans[-1][1], end)
            else:
                spans.append((group, start, end))
            start = end
        # one group (the usual case): its update runs on the whole rows, without slicing them each step
        self.group_spans: list[tuple[dict[str, Any], slice | None]] = (
            [(spans[0][0], None)] if len(spans) == 1 else [(g, slice(a, b)) for g, a, b in spans])
        first = self.params[0]
        self.n = start
        dtype, device = first.dtype, first.device
        # a block of steps: row i of `_actual` holds the coordinates before the block's step i and row i + 1 those
        # after it, row i of `_expected` the recomputed ones
        self.block = SHADOW_BLOCK
        self._actual = torch.zeros(self.block + 1, self.n, dtype=dtype, device=device)
        self._expected = torch.zeros(self.block, self.n, dtype=dtype, device=device)
        self._actual_rows, self._expected_rows = self._actual.unbind(0), self._expected.unbind(0)
        self._coordinates: list[torch.Tensor] = []  # a one-element view of each coordinate, made by `resync`
        self._grad = torch.empty(self.n, dtype=dtype, device=device)  # the released gradient's coordinates
        self._grad_slots = self._views(self._grad)
        self._step = 0  # the block's steps recorded
        self._global: tuple[Any, Any] | None = None  # (the gradient's offsets in its base buffer, global indices)
        self.state: dict[str, torch.Tensor | None] = {}
        self.t = 0  # the shadow's own count of updates (Adam's bias correction), on the host
        self.fresh = False  # a gradient was captured since the last check
        self._bad_steps = torch.zeros((), dtype=torch.int64, device=device)
        self.resync(optimizer)

    def _views(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        ends = [0]
        for i in self.index:
            ends.append(ends[-1] + len(i))
        return [buffer[a:b] for a, b in zip(ends[:-1], ends[1:], strict=True)]

    @classmethod
    def for_optimizer(cls, optimizer: Any, k: int) -> ModelShadow | None:
        import torch  # lazy: heavy (torch)

        inner = getattr(optimizer, "original_optimizer", None)
        kinds = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adam"}
        kind = kinds.get(type(inner))
        params = list(getattr(optimizer, "params", ()))
        if kind is None or not params or k <= 0 or len({(p.dtype, p.device) for p in params}) > 1:
            return None
        return cls(optimizer, k, kind)

    def _gather_params(self, into: int) -> None:
        """The parameters' coordinates into the block's actual row `into`: one `cat` of their views, whatever the
        number of tensors."""
        import torch  # lazy: heavy (torch)

        torch.cat(self._coordinates, out=self._actual_rows[into])

    def capture(self, params: Sequence[torch.Tensor]) -> None:
        """The released gradient's coordinates (what `p.grad` holds after the noise, before normalisation)."""
        import torch  # lazy: heavy (torch)

        grads = [p.grad for p in params]
        base = grads[0]._base
        if (base is not None and all(map(operator.is_, map(_BASE, grads), itertools.repeat(base)))
                and base.is_contiguous() and all(map(_CONTIGUOUS, grads))):
            offsets = (base.storage_offset(), *map(_OFFSET, grads))  # host metadata: no sync
            if self._global is None or self._global[0] != offsets:
                self._global = (offsets, torch.cat([i + o - offsets[0] for i, o in zip(self.index, offsets[1:],
                                                                                        strict=True)]))
            # `take` reads the buffer as one flat vector (no reshape); a gradient is no graph's node
            torch.take(base.detach() if base.requires_grad else base, self._global[1], out=self._grad)
        else:
            for g, i, slot in zip(grads, self.index, self._grad_slots, strict=True):
                torch.take(g.detach() if g.requires_grad else g, i, out=slot)
        self.fresh = True

    def resync(self, optimizer: Any) -> None:
        """Read the parameters and the optimizer's state buffers at the shadow's coordinates (at the start, and
        after privbench's own post-processing moved them: the steps recorded until then are compared first)."""
        import torch  # lazy: heavy (torch)

        self.compare()
        self._coordinates = [view for p, index in zip(self.params, self._host_index, strict=True)
                             for view in _coordinate_views(p.detach(), index)]  # a permutation may move storage
        self._gather_params(0)
        state = optimizer.original_optimizer.state
        names = ("momentum_buffer",) if self.kind == "sgd" else ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
        for name in names:
            tensors = [state.get(p, {}).get(name) for p in self.params]
            if any(t is None for t in tensors):
                self.state[name] = None
                continue
            self.state[name] = torch.cat([t.detach().reshape(-1).index_select(0, i)
                                          for t, i in zip(tensors, self.index, strict=True)])

    def check(self, optimizer: Any) -> None:
        """After an update: the step's expected coordinates (recomputed from the captured release) and actual ones
        (gathered from the parameters) as the block's next rows; a full block is compared."""
        i = self._step
        if self.fresh:
            self.t += 1
            scale = 1.0 / float(optimizer.expected_batch_size * getattr(optimizer, "accumulated_iterations", 1))
            for group, span in self.group_spans:
                self._update(group, i, span, scale)
        else:  # no release this step: nothing may move
            self._expected_rows[i].copy_(self._actual_rows[i])
        self._gather_params(i + 1)
        self._step = i + 1
        self.fresh = False
        if self._step == self.block:
            self.compare()

    def compare(self) -> None:
        """The block's recorded steps against their expected coordinates: the steps with a coordinate off by more
        than the tolerance (a NaN is not) join the device count, and the block restarts from the last step."""
        import torch  # lazy: heavy (torch)

        n = self._step
        if not n:
            return
        expected, before, after = self._expected[:n], self._actual[:n], self._actual[1:n + 1]
        tolerance = (expected - before).abs_().mul_(SHADOW_RTOL).add_(before.abs(), alpha=1e-6)
        self._bad_steps.add_(torch.gt((after - expected).abs_(), tolerance).any(1).sum())
        self._actual_rows[0].copy_(self._actual_rows[n])
        self._step = 0

    def _state(self, name: str, span: slice | None) -> torch.Tensor | None:
        buf = self.state.get(name)
        return buf if buf is None or span is None else buf[span]

    def _update(self, group: Mapping[str, Any], row: int, span: slice | None, scale: float) -> None:
        """Write into the block's expected `row` (its `span`; None: all) one optimizer update of the actual `row`
        from the captured gradient times `scale` (the normalisation), advancing the shadow's own state."""
        import torch  # lazy: heavy (torch)

        p, g, out = self._actual_rows[row], self._grad, self._expected_rows[row]
        if span is not None:
            p, g, out = p[span], g[span], out[span]
        if group.get("maximize", False):
            scale = -scale
        lr, wd = float(group["lr"]), float(group.get("weight_decay", 0.0))
        if self.kind == "sgd":
            momentum, dampening = float(group.get("momentum", 0.0)), float(group.get("dampening", 0.0))
            nesterov = group.get("nesterov", False)
            if wd or nesterov:  # the gradient itself is needed: normalised in place (captured afresh each step)
                g = g.mul_(scale)
                scale = 1.0
                if wd:
                    g.add_(p, alpha=wd)
            if not momentum:
                torch.add(p, g, alpha=-lr * scale, out=out)
                return
            buf = self._state("momentum_buffer", span)
            if buf is None:  # the first update: the buffer starts as the gradient (no dampening)
                self.state["momentum_buffer"] = torch.zeros_like(self._grad)
                buf = self._state("momentum_buffer", span)
                torch.mul(g, scale, out=buf)
            else:
                buf.mul_(momentum).add_(g, alpha=(1 - dampening) * scale)
            if nesterov:
                torch.add(g, buf, alpha=momentum, out=out)
                torch.add(p, out, alpha=-lr, out=out)
            else:
                torch.add(p, buf, alpha=-lr, out=out)
            return
        g = g.mul_(scale)
        beta1, beta2 = (float(x) for x in group["betas"])
        if wd and group.get("decoupled_weight_decay", self.decoupled):
            p = p * (1 - lr * wd)
        elif wd:
            g.add_(p, alpha=wd)
        for name in ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group.get("amsgrad", False) else ()):
            if self.state.get(name) is None:
                self.state[name] = torch.zeros_like(self._grad)
        m, v = self._state("exp_avg", span), self._state("exp_avg_sq", span)
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        if group.get("amsgrad", False):
            most = self._state("max_exp_avg_sq", span)
            v = torch.maximum(most, v, out=most)
        denom = (v.sqrt() / math.sqrt(1 - beta2 ** self.t)).add_(float(group["eps"]))
        torch.addcdiv(p, m, denom, value=-lr / (1 - beta1 ** self.t), out=out)

    def verdict(self) -> str | None:
        """Why the parameters did not follow the released update (None: they did); reads the device once."""
        self.compare()
        bad = int(self._bad_steps)
        if not bad:
            return None
        return (f"the parameters moved differently from the optimizer's update of the released gradient in {bad} "
                f"step(s): the model saw something that was not released")


class StateWatch:
    """The model-state check: every tensor of the model's state that the optimizer does not train (buffers:
    running statistics, standardisations, masks; frozen parameters) may change only by privbench's own
    post-processing. Nothing releases it, so a change means the model kept something of the training batches
    (BatchNorm's running statistics: the training set's exact means) that no accountant counts; running
    statistics pass only when they are frozen, or were released privately before training (a `Statistic`).

    After every step, one `cat` of one-element views at STATE_COORDINATES random coordinates of each tensor (made
    once) into a row allocated once, compared on the device with the row before training. After training, the
    tensors are fetched again by name (a module that assigns itself a new buffer is seen), and every value of
    those a copy was kept of (up to STATE_FULL_VALUES in all, in the model's order) is compared, the others at their
    coordinates. The flags are read once, by `verdict`."""

    def __init__(self, module: torch.nn.Module, trained: Sequence[torch.Tensor], k: int = STATE_COORDINATES) -> None:
        import torch  # lazy: heavy (torch)

        skip = {id(p) for p in trained}
        buffers = {id(b) for b in module.buffers()}
        self.names: list[str] = []
        self._slots: list[tuple[torch.nn.Module, str]] = []  # (owner, attribute): each tensor, fetched afresh
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if t is None or not t.numel() or id(t) in skip:
                continue
            skip.add(id(t))  # a tied tensor once
            owner, _, attr = name.rpartition(".")
            self._slots.append((module.get_submodule(owner), attr))
            self.names.append(f"the model's {'buffer' if id(t) in buffers else 'frozen parameter'} `{name}`")
        tensors = self._fetch()
        self._shapes = [t.shape for t in tensors]
        draws = torch.Generator().manual_seed(0x57A7E)  # its own stream: training's draws are untouched
        self._index = [torch.randint(t.numel(), (min(k, t.numel()),), generator=draws).tolist() for t in tensors]
        self._owner = [i for i, index in enumerate(self._index) for _ in index]  # each coordinate's tensor
        budget, self._kept = STATE_FULL_VALUES, []
        for i, t in enumerate(tensors):
            if t.numel() <= budget:
                budget -= t.numel()
                self._kept.append(i)
        device = tensors[0].device if tensors else torch.device("cpu")
        self._row = torch.zeros(len(self._owner), dtype=torch.float64, device=device)
        self._before = torch.zeros_like(self._row)
        self._changed = torch.zeros(len(self._owner), dtype=torch.bool, device=device)
        self._copies: dict[int, torch.Tensor] = {}
        self.resync()

    def _fetch(self) -> list[torch.Tensor]:
        return [getattr(owner, attr) for owner, attr in self._slots]

    def _views(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [view for t, index in zip(tensors, self._index, strict=True)
                for view in _coordinate_views(t.detach(), index)]

    def resync(self) -> None:
        """What the state is now becomes what it must stay (at the start, and after privbench's post-processing
        moved the model): the coordinates' row and the kept copies."""
        import torch  # lazy: heavy (torch)

        if not self._slots:
            return
        tensors = self._fetch()
        self._views_now = self._views(tensors)  # a permutation may move storage
        torch.cat(self._views_now, out=self._before)
        for i in self._kept:  # in place after the first time (a permutation resyncs every step)
            copy = self._copies.get(i)
            if copy is not None and copy.shape == tensors[i].shape:
                copy.copy_(tensors[i].detach())
            else:
                self._copies[i] = tensors[i].detach().clone()

    def check(self) -> None:
        """After an update: which coordinates differ from before training (NaN equals NaN); no host read."""
        import torch  # lazy: heavy (torch)

        if not self._slots:
            return
        row = torch.cat(self._views_now, out=self._row)
        self._changed.logical_or_(torch.ne(row, self._before).logical_and_(~(row.isnan() & self._before.isnan())))

    def verdict(self) -> str | None:
        """Which state tensors changed without a release (None: none); reads the device once."""
        import torch  # lazy: heavy (torch)

        if not self._slots:
            return None
        tensors = self._fetch()
        reshaped = {i for i, (t, shape) in enumerate(zip(tensors, self._shapes, strict=True)) if t.shape != shape}
        if not reshaped:
            self._views_now = self._views(tensors)  # the tensors the model holds now, replaced or not
        self.check()
        kept = [i for i in self._copies if i not in reshaped]
        whole = [(tensors[i].detach() != self._copies[i]).logical_and_(
            ~(tensors[i].detach().isnan() & self._copies[i].isnan())).any().reshape(1) for i in kept]
        flags = torch.cat([self._changed, *(w.to(self._changed.device) for w in whole)]).tolist()  # one read
        moved = {self._owner[i] for i, f in enumerate(flags[:len(self._owner)]) if f} | reshaped
        moved |= {i for i, f in zip(kept, flags[len(self._owner):], strict=True) if f}
        changed = [self.names[i] for i in sorted(moved)]
        if not changed:
            return None
        listed = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        return (f"{listed} changed during training, and no release covers it: the model kept something of the "
                "training batches (running statistics are refused unless frozen, or released privately through a "
                "Statistic before training)")


# ---- the state trajectory and its replay ---------------------------------------------------------------------
class StateTrace:
    """What the replay needs, kept on the device during training: each step's releases other than the gradient,
    the gradient of the steps whose state update read it (while they fit TRACE_GRADIENT_VALUES over the run), and
    the state after the step's update.

    A step's releases and state are one row of a device buffer allocated TRACE_CHUNK rows at a time: one `cat`
    writes it (the state's tensors, updated in place, are read through flat views made once), and nothing else is
    allocated per step. The layout (names, sizes) is the first step's; a step whose releases do not fit it
    stops the trace, and the replay then fails with the reason."""

    def __init__(self, n_params: int) -> None:
        self.n_params = n_params
        self.steps = 0
        self.gradients: dict[int, tuple[torch.Tensor, ...]] = {}
        self.gradient_dropped = False  # a read gradient did not fit: the replay gets none for that step
        self.read = False  # the state update read this step's gradient (set by the hook's copy)
        self.broken: str | None = None  # why the trace stopped
        self._names: tuple[tuple[str, ...], tuple[str, ...]] | None = None  # (the releases', the state's)
        self._sizes: list[int] = []  # each entry's coordinates, releases then state
        self._state_flat: list[torch.Tensor] = []  # flat views of the state's tensors
        self._flat = True  # the releases are 1-D: the row is their `cat` as they are
        self._chunks: list[torch.Tensor] = []
        self._free: Any = iter(())  # the rows of the last chunk not written yet

    def mark_read(self) -> None:
        self.read = True

    def add(self, released: Any, state: Mapping[str, torch.Tensor]) -> None:
        import torch  # lazy: heavy (torch)

        if self.read:
            self._keep_gradient(released.gradient)
        row = next(self._free, None)
        if row is None and (row := self._grow(released.values, state)) is None:
            return
        values = released.values.values()
        try:
            torch.cat([*values, *self._state_flat] if self._flat else
                      [*(v.reshape(-1) for v in values), *self._state_flat], out=row)
        except RuntimeError as exc:
            self._stop(released.values, f"{type(exc).__name__}: {exc}")
            return
        if row.shape[0] != self._spec[0]:  # `cat` resized the row: the releases changed their layout
            self._stop(released.values, "the releases' sizes changed")
            return
        self.steps += 1

    def _keep_gradient(self, gradient: Sequence[torch.Tensor]) -> None:
        import torch  # lazy: heavy (torch)

        self.read = False
        if (len(self.gradients) + 1) * self.n_params > TRACE_GRADIENT_VALUES:
            self.gradient_dropped = True
        else:
            self.gradients[self.steps] = tuple(torch._foreach_mul([g.detach() for g in gradient], 1.0))

    def _grow(self, values: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        """The next chunk's first row (at the first step: the layout from this step), None when nothing is
        recorded (the trace stopped, or there is nothing to record: the step only counts)."""
        import torch  # lazy: heavy (torch)

        if self.broken is not None:
            return None
        if self._names is None:
            tensors = [*values.values(), *state.values()]
            self._names = (tuple(values), tuple(state))
            self._sizes = [v.numel() for v in tensors]
            self._flat = all(v.dim() == 1 for v in values.values())
            self._state_flat = [v.detach().reshape(-1) for v in state.values()]  # views: they follow the updates
            dtype = torch.float32
            for v in tensors:
                dtype = torch.promote_types(dtype, v.dtype)
            self._spec = (sum(self._sizes), dtype, tensors[0].device if tensors else None)
        elif (tuple(values), tuple(state)) != self._names or any(
                a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
                for a, b in zip(state.values(), self._state_flat, strict=True)):
            self._stop(values, "the state's tensors were replaced")
            return None
        width, dtype, device = self._spec
        if not width:
            self.steps += 1
            return None
        self._chunks.append(torch.empty(TRACE_CHUNK, width, dtype=dtype, device=device))
        self._free = iter(self._chunks[-1].unbind(0))
        return next(self._free)

    def _stop(self, values: Mapping[str, torch.Tensor], why: str) -> None:
        shapes = [list(v.shape) for v in values.values()]
        self.broken = (f"step {self.steps + 1} released {list(values)} (shapes {shapes}), not the first step's "
                       f"layout {self._names} ({self._sizes} coordinates): {why}")
        self._free = iter(())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (arrays base64-encoded); one copy to the host per buffer, after training."""
        import torch  # lazy: heavy (torch)

        values: dict[str, Any] = {}
        states: dict[str, Any] = {}
        if self.steps and self._chunks:
            table = torch.cat(self._chunks)[:self.steps].double().cpu().numpy()
            names, state_names = self._names  # type: ignore[misc]
            start = 0
            for i, (name, size) in enumerate(zip((*names, *state_names), self._sizes, strict=True)):
                (values if i < len(names) else states)[name] = encode(table[:, start:start + size])
                start += size
        steps = sorted(self.gradients)
        gradients = None
        if steps:
            rows = [self.gradients[t] for t in steps]
            gradients = {"steps": steps, "shapes": [list(g.shape) for g in rows[0]],
                         "tensors": [encode(torch.stack([g[i].reshape(-1) for g in rows]).double().cpu().numpy())
                                     for i in range(len(rows[0]))]}
        return {"steps": self.steps, "values": values, "states": states, "gradients": gradients,
                "gradient_dropped": self.gradient_dropped, "broken": self.broken}


def encode(array: Any) -> dict[str, Any]:
    import numpy as np  # lazy: heavy (numpy)

    array = np.ascontiguousarray(array)
    return {"dtype": array.dtype.str, "shape": list(array.shape), "b64": base64.b64encode(array.tobytes()).decode()}


def decode(data: Mapping[str, Any]) -> Any:
    import numpy as np  # lazy: heavy (numpy)

    return np.frombuffer(base64.b64decode(data["b64"]), dtype=np.dtype(data["dtype"])).reshape(data["shape"]).copy()


__all__ = ["SHADOW_COORDINATES", "ModelShadow", "StateTrace", "StateWatch", "StepGuard", "apply_state", "copied",
           "decode", "encode"]
