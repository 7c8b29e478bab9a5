"""Benchmark: what the per-step integrity checks cost (`mechanisms.framework.integrity.StepGuard`).

    python benchmarks/integrity_cost.py [--models mlp,cnn-small] [--mechanisms dpsgd,dpsgd-adaclip]
                                        [--rounds 30] [--steps 5] [--json]

For each model and mechanism, the trainer's private step (`workers.train.setup`, the book-keeping engine) runs
with its `StepGuard` (the plan's bounds, noise stream, observers, the bound's range, the model-update shadow on 4
coordinates per tensor, and, for a mechanism with state, the trace the replay reads) and, in a twin set up from
the same seeds, without it, taking turns in ONE process: each round one checked and one unchecked step (in
alternating order) on the same batch (a Poisson batch's size moves the step's time by more than the checks cost).
The guard runs uninterrupted, as in training (its block comparisons included), and must raise no alarm.
Reported: the median CPU seconds per step (`time.process_time`, one thread, so the machine's load is not counted)
and their ratio, the median of the rounds' own ratios ("paired": a round's two steps share their batch and their
moment, so the machine's drift cancels), and the host synchronisations per checked step
(benchmarks/step_profile.py's counter: 0 is the target). The state replay runs once per trial in the analysis
phase and is not part of a step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # privbench from this checkout, without an install
sys.path.insert(0, str(Path(__file__).resolve().parent))

import step_profile


def setup_for(model: str, mechanism: str) -> tuple[Any, Any]:
    """The trainer's private step for `model` and `mechanism` at sigma 1, and an endless batch iterator."""
    import mechanisms
    from workers import datasets, models
    from workers.config import TrainConfig, TrialConfig
    from workers.train import setup
    from workers.trial import noise_generator, privacy_spec, seed_everything

    dataset, dataset_options, model_options, batch = step_profile.MODELS[model]
    config = TrialConfig(dataset=dataset, model=model, mechanism=mechanism, sigma=1.0,
                         dataset_options=dataset_options, model_options=model_options,
                         train=TrainConfig(epochs=400, batch_size=batch, lr=0.1, optimizer="sgd", momentum=0.9))
    generator = seed_everything(0)
    splits = datasets.load(dataset, dataset_options)
    bundle = models.build(model, splits, model_options)
    spec = privacy_spec(config, len(splits.train), [p for p in bundle.module.parameters() if p.requires_grad], bundle)
    mech = mechanisms.get(mechanism)
    device = torch.device("cpu")
    s = setup(bundle, splits.train, {}, mech, mech.plan(spec), config.train, device=device, generator=generator,
              noise_generator=noise_generator(0, device))
    return s, (b for _ in range(config.train.epochs) for b in s.training.loader)


def measure(model: str, mechanism: str, rounds: int, steps: int) -> dict[str, Any]:
    from workers.train import train_step

    checked_s, batches = setup_for(model, mechanism)
    unchecked_s, _ = setup_for(model, mechanism)  # its twin: same seeds, so the same trajectory, without the guard
    unchecked_s.training.optimizer.guard = None
    guard = checked_s.training.optimizer.guard
    setups = {"checked": checked_s, "unchecked": unchecked_s}
    seconds: dict[str, list[float]] = {"checked": [], "unchecked": []}
    for r in range(rounds + 1):
        chunk = [next(batches) for _ in range(steps)]  # the same batches both ways: a batch's size moves the step
        for name in (("checked", "unchecked") if r % 2 else ("unchecked", "checked")):
            s = setups[name]
            t0 = time.process_time()
            for batch in chunk:
                train_step(s, batch)
            if r:  # round 0 warms up
                seconds[name].append((time.process_time() - t0) / steps)
    counter = step_profile.StepCounter(step_profile.host_tensors(checked_s))
    with counter:
        for _ in range(2):
            train_step(checked_s, next(batches))
    findings = guard.findings()
    checked, unchecked = statistics.median(seconds["checked"]), statistics.median(seconds["unchecked"])
    paired = statistics.median(c / u for c, u in zip(seconds["checked"], seconds["unchecked"], strict=True))
    return {"model": model, "mechanism": mechanism, "checked_step_s": checked, "unchecked_step_s": unchecked,
            "ratio": checked / unchecked, "paired_ratio": paired, "syncs_per_step": len(counter.syncs) / 2,
            "alarms": [f"{f.check}: {f.reason}" for f in findings if not f.passed]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn-small")
    parser.add_argument("--mechanisms", default="dpsgd,dpsgd-adaclip")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [measure(model, mechanism, args.rounds, args.steps) for model in args.models.split(",")
            for mechanism in args.mechanisms.split(",")]
    if args.json:
        print(json.dumps(rows))
        return 0
    print("| model | mechanism | CPU s / step, checked | CPU s / step, unchecked | ratio | paired ratio | "
          "host syncs / step |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['mechanism']} | {r['checked_step_s']:.4g} | {r['unchecked_step_s']:.4g} | "
              f"{r['ratio']:.3f} | {r['paired_ratio']:.3f} | {r['syncs_per_step']:g} |"
              + (f" alarms: {r['alarms']}" if r["alarms"] else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
