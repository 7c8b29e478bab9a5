"""One training loop for every mechanism: the mechanism only wraps model, optimizer and loader."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from mechanisms.mechanism import Mechanism
from workers.acceleration import StepPrecision, compiled
from workers.config import TrainConfig
from workers.datasets.base import Split
from workers.measure import PeakMemory, StepTimer
from workers.models.base import ModelBundle

Progress = Callable[[int, int, dict[str, Any]], None]


# One builder per name in workers.config.OPTIMIZERS (the names a grid may use; a test keeps them equal).
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": lambda params, c: torch.optim.SGD(params, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay),
    "adam": lambda params, c: torch.optim.Adam(params, lr=c.lr, weight_decay=c.weight_decay),
    "adamw": lambda params, c: torch.optim.AdamW(params, lr=c.lr, weight_decay=c.weight_decay),
}


def tensor_dataset(bundle: ModelBundle, split: Split) -> TensorDataset:
    return TensorDataset(*bundle.encode(split), torch.from_numpy(split.labels))


@torch.no_grad()
def evaluate(module: nn.Module, data: TensorDataset, batch_size: int, device: torch.device) -> dict[str, float]:
    module.eval()
    correct, loss, n = 0, 0.0, 0
    for *xs, y in DataLoader(data, batch_size=batch_size):
        xs, y = [x.to(device) for x in xs], y.to(device)
        logits = module(*xs)
        loss += nn.functional.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
        n += len(y)
    module.train()
    return {"accuracy": correct / max(n, 1), "loss": loss / max(n, 1)}


@dataclasses.dataclass
class TrainOutcome:
    metrics: dict[str, float | None]
    curves: dict[str, list[float]]
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. the Opacus mode actually used


class Diverged(RuntimeError):
    """The training loss became NaN or infinite: the trial is failed, never finished."""


def train(
    bundle: ModelBundle, train_split: Split, eval_splits: dict[str, Split], mechanism: Any, plan: Any,
    cfg: TrainConfig, *, device: torch.device, generator: torch.Generator,
    noise_generator: torch.Generator | None = None, secure_mode: bool = False,
    on_progress: Progress | None = None, attach: Callable[[Any], Callable[[], float] | None] | None = None,
    private: bool | None = None,
) -> TrainOutcome:
    """Train `bundle.module` with `mechanism` under `plan`; evaluate every epoch on `eval_splits`.

    The loader, the clipping and the noise come from the plan (`mechanism.make_private`), so the trial runs
    exactly `plan.steps` updates; the count is checked at the end and recorded as `steps_run`.
    `attach(optimizer)` lets an in-training auditor hook the private optimizer before the first step; it
    may return a clock of its own seconds inside steps, which the step timer leaves out (the one-run
    canaries run inside `optimizer.step()`, but `step_time_ratio` measures the mechanism, not the audit).
    `private` is the trial's (`TrialConfig.private`; by default, whether the plan has a sigma). A private
    step that is not privbench's (`step_integrity`) is reported in `info["step_problems"]`: the trial is
    then uncertified.
    """
    if private is None:
        private = plan.sigma is not None
    module = bundle.module.to(device)
    train_data = tensor_dataset(bundle, train_split)
    evals = {name: tensor_dataset(bundle, s) for name, s in eval_splits.items() if len(s)}
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = OPTIMIZERS[cfg.optimizer](params, cfg)
    mode = cfg.grad_sample_mode or bundle.info.get("grad_sample_mode", "hooks")
    info: dict[str, Any] = {}
    if mode == "bk" and cfg.grad_sample_mode is None:  # the model's default: fall back where bk cannot clip it
        from mechanisms.bookkeeping import unsupported

        if why := unsupported(module):
            mode = bundle.info.get("fallback_grad_sample_mode", "hooks")
            info["bk_fallback"] = "; ".join(why)
    training = mechanism.make_private(module, optimizer, train_data, plan, criterion=nn.CrossEntropyLoss(),
                                      generator=generator, grad_sample_mode=mode, noise_generator=noise_generator,
                                      secure_mode=secure_mode)
    if private and type(mechanism).make_private is Mechanism.make_private:  # the trainer's step (an override is
        from mechanisms.private_training import step_integrity  # its own: contract_problems flags a plugin's)

        if problems := step_integrity(training):
            info["step_problems"] = problems
    module, optimizer, loader, criterion = training.module, training.optimizer, training.loader, training.criterion
    precision = StepPrecision(cfg.precision, device, private=private, grad_sample_mode=mode)
    step_module = compiled(module, mode, private) if cfg.compile else module
    audit_clock = attach(optimizer) if attach is not None else None
    timer, curves = StepTimer(), {"train_loss": []} | {f"{n}_accuracy": [] for n in evals}
    total_steps, done = plan.steps, 0
    final: dict[str, dict[str, float]] = {}
    module.train()
    with PeakMemory(device=device) as memory:
        for epoch in range(cfg.epochs):
            running, batches = 0.0, 0
            for *xs, y in loader:
                xs, y = [x.to(device) for x in xs], y.to(device)
                audit_before = audit_clock() if audit_clock else 0.0
                timer.start()
                optimizer.zero_grad(set_to_none=True)
                with precision.autocast():
                    loss = criterion(step_module(*xs), y)
                precision.backward_and_step(loss, optimizer)
                timer.stop(len(y), excluded_s=audit_clock() - audit_before if audit_clock else 0.0)
                value = float(loss.item())
                if not math.isfinite(value):
                    raise Diverged(f"diverged: training loss is {value} at step {done + 1} (epoch {epoch + 1})")
                running, batches, done = running + value, batches + 1, done + 1
                if on_progress is not None and (done % 5 == 0 or done == total_steps):
                    on_progress(done, total_steps, {"epoch": epoch + 1, "loss": running / batches})
            curves["train_loss"].append(running / max(batches, 1))
            for name, data in evals.items():  # the last epoch's evaluation is the final one (model unchanged)
                final[name] = evaluate(module, data, cfg.eval_batch_size, device)
                curves[f"{name}_accuracy"].append(final[name]["accuracy"])
    taken = getattr(optimizer, "steps_taken", done)
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
    return TrainOutcome(metrics, curves, {"grad_sample_mode": mode, "precision": cfg.precision} | info)
