"""Benchmark: step time and peak memory of mechanisms vs nonprivate and dpsgd.

    python benchmarks/mechanism_overhead.py [--dataset fashion-mnist] [--model cnn-small] [--batch 256]
                                            [--rounds 30] [--mechanisms nonprivate,dpsgd,dpsgd-gdp,gredp]
                                            [--model-options '{"trainable": "top-2"}'] [--threads 1]

A mechanism may name its Opacus mode, `dpsgd:hooks,dpsgd:ghost`, to compare per-sample gradient modes
(this is how the defaults were chosen: ghost for the text models, hooks for ViT). `dpsgd` without a mode
uses the model's default and is the reference column.

Every mechanism wraps its own copy of one model (same initial weights); they take turns in ONE process,
one step each per round in a rotating order, on the same real batch, so machine load hits all alike.
Reported: median step time over rounds (after warm-up) and the peak extra RSS while each one steps,
as ratios to nonprivate and to dpsgd. sigma is fixed at 1 (noise size does not change the cost).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

import mechanisms
from mechanisms.parts.plan import PrivacySpec
from workers import datasets, models
from workers.measure import PeakMemory

WARMUP = 3


def interleaved(steppers: dict, rounds: int,
                clock=time.perf_counter) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Each stepper's times and peak extra memory over `rounds` after WARMUP, side by side in one process, the order
    rotating every round so that no variant always runs first (warm caches, a busy neighbour)."""
    names = list(steppers)
    times: dict[str, list[float]] = {n: [] for n in names}
    peaks: dict[str, float] = dict.fromkeys(names, 0.0)
    for r in range(rounds + WARMUP):
        for name in names[r % len(names):] + names[: r % len(names)]:
            with PeakMemory() as mem:
                t0 = clock()
                steppers[name]()
                elapsed = clock() - t0
            if r >= WARMUP:
                times[name].append(elapsed)
                peaks[name] = max(peaks[name], mem.extra_mb)
    return times, peaks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--model", default="cnn-small")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--mechanisms", default="nonprivate,dpsgd,dpsgd-gdp,gredp")
    ap.add_argument("--model-options", type=json.loads, default={}, help="JSON, e.g. '{\"trainable\": \"top-2\"}'")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    splits = datasets.load(args.dataset)
    bundle = models.build(args.model, splits, args.model_options)
    idx = np.arange(args.batch)
    batch = (*bundle.encode(splits.train.subset(idx)), torch.from_numpy(splits.train.labels[idx]))
    names = args.mechanisms.split(",")
    steppers = {}
    for name in names:
        mech_name, _, mode = name.partition(":")
        mech = mechanisms.get(mech_name)
        module = copy.deepcopy(bundle.module)
        data = TensorDataset(*batch)  # the timed batch is the data: the plan's sampler is not used here
        plan = mech.plan(PrivacySpec(epsilon=None, sigma=1.0, delta=1e-5, dataset_size=len(data),
                                     batch_size=len(data), epochs=10_000))  # room for every timed step
        opt = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=0.1)
        mode = mode or bundle.info.get("grad_sample_mode", "hooks")
        module, opt, _, crit = mech.make_private(module, opt, data, plan, criterion=nn.CrossEntropyLoss(),
                                                 generator=torch.Generator().manual_seed(0), grad_sample_mode=mode)

        def step(module=module, opt=opt, crit=crit) -> None:
            opt.zero_grad(set_to_none=True)
            crit(module(*batch[:-1]), batch[-1]).backward()
            opt.step()

        steppers[name] = step
    times, peaks = interleaved(steppers, args.rounds)
    med = {n: statistics.median(t) for n, t in times.items()}
    print(f"{'mechanism':<14} {'step ms':>8} {'x nonpriv':>9} {'x dpsgd':>8} {'peak MB':>8}")
    for n in names:
        vs_np = med[n] / med["nonprivate"] if "nonprivate" in med else float("nan")
        vs_dp = med[n] / med["dpsgd"] if "dpsgd" in med else float("nan")
        print(f"{n:<14} {1000 * med[n]:8.1f} {vs_np:9.2f} {vs_dp:8.2f} {peaks[n]:8.1f}")


if __name__ == "__main__":
    main()
