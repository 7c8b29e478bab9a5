"""Benchmark: dispatched ops and host synchronisations per steady-state training step, for every registry model.

    python benchmarks/step_profile.py [--models mlp,cnn-small,...] [--steps 4] [--json] [--timing]

A step is what the trainer runs (`workers.train.train_step`), with the batch drawn by the plan's sampler
(`plan_loader`), DP-SGD on the book-keeping engine with the one-run Dirac canaries attached, and the non-private
reference, each on a small synthetic training set of the model's kind. Under a `TorchDispatchMode` every op that
reaches the dispatcher is counted, and these as host synchronisations, the ops that make the host wait for a
device's value: `_local_scalar_dense` (`.item()`, `float(t)`, a Python branch on a tensor), `nonzero`, and copies
from a device to the host. Tensors that live on the host on every device (the optimizer's step counts, kept on
the host when Adam is not `capturable`) are not syncs and are left out. The steps counted follow warm-up steps
and stay inside one canary block (the canaries read their block on the host once per block, by design).

`--timing` measures instead the steps per second of mlp and cnn-small at the quickstart's batch on Fashion-MNIST,
with batches gathered from the resident training set against batches streamed through a DataLoader (the path
before device-resident batches), taking turns in one process.
`test_step_profile.py` holds the sync count at 0 for every model; the op ratio is reported beside the time ratio
(docs/clipping.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # privbench from this checkout, without an install

WARMUP = 3
EPOCHS = 8  # enough planned steps for the warm-up and the counted steps on the smallest training set
# model -> (dataset, dataset options, model options, batch size)
MODELS: dict[str, tuple[str, dict[str, Any], dict[str, Any], int]] = {
    "mlp": ("synthetic", {"side": 28, "n_train": 2048, "n_test": 64}, {}, 256),
    "cnn-small": ("synthetic", {"side": 28, "n_train": 2048, "n_test": 64}, {}, 512),
    "cnn-tanh": ("synthetic", {"side": 28, "n_train": 2048, "n_test": 64}, {}, 256),
    "scatternet-linear": ("synthetic", {"side": 28, "n_train": 1024, "n_test": 64}, {}, 256),
    "scatternet-cnn": ("synthetic", {"side": 28, "n_train": 1024, "n_test": 64}, {}, 256),
    "vit-tiny": ("synthetic", {"side": 28, "n_train": 1024, "n_test": 64}, {}, 128),
    "linear": ("breast-cancer", {}, {}, 64),
    "bert-tiny": ("synthetic-text", {"n_train": 512, "n_test": 32}, {"max_length": 32}, 32),
    "gpt2-tiny": ("synthetic-text", {"n_train": 512, "n_test": 32}, {"max_length": 32}, 32),
    "minilm": ("synthetic-text", {"n_train": 256, "n_test": 32}, {"max_length": 32, "trainable": "top-2"}, 32),
}
SYNC_OPS = ("_local_scalar_dense", "nonzero", "item")


class StepCounter(TorchDispatchMode):
    """Counts dispatched ops and host synchronisations (module docstring) while active."""

    def __init__(self, host: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        super().__init__()
        self.host, self.ops, self.syncs = host, 0, []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.ops += 1
        name = func.overloadpacket.__name__
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if name in SYNC_OPS and not any(id(t) in self.host for t in tensors):
            self.syncs.append(name)
        elif name in ("_to_copy", "copy_") and _to_host(func, args, kwargs, tensors):
            self.syncs.append(f"{name} to the host")
        return func(*args, **kwargs)


def _to_host(func: Any, args: Any, kwargs: Any, tensors: list[torch.Tensor]) -> bool:
    """A copy from a device tensor into host memory."""
    if func.overloadpacket.__name__ == "copy_":
        return len(tensors) >= 2 and tensors[0].device.type == "cpu" and tensors[1].device.type != "cpu"
    target = kwargs.get("device")
    return (bool(tensors) and tensors[0].device.type != "cpu" and target is not None
            and torch.device(target).type == "cpu")


@dataclasses.dataclass(frozen=True)
class Profile:
    model: str
    mechanism: str
    canaries: bool
    steps: int
    ops_per_step: float
    syncs_per_step: float
    syncs: tuple[str, ...]


def build(model: str, mechanism: str, *, device: torch.device, canaries: bool, seed: int = 0) -> tuple[Any, Any]:
    """The trainer's objects for one model (`workers.train.setup`) and their batches."""
    import mechanisms
    from workers import datasets, models
    from workers.audit import OneRun
    from workers.config import AuditConfig, TrainConfig, TrialConfig
    from workers.train import setup
    from workers.trial import noise_generator, privacy_spec, seed_everything

    dataset, dataset_options, model_options, batch = MODELS[model]
    private = mechanism != "nonprivate"
    config = TrialConfig(dataset=dataset, model=model, mechanism=mechanism, sigma=1.0 if private else None,
                         dataset_options=dataset_options, model_options=model_options,
                         train=TrainConfig(epochs=EPOCHS, batch_size=batch, lr=0.1, optimizer="sgd", momentum=0.9),
                         audit=AuditConfig(mode="one-run" if canaries else "off", canaries=1000))
    generator = seed_everything(seed)
    splits = datasets.load(dataset, dataset_options)
    bundle = models.build(model, splits, model_options)
    spec = privacy_spec(config, len(splits.train), [p for p in bundle.module.parameters() if p.requires_grad], bundle)
    mech = mechanisms.get(mechanism)
    plan = mech.plan(spec)
    s = setup(bundle, splits.train, {}, mech, plan, config.train, device=device, generator=generator,
              noise_generator=noise_generator(seed, device), private=private)
    if canaries and private:
        OneRun(config.audit, plan, seed).attach(s.training.optimizer)
    return s, (batch for _ in range(EPOCHS) for batch in s.training.loader)


