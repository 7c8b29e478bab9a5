"""Rows stay independent through the model and the loss: DP-SGD clips each example's gradient, and the bound
holds only when example i's gradient depends on example i alone. A layer that mixes the rows of a batch
(BatchNorm in train mode, a loss normalised over the batch, any `x - x.mean(0)`) lets one example move every
other example's clipped gradient, so the sensitivity the accountant assumes no longer bounds a step.

Two checks, both from the outside:

- `validate` / `refuse` / `fix`: known mixers by rule, in the style of Opacus' `ModuleValidator` (each rule names
  the module's path, its type, why it mixes rows, and the fix; `fix` swaps what it can, as Opacus does). A trial
  refuses such a model before anything runs.
- `row_dependence` / `RowWatch`: what no rule names, measured. On the real model and the real per-example loss,
  on a real batch, example j is replaced by another real example, and the other examples' outputs and
  per-example gradients must not move. On a dependence the verdict names the first module (in execution order,
  by forward hooks) whose output rows moved. The trainer probes before training and again on a few random
  steps; the steps' results stay on the device and are read once, after training.

Works without Ray or MLflow (a notebook can validate and probe a model).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from mechanisms.framework.integrity.findings import Finding

ROW_RTOL = 1e-5  # a move of other rows' outputs or gradients, relative to their largest value, that is a dependence
PROBE_STEPS = 2  # training steps probed at most (drawn at random), besides the probe before training ...
PROBE_EVERY = 50  # ... one per this many planned steps (at least one): a probe costs 1-2 DP steps of a small model
PROBE_ROWS = 64  # rows of a real batch the probe before training uses at most (the trial's batch size below that)
PROBE_TRAINING_ROWS = 16  # examples of a step's batch a training probe uses (the first; 0.1-0.2 of a cnn's DP step)


# ---- rules ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Violation:
    """One module a rule refuses: where it is, what it is, why it breaks DP-SGD, and the fix."""

    path: str  # the module's path in the model ("" for the model itself)
    kind: str  # its type's name
    why: str
    fix: str

    def line(self) -> str:
        where = f"`{self.path}`" if self.path else "itself"
        return f"the model's module {where} ({self.kind}) {self.why}; {self.fix}"


@dataclasses.dataclass(frozen=True)
class Rule:
    """A known way a module breaks DP-SGD: `applies(module)` in the mode training runs it in; `replace` builds the
    fixed module (None: no automatic fix)."""

    name: str
    applies: Callable[[nn.Module], bool]
    why: str
    fix: str
    replace: Callable[[nn.Module], nn.Module] | None = None


def _batch_norm(module: nn.Module) -> bool:
    # in train mode it normalises with the batch's statistics; without running statistics it does so in eval mode too
    return isinstance(module, nn.modules.batchnorm._BatchNorm) and (module.training
                                                                     or not module.track_running_stats)


def _instance_norm_stats(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats \
        and module.training


def _running_statistics(module: nn.Module) -> bool:
    """Any other module that keeps running statistics and updates them in training (a custom norm layer)."""
    if isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)):
        return False
    own = [name for name, _ in module.named_buffers(recurse=False)]
    return module.training and (bool(getattr(module, "track_running_stats", False))
                                or any(name.startswith("running_") for name in own))


def _to_group_norm(module: nn.Module) -> nn.Module:
    """Opacus' fix: GroupNorm with gcd(32, channels) groups, affine as the BatchNorm was."""
    channels = module.num_features
    return nn.GroupNorm(math.gcd(32, channels), channels, affine=module.affine)


def _without_running_stats(module: nn.Module) -> nn.Module:
    fixed = copy.deepcopy(module)
    fixed.track_running_stats = False
    fixed.running_mean = fixed.running_var = fixed.num_batches_tracked = None
    return fixed


RULES: tuple[Rule, ...] = (
    Rule("batch_norm", _batch_norm,
         "normalises each example with its batch's mean and variance in training, so one example moves every other "
         "example's output and clipped gradient (and its running statistics release the training set's)",
         "replace it with GroupNorm or LayerNorm (mechanisms.framework.model_checks.fix(model) swaps in GroupNorm "
         "with gcd(32, channels) groups)",
         _to_group_norm),
    Rule("instance_norm_running_stats", _instance_norm_stats,
         "keeps running statistics of the training batches, which no release accounts",
         "set track_running_stats=False (mechanisms.framework.model_checks.fix(model) does)",
         _without_running_stats),
    Rule("running_statistics", _running_statistics,
         "keeps running statistics of the training batches, which no release accounts",
         "freeze them (keep the module in eval mode) or release them privately through a Statistic"),
)


