"""One training loop for every mechanism: the mechanism only wraps model, optimizer and loader."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from mechanisms.clipping_engine import unsupported
from mechanisms.framework.integrity.model_checks import PROBE_ROWS, RowWatch
from mechanisms.framework.integrity.verdict import runs_own_step, step_findings
from mechanisms.parts.grouping import RowGroups, Units, group_rows
from workers.acceleration import StepPrecision, compiled
from workers.config import TrainConfig
from workers.datasets.contract import Split
from workers.measure import PeakMemory, StepTimer
from workers.models.contract import ModelBundle
from workers.timing import Stopwatch

Progress = Callable[[int, int, dict[str, Any]], None]


# One builder per name in workers.config.OPTIMIZERS (the names a grid may use; a test keeps them equal).
# Adam keeps its step count on the device where it can (`capturable`): otherwise every step reads it on the host.
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": lambda params, c: torch.optim.SGD(params, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay),
    "adam": lambda params, c: torch.optim.Adam(params, lr=c.lr, weight_decay=c.weight_decay,
                                               capturable=_on_accelerator(params)),
    "adamw": lambda params, c: torch.optim.AdamW(params, lr=c.lr, weight_decay=c.weight_decay,
                                                 capturable=_on_accelerator(params)),
}


def _on_accelerator(params: list[torch.Tensor]) -> bool:
    return bool(params) and params[0].device.type == "cuda"


def tensor_dataset(bundle: ModelBundle, split: Split) -> TensorDataset:
    """The encoded split with its labels last; `trim_by` (the model's `info["trim_by"]`) names the input whose
    row sums are each example's length, so batches can be cut to their longest example (`plan_loader`)."""
    data = TensorDataset(*bundle.encode(split), torch.from_numpy(split.labels))
    data.trim_by = bundle.info.get("trim_by")  # type: ignore[attr-defined]
    return data


@torch.no_grad()
def evaluate(module: nn.Module, data: TensorDataset, batch_size: int, device: torch.device) -> dict[str, float]:
    """Accuracy and mean loss over `data`, summed on the device and read once. The batches are slices of the
    held tensors, the ones a `DataLoader` would collate example by example (0.1 CPU s per pass over 10k images).
    It takes the one draw of torch's global generator that a `DataLoader`'s iterator takes (its base seed), so
    the training's random stream after an evaluation (dropout) is the one earlier privbench versions had, and a
    seed gives the results it gave before."""
    torch.empty((), dtype=torch.int64).random_()
    module.eval()
    correct = torch.zeros((), device=device, dtype=torch.long)
    loss = torch.zeros((), device=device, dtype=torch.float64)
    n = 0
    for *xs, y in zip(*(t.split(batch_size) for t in data.tensors), strict=True):
        xs, y = [x.to(device, non_blocking=True) for x in xs], y.to(device, non_blocking=True)
        logits = module(*xs)
        loss += nn.functional.cross_entropy(logits, y, reduction="sum").double()
        correct += (logits.argmax(-1) == y).sum()
        n += len(y)
    module.train()
    return {"accuracy": int(correct) / max(n, 1), "loss": float(loss) / max(n, 1)}


class LossCheck:
    """The training loss summed on the device and read every `every` steps and at each epoch's end: one host
    synchronisation per read, none in the steps between. A read that is not finite fails the trial
    (`Diverged`) with the range of steps it diverged in."""

    def __init__(self, every: int) -> None:
        self.every = every
        self._total: torch.Tensor | None = None
        self._steps, self._first = 0, 1
        self.epoch_total, self.epoch_steps = 0.0, 0

    def add(self, loss: torch.Tensor, step: int) -> bool:
        """Add one step's loss (a device scalar); True when a read is due."""
        loss = loss.detach().float()
        self._total = loss if self._total is None else self._total + loss
        self._steps += 1
        return self._steps >= self.every

    def read(self, step: int, epoch: int) -> float | None:
        """The mean loss since the last read (None if no step), checked."""
        if self._total is None:
            return None
        value = float(self._total)
        if not math.isfinite(value):
            raise Diverged(f"diverged: the training loss is {value} between steps {self._first} and {step} "
                           f"(epoch {epoch})")
        mean = value / self._steps
        self.epoch_total, self.epoch_steps = self.epoch_total + value, self.epoch_steps + self._steps
        self._total, self._steps, self._first = None, 0, step + 1
        return mean

    def epoch_mean(self) -> float:
        mean = self.epoch_total / max(self.epoch_steps, 1)
        self.epoch_total, self.epoch_steps = 0.0, 0
        return mean


@dataclasses.dataclass
class TrainOutcome:
    metrics: dict[str, float | None]
    curves: dict[str, list[float]]
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. the Opacus mode actually used


class Diverged(RuntimeError):
    """The training loss became NaN or infinite: the trial is failed, never finished."""


CHECK_EVERY = 50  # steps between reads of the loss (one host synchronisation each; progress is reported then)
PAD_TO = 32  # rows a compiled step's batches are padded to a multiple of (static shapes, few recompilations)


@dataclasses.dataclass(frozen=True)
class GradSampleMode:
    """The per-sample gradient engine a trial uses, where the choice came from, and why bk was not used."""

    name: str
    source: str  # "grid" (train.grad_sample_mode), "model" (its info), or "default"
    fallback: str | None = None


def grad_sample_mode(cfg: TrainConfig, bundle: ModelBundle, module: nn.Module, grouped: bool = False) -> GradSampleMode:
    """The grid's `grad_sample_mode`, else the model's (`info["grad_sample_mode"]`), else the book-keeping
    engine; bk falls back to the model's `fallback_grad_sample_mode` (Opacus hooks by default) where it cannot
    clip the model, and the record says so. A model that names none is told, in the record, which it got.
    `grouped` rows (`private_training.Grouping`): Opacus' ghost mode clips rows, so a model's ghost gives way to
    bk (which clips a unit's rows as one example) or, where bk cannot clip the model, Opacus' hooks."""
    if cfg.grad_sample_mode is not None:
        return GradSampleMode(cfg.grad_sample_mode, "grid")
    named = bundle.info.get("grad_sample_mode")
    mode = GradSampleMode(named, "model") if named else GradSampleMode("bk", "default")
    if grouped and mode.name == "ghost":
        mode = GradSampleMode("bk", mode.source)
    if mode.name == "bk":
        if why := unsupported(module):
            fallback = bundle.info.get("fallback_grad_sample_mode", "hooks")
            return GradSampleMode("hooks" if grouped else fallback, mode.source, "; ".join(why))
    return mode


def step_loss(criterion: Any, outputs: torch.Tensor, labels: torch.Tensor, batch: Any) -> Any:
    """The step's loss; a padded batch's rows are weighted (0 on padding), so padding adds nothing to it, to any
    gradient, norm or count (the book-keeping loss takes the weights; any other the weighted mean of its
    per-example losses over the examples)."""
    weights = getattr(batch, "weights", None)
    if weights is None:
        return criterion(outputs, labels)
    if hasattr(criterion, "engine"):  # the book-keeping engine's loss: per-sample losses, weighted
        return criterion(outputs, labels, weights=weights)
    per_example = nn.functional.cross_entropy(outputs, labels, reduction="none")
    return (per_example * weights.to(per_example.dtype)).sum() / max(batch.size, 1)


def report(on_progress: Progress | None, loss: float | None, done: int, total: int, epoch: int) -> None:
    if on_progress is not None and loss is not None:
        on_progress(done, total, {"epoch": epoch + 1, "loss": loss})


STATISTICS_CHUNK = 4096  # examples per call of a model's per-example statistic (bounds its working memory)


@torch.no_grad()
def release_statistics(bundle: ModelBundle, train_split: Split, plan: Any, generator: torch.Generator | None, *,
                       secure: bool = False) -> None:
    """Release the statistics of the training set the model needs (`bundle.statistics`) and hand them to it,
    before training: privately, as the plan accounts them (`plan.parts.dataset_releases`: each example's rows
    clipped, Gaussian noise added by the part), or exactly for a reference run, which claims no privacy.

    The statistics released are the plan's, checked against the model's: a model asking for a statistic
    the plan did not account (or one the plan accounts and nothing releases) stops the trial."""
    declared = {use.release.name: use for use in bundle.statistics}
    planned = None if plan.parts is None else {r.name: r for r in plan.parts.dataset_releases}
    if planned is not None and planned != {name: use.release for name, use in declared.items()}:
        raise RuntimeError(f"the plan accounts the statistics {sorted(planned)} but the model releases "
                           f"{sorted(declared)}; the accounted process must be the executed one")
    if not declared:
        return
    inputs = bundle.encode(train_split)
    n = len(train_split)
    units = getattr(train_split, "units", None)
    labels = (torch.from_numpy(np.asarray(train_split.labels)),)
    for name, use in declared.items():
        given = (*inputs, *labels) if use.labels else inputs
        rows = torch.cat([use.per_example(tuple(x[i:i + STATISTICS_CHUNK] for x in given)).double()
                          for i in range(0, n, STATISTICS_CHUNK)])
        if units is not None:  # a unit's rows summed before the release clips: one unit moves it by one bound
            index = Units.of(units)
            rows = group_rows(rows, RowGroups(torch.from_numpy(index.unit), index.count))
        if planned is None:
            released = rows.sum(0)
        else:
            device = generator.device if generator is not None else rows.device
            released = planned[name].release(rows.to(device), generator, secure=secure).cpu()
        use.receive(released, n)


@dataclasses.dataclass
class Setup:
    """A trial's training objects, built one way for the trainer and the benchmarks that measure its step."""

    training: Any  # mechanisms.framework.private_training.PrivateTraining
    precision: StepPrecision
    step_module: nn.Module
    evals: dict[str, TensorDataset]
    info: dict[str, Any]
    rows: RowWatch | None = None  # the row probe: before training and on a few random steps (its findings after)


def setup(bundle: ModelBundle, train_split: Split, eval_splits: dict[str, Split], mechanism: Any, plan: Any,
          cfg: TrainConfig, *, device: torch.device, generator: torch.Generator,
          noise_generator: torch.Generator | None = None, secure_mode: bool = False, private: bool = True,
          integrity: bool = True) -> Setup:
    """The model on `device`, its optimizer, the mechanism's private objects (batches, clipping, noise) from the
    plan, the precision and the (compiled) step module, and what the record says about them. `integrity` False
    skips the check that the private step is privbench's (`step_findings`) and the row probe: for a copy of a step
    already checked."""
    module = bundle.module.to(device)
    train_data = tensor_dataset(bundle, train_split)
    grouping = row_grouping(train_data, train_split, cfg.augmult)
    if grouping is not None and (cfg.precision != "fp32" or cfg.compile):
        raise ValueError("declared privacy units and augmult run in fp32, without compile (a unit's rows are one "
                         f"clipped example; its rounding margin and static shapes are not covered), got precision "
                         f"{cfg.precision}, compile {cfg.compile}")
    checked = integrity and private and runs_own_step(mechanism)
    # the row probe's twin of the model is taken before the private step wraps it; its first probe runs now
    rows = RowWatch(module, plan.steps, seed=generator.initial_seed()) if checked else None
    before = rows.before_training(*probe_batch(train_data, cfg.batch_size, generator.initial_seed(), device)) \
        if rows is not None else None
    evals = {name: tensor_dataset(bundle, s) for name, s in eval_splits.items() if len(s)}
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = OPTIMIZERS[cfg.optimizer](params, cfg)
    mode = grad_sample_mode(cfg, bundle, module, grouped=grouping is not None)
    info: dict[str, Any] = {"grad_sample_mode": mode.name, "grad_sample_mode_source": mode.source}
    if mode.fallback:
        info["bk_fallback"] = mode.fallback
    training = mechanism.make_private(module, optimizer, train_data, plan, criterion=nn.CrossEntropyLoss(),
                                      generator=generator, grad_sample_mode=mode.name, noise_generator=noise_generator,
                                      secure_mode=secure_mode, pad_to=PAD_TO if cfg.compile else None)
    if grouping is not None:
        if getattr(training.loader, "grouping", None) is None:  # a make_private of its own drew rows, not units
            raise ValueError(f"{plan.mechanism}'s make_private does not run privbench's loader, which declared privacy "
                             "units and augmult need (its batches would not be the accounted ones)")
        info["row_grouping"] = grouping | {"engine": mode.name}  # bk: a unit's rows as one example's positions
    # the step that runs is checked whoever wrote it: privbench's private step, a built-in's forward-noise step (what
    # is checked instead: `step_findings`), or a plugin's own, which fails; `integrity` False: a copy of a step already
    # checked (the paired overhead measurement)
    if integrity and private:
        info["integrity"] = [step_findings(training).to_dict(), *([before.to_dict()] if before is not None else [])]
    precision = StepPrecision(cfg.precision, device, private=private, grad_sample_mode=mode.name)
    step_module = compiled(training.module, mode.name, private) if cfg.compile else training.module
    return Setup(training, precision, step_module, evals, info, rows)


def probe_batch(data: TensorDataset, batch_size: int, seed: int, device: torch.device) -> tuple[Any, ...]:
    """A real batch of the training set for the row probe before training (the trial's batch size, at most
    PROBE_ROWS rows, drawn with `seed`) and one more real example to swap into it: (inputs, labels, donor inputs,
    donor label), on `device`."""
    *xs, y = data.tensors
    rows = max(2, min(batch_size, PROBE_ROWS, len(y) - 1))
    drawn = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))[:rows + 1]
    batch, donor = drawn[:rows], int(drawn[rows])
    return ([x[batch].to(device) for x in xs], y[batch].to(device), [x[donor].to(device) for x in xs],
            y[donor].to(device))