def host_tensors(s: Any) -> set[int]:
    """The optimizer's step counts that stay on the host (Adam not `capturable`): reading them is no sync."""
    state = getattr(s.training.optimizer, "state", {})
    return {id(v) for entry in state.values() for k, v in entry.items()
            if k == "step" and isinstance(v, torch.Tensor) and v.device.type == "cpu"}


def profile(model: str, mechanism: str, *, steps: int = 4, canaries: bool = True,
            device: torch.device | None = None) -> Profile:
    """Ops and syncs per step over `steps` steady-state steps (after WARMUP), drawing each step's batch inside."""
    from workers.train import train_step

    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    s, batches = build(model, mechanism, device=device, canaries=canaries)
    for _ in range(WARMUP):
        train_step(s, next(batches))
    counter = StepCounter(host_tensors(s))
    with counter:
        for _ in range(steps):
            train_step(s, next(batches))
    return Profile(model, mechanism, canaries and mechanism != "nonprivate", steps, counter.ops / steps,
                   len(counter.syncs) / steps, tuple(sorted(set(counter.syncs))))


TIMED = {"mlp": 512, "cnn-small": 512}  # the quickstart's batch (examples/quickstart.yaml)


def timing(model: str, batch: int, rounds: int = 10, steps: int = 5) -> dict[str, float]:
    """Steps per second of the trainer's DP step (book-keeping, no canaries) on Fashion-MNIST at `batch`, with
    its batches gathered from the resident training set (today) and streamed through a DataLoader that indexes
    the dataset example by example and collates (before device-resident batches; still the path for data that
    does not fit on the device). The two take turns in one process, `steps` steps each per round."""
    import time

    from torch.utils.data import DataLoader, TensorDataset

    import mechanisms
    from mechanisms.framework.private_training import StreamedBatches
    from workers import datasets, models
    from workers.config import TrainConfig, TrialConfig
    from workers.train import setup, tensor_dataset, train_step
    from workers.trial import noise_generator, privacy_spec, seed_everything

    config = TrialConfig(dataset="fashion-mnist", model=model, mechanism="dpsgd", sigma=1.0,
                         train=TrainConfig(epochs=50, batch_size=batch, lr=0.1))
    generator = seed_everything(0)
    splits = datasets.load("fashion-mnist")
    bundle = models.build(model, splits, {})
    spec = privacy_spec(config, len(splits.train), [p for p in bundle.module.parameters() if p.requires_grad], bundle)
    mech = mechanisms.get("dpsgd")
    plan = mech.plan(spec)
    s = setup(bundle, splits.train, {}, mech, plan, config.train, device=torch.device("cpu"), generator=generator,
              noise_generator=noise_generator(0, torch.device("cpu")))
    data = TensorDataset(*tensor_dataset(bundle, splits.train).tensors)
    streamed = StreamedBatches(DataLoader(data, batch_sampler=plan.batch_selection.batch_sampler(
        torch.Generator().manual_seed(1))), torch.device("cpu"))
    sources = {"resident": s.training.loader, "streamed": streamed}
    iters = {name: iter(()) for name in sources}

    def draw(name: str) -> Any:
        try:
            return next(iters[name])
        except StopIteration:
            iters[name] = iter(sources[name])
            return next(iters[name])

    seconds: dict[str, list[float]] = {name: [] for name in sources}
    for r in range(rounds + 1):
        for name in sources:
            t0 = time.perf_counter()
            for _ in range(steps):
                train_step(s, draw(name))
            if r:  # round 0 warms up
                seconds[name].append((time.perf_counter() - t0) / steps)
    import statistics

    out = {f"{name}_steps_per_s": 1 / statistics.median(t) for name, t in seconds.items()}
    return out | {"speedup": out["resident_steps_per_s"] / out["streamed_steps_per_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--timing", action="store_true",
                        help="instead: steps/s of mlp and cnn-small with resident against streamed batches")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.timing:
        for model, batch in TIMED.items():
            print(model, batch, json.dumps(timing(model, batch)), flush=True)
        return 0
    rows = []
    for model in args.models.split(","):
        dp = profile(model, "dpsgd", steps=args.steps)
        plain = profile(model, "nonprivate", steps=args.steps, canaries=False)
        rows.append({"model": model, "dp_ops": dp.ops_per_step, "nonprivate_ops": plain.ops_per_step,
                     "op_ratio": dp.ops_per_step / plain.ops_per_step, "dp_syncs": dp.syncs_per_step,
                     "nonprivate_syncs": plain.syncs_per_step, "sync_ops": sorted({*dp.syncs, *plain.syncs})})
    if args.json:
        print(json.dumps(rows))
        return 0
    print("| model | ops / DP step (canaries on) | ops / non-private step | op ratio | syncs / DP step | "
          "syncs / non-private step |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['dp_ops']:.0f} | {r['nonprivate_ops']:.0f} | {r['op_ratio']:.2f}x | "
              f"{r['dp_syncs']:g} | {r['nonprivate_syncs']:g} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
