"""Benchmark: the streamed correlated noise (dp-bandmf, dpftrl-tree) against DP-SGD's memoryless noise.

    python benchmarks/correlated_noise.py [--dataset digits] [--model mlp] [--batch 64] [--rounds 40]
                                          [--mechanisms dpsgd,dp-bandmf:2,dp-bandmf:4,dpftrl-tree] [--json]

Two side-by-side measurements, in ONE process, the mechanisms taking turns in a rotating order each round so
machine load hits all alike (read the ratios, not the milliseconds):

- the whole private step (forward, per-example clipping, noise, update) on the same real batch, each mechanism
  on its own copy of one model: median CPU time per step (`time.process_time`) and the peak extra RSS while it
  steps, as ratios to dpsgd (the target: dp-bandmf at 2 bands at most 1.2x);
- the noise alone: `release` of a model-sized gradient (DP-SGD's `GaussianNoise` vs the correlated part's
  stream), CPU time per release, and the stream's state in bytes (the ring buffer of b - 1 past noises for a
  banded strategy, the tree's stack), against the model's parameter bytes.

`dp-bandmf:B` sets the bands; sigma is fixed at 1 (the noise's size does not change its cost). Every private
mechanism runs on `fixed-order` batches of the batch size (dpsgd included, through the spec's sampler).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import numpy as np
import torch
from mechanism_overhead import interleaved  # benchmarks/, beside this script
from torch import nn
from torch.utils.data import TensorDataset

import mechanisms
from mechanisms.parts.noise_addition import RunNoise
from mechanisms.parts.plan import PrivacySpec
from workers import datasets, models

WARMUP = 3


def stream_bytes(optimizer: object) -> int:
    """The bytes a correlated-noise stream keeps between steps (0 for memoryless noise)."""
    if not isinstance(optimizer.noise, RunNoise):
        return 0
    stream = optimizer.noise_stream
    state = stream.strategy
    tensors = list(getattr(state, "history", []))
    tensors += [t for _, t in getattr(state, "stack", [])]
    if getattr(state, "prefix", None) is not None:
        tensors.append(state.prefix)
    return sum(t.numel() * t.element_size() for t in tensors)


def parse(name: str) -> tuple[str, dict]:
    mech, _, bands = name.partition(":")
    return mech, ({"bands": int(bands)} if bands else {})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--mechanisms", default="dpsgd,dp-bandmf:2,dp-bandmf:4,dpftrl-tree")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    splits = datasets.load(args.dataset)
    bundle = models.build(args.model, splits, {})
    idx = np.arange(args.batch)
    batch = (*bundle.encode(splits.train.subset(idx)), torch.from_numpy(splits.train.labels[idx]))
    names = args.mechanisms.split(",")
    steppers, optimizers = {}, {}
    for name in names:
        mech_name, options = parse(name)
        mech = mechanisms.get(mech_name)
        module = copy.deepcopy(bundle.module)
        # the data: the timed batch repeated, so that an epoch of fixed-order batches has many steps (the tree's
        # and the ring buffer's state is then that of a running stream)
        data = TensorDataset(*(torch.cat([t] * 64) for t in batch))
        plan = mech.plan(PrivacySpec(epsilon=None, sigma=1.0, delta=1e-5, dataset_size=len(data),
                                     batch_size=args.batch, epochs=200, sampler="fixed-order", options=options))
        opt = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=0.1)
        mode = bundle.info.get("grad_sample_mode", "hooks")
        module, opt, _, crit = mech.make_private(module, opt, data, plan, criterion=nn.CrossEntropyLoss(),
                                                 generator=torch.Generator().manual_seed(0), grad_sample_mode=mode)

        def step(module=module, opt=opt, crit=crit) -> None:
            opt.zero_grad(set_to_none=True)
            crit(module(*batch[:-1]), batch[-1]).backward()
            opt.step()

        steppers[name], optimizers[name] = step, opt
    times, peaks = interleaved(steppers, args.rounds, clock=time.process_time)

    # the noise alone, on a model-sized gradient
    params = [p for p in bundle.module.parameters() if p.requires_grad]
    sums = [torch.zeros(1, *p.shape) for p in params]
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    releasers = {}
    for name in names:
        noise = optimizers[name].noise
        stream = noise.start() if isinstance(noise, RunNoise) else noise
        releasers[name] = stream
    noise_times: dict[str, list[float]] = {n: [] for n in names}
    gen = torch.Generator().manual_seed(0)
    for r in range(20 * args.rounds + WARMUP):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            t0 = time.process_time()
            releasers[name].release(sums, 1.0, gen)
            if r >= WARMUP:
                noise_times[name].append(time.process_time() - t0)

    med = {n: statistics.median(t) for n, t in times.items()}
    noise_med = {n: statistics.fmean(t) for n, t in noise_times.items()}
    ref = names[0]
    rows = [{"mechanism": n, "step_cpu_ms": 1000 * med[n], "step_ratio": med[n] / med[ref],
             "peak_extra_mb": peaks[n], "noise_cpu_us": 1e6 * noise_med[n],
             "noise_ratio": noise_med[n] / noise_med[ref],
             "stream_state_bytes": stream_bytes(optimizers[n]), "param_bytes": param_bytes,
             "state_over_params": stream_bytes(optimizers[n]) / param_bytes} for n in names]
    if args.json:
        print(json.dumps({"dataset": args.dataset, "model": args.model, "batch": args.batch, "rounds": args.rounds,
                          "reference": ref, "rows": rows}))
        return
    print(f"{args.dataset} {args.model}, batch {args.batch}, {args.rounds} rounds; ratios to {ref} (CPU time)")
    print(f"{'mechanism':<14} {'step ms':>8} {'x ' + ref:>8} {'peak MB':>8} {'noise us':>9} {'x ' + ref:>8} "
          f"{'state/params':>12}")
    for row in rows:
        print(f"{row['mechanism']:<14} {row['step_cpu_ms']:8.2f} {row['step_ratio']:8.2f} {row['peak_extra_mb']:8.1f} "
              f"{row['noise_cpu_us']:9.1f} {row['noise_ratio']:8.2f} {row['state_over_params']:12.2f}")


if __name__ == "__main__":
    main()