def row_grouping(data: TensorDataset, split: Split, augmult: int) -> dict[str, Any] | None:
    """Mark `data` with the training split's declared privacy units and the `augmult` setting, which the plan's
    loader reads (`private_training.Grouping`); what the record says about them (None: one row per unit)."""
    ids = getattr(split, "units", None)
    data.units = None if ids is None else Units.of(ids)  # type: ignore[attr-defined]
    data.augmult = augmult  # type: ignore[attr-defined]
    if data.units is None and augmult == 1:  # type: ignore[attr-defined]
        return None
    units = data.units  # type: ignore[attr-defined]
    return {"privacy_unit": "declared units" if units is not None else "record",
            "units": units.count if units is not None else len(split), "rows": len(split),
            "largest_unit": units.largest if units is not None else 1, "augmult": augmult}


def integrity_after_training(s: Setup) -> None:
    """Into `s.info` (when the step was checked): every step's checks (the guard's, the row probe's), each read
    once; the step's code again (whoever's step ran: a forward-noise step has no guard); the state trajectory the
    analysis replays."""
    info, guard = s.info, getattr(s.training.optimizer, "guard", None)
    if "integrity" not in info:
        return
    if guard is not None:
        info["integrity"] += [f.to_dict() for f in guard.findings()]
    if s.rows is not None:
        info["integrity"] += [f.to_dict() for f in s.rows.findings()]
    after = step_findings(s.training, "after the last step")
    if not after.passed:
        info["integrity"].append(after.to_dict())
    if guard is not None and guard.trace is not None:
        info["state_trace"] = guard.trace.to_dict()


