"""Benchmark: what the row probe costs (`mechanisms.framework.integrity.model_checks.RowWatch`).

    python benchmarks/row_probe_cost.py [--models digits-mlp,mlp,cnn-small,bert-tiny] [--rounds 20] [--steps 44]
                                        [--json]

The trainer probes a real batch before training, then a few training steps drawn at random (`probe_count`): on
each, the model's twin is loaded with the model's state and example j of the step's batch is swapped for another
(two forward and backward passes, no clipping, on the batch's first PROBE_TRAINING_ROWS examples). For each model
the trainer's private step (`workers.train.setup`, DP-SGD on the book-keeping engine, with every integrity check)
and one probe of the same batch take turns in ONE process, each round in alternating order. Reported: the median
CPU seconds (`time.process_time`, one thread, so the machine's load is not counted) of a DP step and of a probe,
their paired ratio (the median of the rounds' own ratios), the probes' share of a trial's CPU time in steps at
`--steps` planned steps (`probe_count` probes over that many DP steps; the issue's digits / mlp trial plans 44),
the probe before training (CPU seconds, once per trial), and the host synchronisations of one probe
(benchmarks/step_profile.py's counter; the steps that are not probed run nothing of it). `digits-mlp` is the
issue's setting (digits, batch 64); the others are step_profile's geometries.
The model-state watch (`integrity.StateWatch`) runs inside the step's `StepGuard`, so it is in
benchmarks/integrity_cost.py's figures; here its per-step check is also timed alone, as a share of the DP step,
beside the number of untrained state tensors it watches (mlp and cnn-small have none; bert-tiny has its position
and token-type ids).
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

GEOMETRIES = step_profile.MODELS | {"digits-mlp": ("digits", {}, {}, 64)}


def setup_for(name: str) -> Any:
    import mechanisms
    from mechanisms.framework.integrity.model_checks import RowWatch
    from workers import datasets, models
    from workers.config import TrainConfig, TrialConfig
    from workers.train import probe_batch, setup, tensor_dataset
    from workers.trial import noise_generator, privacy_spec, seed_everything

    dataset, dataset_options, model_options, batch = GEOMETRIES[name]
    model = name.split("-", 1)[1] if name == "digits-mlp" else name
    config = TrialConfig(dataset=dataset, model=model, mechanism="dpsgd", sigma=1.0, dataset_options=dataset_options,
                         model_options=model_options,
                         train=TrainConfig(epochs=400, batch_size=batch, lr=0.1, optimizer="sgd", momentum=0.9))
    generator = seed_everything(0)
    splits = datasets.load(dataset, dataset_options)
    bundle = models.build(model, splits, model_options)
    spec = privacy_spec(config, len(splits.train), [p for p in bundle.module.parameters() if p.requires_grad], bundle)
    mech = mechanisms.get("dpsgd")
    device = torch.device("cpu")
    c0 = time.process_time()  # the probe before training, as `setup` runs it (its twin, a real batch)
    finding = RowWatch(bundle.module, 1).before_training(*probe_batch(tensor_dataset(bundle, splits.train), batch, 0,
                                                                      device))
    before_s = time.process_time() - c0
    s = setup(bundle, splits.train, {}, mech, mech.plan(spec), config.train, device=device, generator=generator,
              noise_generator=noise_generator(0, device))
    return s, (b for _ in range(config.train.epochs) for b in s.training.loader), before_s, finding


def measure(name: str, rounds: int, planned_steps: int) -> dict[str, Any]:
    from mechanisms.framework.integrity.model_checks import PROBE_TRAINING_ROWS, probe_count, row_dependence
    from workers.train import train_step

    s, batches, before_s, before = setup_for(name)
    watch = s.rows

    def probe(batch: Any) -> Any:  # what `RowWatch.step` runs on a drawn step
        watch.sync()
        rows = min(batch.size, PROBE_TRAINING_ROWS)
        return row_dependence(watch.twin, [x[:rows] for x in batch[:-1]], batch[-1][:rows], changed=1)

    state = s.training.optimizer.guard.state_watch
    seconds: dict[str, list[float]] = {"step": [], "probe": [], "state": []}
    for r in range(rounds + 1):
        batch = next(batches)
        for part in (("step", "probe", "state") if r % 2 else ("state", "probe", "step")):
            t0 = time.process_time()
            if part == "state":  # the model-state watch's share of a step, timed alone (x10: it is small)
                for _ in range(10):
                    state.check()
            else:
                train_step(s, batch) if part == "step" else probe(batch)
            if r:  # round 0 warms up
                seconds[part].append((time.process_time() - t0) / (10 if part == "state" else 1))
    counter = step_profile.StepCounter(step_profile.host_tensors(s))
    with counter:
        probe(next(batches))
    step, one = statistics.median(seconds["step"]), statistics.median(seconds["probe"])
    paired = statistics.median(p / q for p, q in zip(seconds["probe"], seconds["step"], strict=True))
    alarms = [f"{f.check}: {f.reason}" for f in (before, *s.training.optimizer.guard.findings()) if not f.passed]
    return {"model": name, "dp_step_s": step, "probe_s": one, "paired_ratio": paired,
            "state_watch_share": statistics.median(seconds["state"]) / step, "state_tensors": len(state.names),
            "share_of_trial": probe_count(planned_steps) * paired / planned_steps, "planned_steps": planned_steps,
            "probe_before_training_s": before_s, "probe_syncs": len(counter.syncs), "alarms": alarms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="digits-mlp,mlp,cnn-small,bert-tiny")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=44, help="a trial's planned steps (the issue's digits trial: 44)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [measure(name, args.rounds, args.steps) for name in args.models.split(",")]
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"| model | CPU s / DP step | CPU s / probe | probe / step (paired) | share of a {args.steps}-step trial | "
          "probe before training, CPU s | host syncs / probe | state watch / step (tensors) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['dp_step_s']:.4g} | {r['probe_s']:.4g} | {r['paired_ratio']:.3f} | "
              f"{100 * r['share_of_trial']:.2f}% | {r['probe_before_training_s']:.3g} | {r['probe_syncs']:g} | "
              f"{100 * r['state_watch_share']:.2f}% ({r['state_tensors']}) |"
              + (f" alarms: {r['alarms']}" if r["alarms"] else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