@contextlib.contextmanager
def training_mode(module: nn.Module) -> Iterator[nn.Module]:
    """`module` as the trainer runs it (`module.train()`: a module that overrides `train` to stay frozen stays
    frozen), every submodule's mode restored afterwards."""
    modes = [(m, m.training) for m in module.modules()]
    module.train()
    try:
        yield module
    finally:
        for m, mode in modes:
            m.training = mode


def validate(module: nn.Module, rules: Sequence[Rule] = RULES) -> list[Violation]:
    """The modules of `module` that a rule refuses, in the mode training runs them in (empty: none)."""
    with training_mode(module):
        return [Violation(path, type(m).__name__, rule.why, rule.fix)
                for path, m in module.named_modules() for rule in rules if rule.applies(m)]


class ModelRefused(ValueError):
    """A private trial's model mixes the rows of a batch or keeps unaccounted running statistics."""


def refuse(module: nn.Module) -> None:
    """Raise `ModelRefused`, in one line naming the first module and its fix, when a rule refuses the model."""
    found = validate(module)
    if found:
        more = f" (and {len(found) - 1} more module(s))" if len(found) > 1 else ""
        raise ModelRefused(f"{found[0].line()}{more}")


def fix(module: nn.Module, rules: Sequence[Rule] = RULES) -> nn.Module:
    """A copy of `module` with every refused module that has a fix replaced (Opacus' `ModuleValidator.fix`); the
    replacement sits on the device of the module it replaces. What has no fix stays, and `validate` names it."""
    fixed = copy.deepcopy(module)
    with training_mode(fixed):
        targets = [(path, m, rule) for path, m in fixed.named_modules() for rule in rules
                   if rule.replace is not None and rule.applies(m)]
    for path, m, rule in targets:
        held = next(iter([*m.parameters(), *m.buffers()]), None)  # a tensor of the module: its device
        new = rule.replace(m)
        if held is not None:
            new = new.to(held.device)
        new.train(m.training)
        if not path:
            return new
        parent, _, name = path.rpartition(".")
        fixed.get_submodule(parent)._modules[name] = new
    return fixed