def train_step(s: Setup, batch: Any) -> torch.Tensor:
    """One training step on `batch` (launched, not waited for): the loss, a device scalar."""
    *xs, y = batch
    optimizer = s.training.optimizer
    if hasattr(optimizer, "example_weights"):  # a padded batch's releases count its examples only
        optimizer.example_weights = getattr(batch, "weights", None)
        optimizer.row_groups = getattr(batch, "groups", None)  # a unit's rows are clipped together
    optimizer.zero_grad(set_to_none=True)
    with s.precision.autocast():
        loss = step_loss(s.training.criterion, s.step_module(*xs), y, batch)
    s.precision.backward_and_step(loss, optimizer)
    return loss.detach()


def train(
    bundle: ModelBundle, train_split: Split, eval_splits: dict[str, Split], mechanism: Any, plan: Any,
    cfg: TrainConfig, *, device: torch.device, generator: torch.Generator,
    noise_generator: torch.Generator | None = None, secure_mode: bool = False,
    on_progress: Progress | None = None, attach: Callable[[Any], Callable[[], float] | None] | None = None,
    private: bool | None = None, watch: Stopwatch | None = None, batches: Callable[[Any], Any] | None = None,
) -> TrainOutcome:
    """Train `bundle.module` with `mechanism` under `plan`; evaluate every epoch on `eval_splits`.

    The batches, the clipping and the noise come from the plan (`mechanism.make_private`), so the trial runs
    exactly `plan.steps` updates; the count is checked at the end and recorded as `steps_run`.
    A step never waits on the host: the training set lives on the device when it fits (one gather per
    batch, drawn there), the loss is summed there and read every CHECK_EVERY steps (`LossCheck`), and step
    times come from device events (`StepTimer`). `compile: true` pads batches to multiples of PAD_TO rows
    (weight 0), so the compiled step sees few shapes.
    `attach(optimizer)` lets an in-training auditor hook the private optimizer before the first step; it
    may return a clock of its own seconds inside steps, which the step timer leaves out (the one-run
    canaries run inside `optimizer.step()`, but `step_time_ratio` measures the mechanism, not the audit).
    `batches(loader)` lets an auditor add rows to the private loader's batches (the input canaries).
    `private` is the trial's (`TrialConfig.private`; by default, whether the plan has a sigma). The integrity
    checks (`mechanisms.framework.integrity`: the step's code before the first step and after the last, every
    step's `StepGuard`, the row probe `model_checks.RowWatch` outside the step's timer) are in `info["integrity"]`,
    the state trajectory the analysis replays in `info["state_trace"]`: a failed check makes the trial uncertified.
    """
    if private is None:
        private = plan.sigma is not None
    watch = watch or Stopwatch()
    with watch.part("setup_s"):
        s = setup(bundle, train_split, eval_splits, mechanism, plan, cfg, device=device, generator=generator,
                  noise_generator=noise_generator, secure_mode=secure_mode, private=private)
    module, optimizer, loader = s.training.module, s.training.optimizer, s.training.loader
    if batches is not None:
        loader = batches(loader)
    evals, info = s.evals, s.info
    with watch.part("canaries_s"):
        audit_clock = attach(optimizer) if attach is not None else None
    timer, curves = StepTimer(device=device), {"train_loss": []} | {f"{n}_accuracy": [] for n in evals}
    total_steps, done = plan.steps, 0
    check = LossCheck(CHECK_EVERY)
    final: dict[str, dict[str, float]] = {}
    module.train()
    with contextlib.ExitStack() as stack:
        with watch.part("setup_s"):  # the memory baseline: a garbage collection and malloc_trim, 0.2-0.3 s in a
            memory = stack.enter_context(PeakMemory(device=device))  # worker whose heap earlier trials grew
        for epoch in range(cfg.epochs):
            with watch.part("training_s"):
                for batch in loader:
                    if s.rows is not None:  # on its drawn steps, the row probe (on the device, read after training)
                        s.rows.step(done + 1, batch[:-1], batch[-1], batch.size)
                    audit_before = audit_clock() if audit_clock else 0.0
                    timer.start()
                    loss = train_step(s, batch)
                    timer.stop(batch.size, excluded_s=audit_clock() - audit_before if audit_clock else 0.0)
                    done += 1
                    if check.add(loss, done):
                        report(on_progress, check.read(done, epoch + 1), done, total_steps, epoch)
                report(on_progress, check.read(done, epoch + 1), done, total_steps, epoch)
                curves["train_loss"].append(check.epoch_mean())
            with watch.part("evaluation_s"):
                for name, data in evals.items():  # the last epoch's evaluation is the final one (model unchanged)
                    final[name] = evaluate(module, data, cfg.eval_batch_size, device)
                    curves[f"{name}_accuracy"].append(final[name]["accuracy"])
        with watch.part("training_s"):  # the peak memory's read (a device sync on CUDA) and the guard's last checks
            stack.close()
            taken = getattr(optimizer, "steps_taken", done)
            integrity_after_training(s)
    if done != plan.steps or taken != plan.steps:
        raise RuntimeError(f"the trial ran {done} batches and {taken} updates, the plan accounted for {plan.steps}")
    metrics: dict[str, float | None] = {
        "accuracy": final["test"]["accuracy"] if "test" in final else None,
        "test_loss": final["test"]["loss"] if "test" in final else None,
        "val_accuracy": final["val"]["accuracy"] if "val" in final else None,
        "train_loss": curves["train_loss"][-1] if curves["train_loss"] else None,
        "step_time_s": timer.median_s,
        "examples_per_s": timer.examples_per_s,
        "train_s": sum(timer.times),
        "peak_memory_mb": memory.extra_mb,
        "steps_run": float(taken),
    }
    return TrainOutcome(metrics, curves, info | {"precision": cfg.precision})
