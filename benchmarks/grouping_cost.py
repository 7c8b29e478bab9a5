"""Benchmark: what grouping rows before clipping costs a DP step (declared privacy units, augmult).

    python benchmarks/grouping_cost.py [--model mlp] [--rows 256] [--rounds 5] [--json]

Every variant runs the trainer's step (`workers.train.setup`, `train_step`) on the same number of rows per step
(`--rows`, in expectation), on 28x28 synthetic images: plain DP-SGD on the book-keeping engine (the default) and
on Opacus' hooks; units of two rows (`rows / 2` units per step) on the book-keeping engine (a unit's rows laid
out as one example's positions) and on Opacus' hooks (per-row gradients summed per unit); augmult 2 and 4
(`rows / K` records per step, each cropped and flipped K times) on the book-keeping engine. The variants take
turns in one process, a few steps each per round, and each step is timed in CPU seconds of this process
(`time.process_time`: the machine's other load does not enter). Host synchronisations per step are counted by
benchmarks/step_profile.py's dispatch mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # privbench from this checkout, without an install

from step_profile import StepCounter

DATASET = ("synthetic", {"side": 28, "n_train": 2048, "n_test": 64})
# name -> (grad_sample_mode, rows per unit, augmult)
VARIANTS: dict[str, tuple[str | None, int, int]] = {
    "dpsgd (bk)": (None, 1, 1), "dpsgd (hooks)": ("hooks", 1, 1), "units of 2": (None, 2, 1),
    "units of 2 (hooks)": ("hooks", 2, 1), "augmult 2": (None, 1, 2), "augmult 4": (None, 1, 4)}


def build(model: str, rows: int, mode: str | None, unit_rows: int, augmult: int, seed: int = 0) -> tuple[Any, Any]:
    """The trainer's objects for one variant, and an endless supply of its batches."""
    import mechanisms
    from workers import datasets, models
    from workers.config import AuditConfig, TrainConfig, TrialConfig
    from workers.train import setup
    from workers.trial import noise_generator, privacy_spec, seed_everything

    name, options = DATASET
    splits = datasets.load(name, options)
    if unit_rows > 1:
        units = np.arange(len(splits.train)) // unit_rows
        splits = dataclasses.replace(splits, train=dataclasses.replace(splits.train, units=units))
    batch = rows // (unit_rows * augmult)
    config = TrialConfig(dataset=name, model=model, mechanism="dpsgd", sigma=1.0, dataset_options=options,
                         train=TrainConfig(epochs=50, batch_size=batch, lr=0.1, grad_sample_mode=mode,
                                           augmult=augmult), audit=AuditConfig(mode="off"))
    generator = seed_everything(seed)
    bundle = models.build(model, splits, {})
    trainable = [p for p in bundle.module.parameters() if p.requires_grad]
    spec = privacy_spec(config, datasets.unit_count(splits.train), trainable, bundle)
    mech = mechanisms.get("dpsgd")
    s = setup(bundle, splits.train, {}, mech, mech.plan(spec), config.train, device=torch.device("cpu"),
              generator=generator, noise_generator=noise_generator(seed, torch.device("cpu")))
    return s, (b for _ in range(50) for b in s.training.loader)


def measure(model: str, rows: int, rounds: int, steps: int = 4,
            variants: dict[str, tuple[str | None, int, int]] = VARIANTS) -> dict[str, dict[str, float]]:
    from workers.train import train_step

    built = {name: build(model, rows, *v) for name, v in variants.items()}
    cpu: dict[str, list[float]] = {name: [] for name in built}
    seen: dict[str, list[int]] = {name: [] for name in built}
    syncs: dict[str, float] = {}
    for r in range(rounds + 1):
        for name, (s, batches) in built.items():
            for _ in range(steps):
                batch = next(batches)
                t0 = time.process_time()
                train_step(s, batch)
                if r:  # round 0 warms up
                    cpu[name].append(time.process_time() - t0)
                    seen[name].append(len(batch[0]))
    for name, (s, batches) in built.items():
        counter = StepCounter()
        with counter:
            for _ in range(steps):
                train_step(s, next(batches))
        syncs[name] = len(counter.syncs) / steps
    base = statistics.median(cpu["dpsgd (bk)"]) / statistics.mean(seen["dpsgd (bk)"])
    out = {}
    for name in built:
        per_row = statistics.median(cpu[name]) / statistics.mean(seen[name])
        out[name] = {"cpu_ms_per_step": 1e3 * statistics.median(cpu[name]),
                     "rows_per_step": statistics.mean(seen[name]), "cpu_us_per_row": 1e6 * per_row,
                     "vs_bk": per_row / base, "syncs_per_step": syncs[name]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = measure(args.model, args.rows, args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.model}, {args.rows} rows per step, CPU seconds of this process (1 thread)")
    print(f"{'variant':<20}{'ms/step':>10}{'rows':>8}{'us/row':>9}{'vs bk':>8}{'syncs':>7}")
    for name, m in result.items():
        print(f"{name:<20}{m['cpu_ms_per_step']:>10.1f}{m['rows_per_step']:>8.0f}{m['cpu_us_per_row']:>9.1f}"
              f"{m['vs_bk']:>8.2f}{m['syncs_per_step']:>7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