# ---- the probe ------------------------------------------------------------------------------------------------
def per_example_cross_entropy(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The trainer's loss, per example (its mean is `nn.CrossEntropyLoss()`)."""
    return nn.functional.cross_entropy(outputs, labels, reduction="none")


@dataclasses.dataclass(frozen=True)
class RowDependence:
    """One probe's measurements, device scalars until `finding` reads them: how far the other rows moved (relative
    to their largest value) in each module's input and output (`modules`, in the order their outputs came), in the
    model's output and in the per-example gradients."""

    rows: int
    modules: tuple[str, ...]
    kinds: tuple[str, ...]
    module_change: torch.Tensor  # (modules, 2): input, output
    output_change: torch.Tensor
    gradient_change: torch.Tensor
    root: str  # the model's type name


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    return next((t for t in map(_first_tensor, items) if t is not None), None)


def _moved(a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The largest move of the kept rows (`keep`: 1 per row, 0 for the changed one) relative to their largest
    value; a device scalar."""
    a, b = a.detach().reshape(len(a), -1).float(), b.detach().reshape(len(b), -1).float()
    if not a.shape[1]:
        return keep.new_zeros(())
    scale = (a.abs().amax(1) * keep).amax().clamp_min(1e-30)
    return ((a - b).abs().amax(1) * keep).amax() / scale


class _Recorder:
    """Forward hooks on every module: the first pass keeps each batch-first input and output, the second compares
    its own with them (device scalars)."""

    def __init__(self, module: nn.Module, rows: int, keep: torch.Tensor) -> None:
        self.rows, self.keep = rows, keep
        self.names: list[str] = []
        self.kinds: list[str] = []
        self.kept: list[tuple[torch.Tensor | None, torch.Tensor | None]] = []
        self.changes: list[torch.Tensor] = []
        self.second, self.position = False, 0
        self.handles = [m.register_forward_hook(self._hook(name), with_kwargs=True)
                        for name, m in module.named_modules()]

    def _rowwise(self, value: Any) -> torch.Tensor | None:
        t = _first_tensor(value)
        return t if t is not None and t.dim() and len(t) == self.rows and t.is_floating_point() else None

    def _hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            x = self._rowwise(args) if args else self._rowwise(kwargs)
            y = self._rowwise(output)
            if not self.second:
                self.names.append(name)
                self.kinds.append(type(module).__name__)
                self.kept.append((None if x is None else x.detach().clone(), None if y is None else y.detach().clone()))
                return
            at, self.position = self.position, self.position + 1
            if at >= len(self.names):  # more calls than the first pass made: another path, not compared
                return
            zero = self.keep.new_zeros(())
            (x0, y0), pair = self.kept[at], []
            for old, new in ((x0, x), (y0, y)):  # a call that is not the first pass's (another path) compares as 0
                pair.append(_moved(old, new, self.keep) if self.names[at] == name and old is not None
                            and new is not None and old.shape == new.shape else zero)
            self.changes.append(torch.stack(pair))  # row `at`: the changes stay aligned with the names

        return hook

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def row_dependence(module: nn.Module, inputs: Sequence[torch.Tensor], labels: torch.Tensor, *, changed: int = 0,
                   donor: Sequence[torch.Tensor] | None = None, donor_label: torch.Tensor | None = None,
                   loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = per_example_cross_entropy,
                   seed: int = 0) -> RowDependence:
    """Replace example `changed` of the batch (`inputs`, batch-first, and `labels`) by `donor` (one row of each
    input, and its label; by default the batch's next row) and measure how far every other example's output, and
    the gradient of a weighted sum of their per-example losses (distinct fixed weights: it moves when any of their
    gradients does), moved. Both passes run in train mode with torch's generators seeded alike (dropout draws the
    same masks) and restored afterwards. Nothing is read on the host: the result's tensors stay on the device."""
    rows = len(labels)
    if rows < 2:
        raise ValueError("the row probe needs a batch of at least 2 examples")
    if donor is None:
        other = (changed + 1) % rows
        donor, donor_label = [x[other] for x in inputs], labels[other]
    device = labels.device
    keep = torch.ones(rows, device=device)
    keep[changed] = 0.0
    weights = keep * torch.linspace(1.0, 2.0, rows, device=device)
    swapped = [x.clone() for x in inputs]
    for x, d in zip(swapped, donor, strict=True):
        x[changed] = d
    swapped_labels = labels.clone()
    swapped_labels[changed] = donor_label if donor_label is not None else labels[changed]
    params = [p for p in module.parameters() if p.requires_grad]
    recorder = _Recorder(module, rows, keep)
    outs, grads = [], []
    try:
        with training_mode(module):
            for xs, ys in ((inputs, labels), (swapped, swapped_labels)):
                with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                    torch.manual_seed(seed)
                    out = module(*xs)
                    total = (loss(out, ys) * weights).sum()
                grads.append(torch.autograd.grad(total, params, allow_unused=True) if params else ())
                outs.append(out.detach())
                recorder.second = True
    finally:
        recorder.close()
    zero = keep.new_zeros(())
    pairs = [(a, b) for a, b in zip(*grads, strict=True) if a is not None and b is not None]
    if pairs:
        scale = torch.stack([a.abs().amax() for a, _ in pairs]).amax().clamp_min(1e-30)
        gradient = torch.stack([(a - b).abs().amax() for a, b in pairs]).amax() / scale
    else:
        gradient = zero
    changes = torch.stack(recorder.changes) if recorder.changes else keep.new_zeros((0, 2))
    return RowDependence(rows, tuple(recorder.names[:len(recorder.changes)]),
                         tuple(recorder.kinds[:len(recorder.changes)]), changes, _moved(outs[0], outs[1], keep),
                         gradient, type(module).__name__)


def describe(result: RowDependence, values: Sequence[float] | None = None) -> str | None:
    """Why the rows are not independent, in words (None: they are). `values`: the result's numbers already read
    (`_values`), else read here."""
    output, gradient, *changes = values if values is not None else _values(result)
    if output <= ROW_RTOL and gradient <= ROW_RTOL:
        return None
    pairs = list(zip(changes[0::2], changes[1::2], strict=True))
    first = next((i for i, (_, out) in enumerate(pairs) if out > ROW_RTOL), None)
    if first is None:
        where = "in the backward pass (the other examples' outputs did not move, their gradients did)"
    elif pairs[first][0] > ROW_RTOL:
        where = (f"in code outside any module, before the module `{result.modules[first]}` "
                 f"({result.kinds[first]}) runs (its input rows already moved)")
    elif not result.modules[first]:
        where = f"in the model's own forward ({result.root}.forward, outside its submodules)"
    else:
        where = f"in the model's module `{result.modules[first]}` ({result.kinds[first]})"
    return (f"changing one example of a batch of {result.rows} moved the other examples' outputs by {output:.2g} and "
            f"their per-example gradients by {gradient:.2g} (relative): the rows mix {where}, so clipping no longer "
            "bounds one example's effect on a step")


def _flat(result: RowDependence) -> torch.Tensor:
    """The result's numbers in one device vector: output, gradient, then each module's input and output."""
    return torch.cat([result.output_change.reshape(1).float(), result.gradient_change.reshape(1).float(),
                      result.module_change.reshape(-1).float()])


def _values(result: RowDependence) -> list[float]:
    return _flat(result).tolist()


def probe_finding(result: RowDependence, when: str = "before training") -> Finding:
    """The probe's finding (`row_independence`); reads the device once."""
    why = describe(result)
    return Finding("row_independence", why is None, f"{when}, {why}" if why else "")


def probe_count(steps: int) -> int:
    """How many of a trial's `steps` the trainer probes: one per PROBE_EVERY, at least one, at most PROBE_STEPS."""
    return min(PROBE_STEPS, max(1, steps // PROBE_EVERY), steps)


class RowWatch:
    """The trainer's row probe: before training on a real batch, and on `probes` steps drawn at random among
    `steps` (by default one per PROBE_EVERY, at least one, at most PROBE_STEPS: at most about 4% of the steps' CPU
    time from 44 planned steps on; benchmarks/row_probe_cost.py), on the first PROBE_TRAINING_ROWS
    examples of that step's batch with the parameters and buffers the model has then. The probes run on a twin of
    the model taken before the private step wraps it (so no clipping engine or Opacus hook sees the probe's
    passes), loaded with the model's state on the device; their results stay there until `findings`."""

    def __init__(self, module: nn.Module, steps: int, *, probes: int | None = None, seed: int = 0) -> None:
        self.live, self.twin = module, copy.deepcopy(module)
        probes = probe_count(steps) if probes is None else probes
        draws = random.Random(seed)  # its own stream: training's draws are untouched
        self.at = frozenset(draws.sample(range(1, steps + 1), min(probes, max(steps, 0))))
        self.seed = seed
        self.results: list[tuple[str, RowDependence]] = []

    def before_training(self, inputs: Sequence[torch.Tensor], labels: torch.Tensor,
                        donor: Sequence[torch.Tensor], donor_label: torch.Tensor) -> Finding:
        """The probe on a real batch before the first step (read at once: it costs one read, once)."""
        self.sync()
        return probe_finding(row_dependence(self.twin, inputs, labels, donor=donor, donor_label=donor_label,
                                            seed=self.seed))

    def sync(self) -> None:
        """The twin's parameters and buffers set to the model's (device copies), both fetched by name now: a
        module may have assigned itself a new buffer since."""
        live = dict(self.live.named_parameters()) | dict(self.live.named_buffers())
        with torch.no_grad():
            for name, twin in [*self.twin.named_parameters(), *self.twin.named_buffers()]:
                if name in live and live[name].shape == twin.shape:
                    twin.copy_(live[name])

    def step(self, step: int, inputs: Sequence[torch.Tensor], labels: torch.Tensor, rows: int) -> None:
        """Before training step `step` (from 1) with its batch (its first `rows` rows are examples): probe it when
        it is one of the drawn steps (a batch of fewer than 2 examples is skipped)."""
        if step not in self.at or rows < 2:
            return
        self.sync()
        rows = min(rows, PROBE_TRAINING_ROWS)
        xs = [x[:rows] for x in inputs]
        changed = (step * 7919) % rows  # which example is swapped moves from probe to probe
        self.results.append((f"at step {step}", row_dependence(self.twin, xs, labels[:rows], changed=changed,
                                                               seed=self.seed + step)))

    def findings(self) -> list[Finding]:
        """The training probes' finding (`row_independence`), every result read in one transfer."""
        if not self.results:
            return []
        sizes = [2 + r.module_change.numel() for _, r in self.results]
        flat = torch.cat([_flat(r) for _, r in self.results]).tolist()
        reasons, start = [], 0
        for (when, result), size in zip(self.results, sizes, strict=True):
            if why := describe(result, flat[start:start + size]):
                reasons.append(f"{when}, {why}")
            start += size
        return [Finding("row_independence", not reasons, "; ".join(reasons))]


__all__ = ["PROBE_EVERY", "PROBE_ROWS", "PROBE_STEPS", "PROBE_TRAINING_ROWS", "ROW_RTOL", "RULES", "ModelRefused",
           "RowDependence", "RowWatch", "Rule", "Violation", "describe", "fix", "per_example_cross_entropy",
           "probe_count", "probe_finding", "refuse", "row_dependence", "training_mode", "validate"]
