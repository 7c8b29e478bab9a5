"""Benchmark: DP-Forward's training-step time and peak memory vs nonprivate and DP-SGD, same model and batch.

    python benchmarks/dp_forward_overhead.py                      # bert-tiny, batch 32, 30 rounds
    python benchmarks/dp_forward_overhead.py --model minilm --rounds 12
    python benchmarks/dp_forward_overhead.py --json               # one JSON object on stdout

The paper's anchor (Fig. 4, SST-2, BERT-base, P100, Opacus): DP-Forward costs "almost the same as the
non-private baseline and ~3x less than DP-SGD" in time and memory.

Time: every mechanism wraps its own copy of one model (same initial weights) and they take turns in ONE
process, one step each per round, in a rotating order, on one fixed batch of real Rotten Tomatoes
sentences; the median over rounds (after warm-up) is reported, so machine load hits all alike.
Memory: RSS is per process and allocators keep freed pages, so each mechanism's peak is measured in a
fresh child process (same model, batch and steps): peak RSS above the level just before the first step.

Mechanisms: `nonprivate`; `dp-forward` (paper setting: noise at `--position`, pre-noise layers trained);
`dp-forward-frozen` (strict local DP: pre-noise layers frozen, only the post-noise part trains);
`dpsgd` (Opacus, the model's per-sample-gradient mode, flat clipping). sigma is fixed at 1 (noise
magnitude does not change the cost). Ratios are against nonprivate and dpsgd.
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import statistics
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore", category=UserWarning)  # Opacus' hook notices, once per step

MECHANISMS = ("nonprivate", "dp-forward", "dp-forward-frozen", "dpsgd")
WARMUP = 3


def build(args: argparse.Namespace) -> tuple[nn.Module, tuple[torch.Tensor, ...], dict[str, Any]]:
    """The model (seeded init) and one fixed batch of real sentences, padded to `max_length`."""
    from workers import datasets, models
    from workers.datasets.contract import Split

    torch.manual_seed(0)
    splits = datasets.load("rotten-tomatoes")
    bundle = models.build(args.model, splits, {"max_length": args.max_length})
    train = splits.train
    batch_split: Split = train.subset(np.arange(args.batch_size))
    ids, mask = bundle.encode(batch_split)
    labels = torch.from_numpy(batch_split.labels)
    return bundle.module, (ids, mask, labels), bundle.info


def wrap(mechanism: str, module: nn.Module, batch: tuple[torch.Tensor, ...], info: dict[str, Any],
         args: argparse.Namespace) -> tuple[nn.Module, Any, Any]:
    """(model, optimizer, criterion) for one mechanism, through its ordinary make_private."""
    import mechanisms
    from mechanisms.parts.plan import PrivacySpec

    model = copy.deepcopy(module)
    loader = DataLoader(TensorDataset(*batch), batch_size=args.batch_size)
    mech_id = "dp-forward" if mechanism.startswith("dp-forward") else mechanism
    options = {"position": args.position, "freeze_pre_noise": mechanism == "dp-forward-frozen",
               "seed": 0} if mech_id == "dp-forward" else {}
    spec = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=len(loader.dataset),
                       batch_size=args.batch_size, epochs=10_000, sigma=None if mech_id == "nonprivate" else 1.0,
                       sampler="poisson", options=options)
    mech = mechanisms.get(mech_id)
    plan = mech.plan(spec)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0)
    model, optimizer, _, criterion = mech.make_private(
        model, optimizer, loader.dataset, plan, criterion=nn.CrossEntropyLoss(), generator=torch.Generator(),
        grad_sample_mode=info.get("grad_sample_mode", "hooks"))
    model.train()
    return model, optimizer, criterion


def step(model: nn.Module, optimizer: Any, criterion: Any, batch: tuple[torch.Tensor, ...]) -> float:
    ids, mask, labels = batch
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = criterion(model(ids, mask), labels)
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start


def time_interleaved(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    module, batch, info = build(args)
    wrapped = {m: wrap(m, module, batch, info, args) for m in args.mechanisms}
    times: dict[str, list[float]] = {m: [] for m in args.mechanisms}
    names = list(args.mechanisms)
    for r in range(WARMUP + args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]  # rotate who goes first
        for m in order:
            t = step(*wrapped[m], batch)
            if r >= WARMUP:
                times[m].append(t)
        print(f"round {r + 1}/{WARMUP + args.rounds}", file=sys.stderr, end="\r", flush=True)
    print(file=sys.stderr)
    return {m: {"step_time_s": statistics.median(t), "step_time_min_s": min(t)} for m, t in times.items()}


def _memory_child(mechanism: str, args: argparse.Namespace, out: Any) -> None:
    from workers.measure import PeakMemory

    torch.set_num_threads(args.threads)
    module, batch, info = build(args)
    model, optimizer, criterion = wrap(mechanism, module, batch, info, args)
    del module
    with PeakMemory(interval_s=0.002) as memory:
        for _ in range(WARMUP + 3):
            step(model, optimizer, criterion, batch)
    out.put(memory.extra_mb)


def peak_memory(mechanism: str, args: argparse.Namespace) -> float:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_memory_child, args=(mechanism, args, queue))
    proc.start()
    value = queue.get()
    proc.join()
    return float(value)


def ratios(rows: dict[str, dict[str, float]], key: str) -> dict[str, float]:
    out = {}
    for m in rows:
        for ref in ("nonprivate", "dpsgd"):
            if m != ref and ref in rows and rows[ref][key] > 0:
                out[f"{m}/{ref}"] = rows[m][key] / rows[ref][key]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-tiny", help="bert-tiny | minilm (any BERT-family registry model)")
    parser.add_argument("--position", default="pooled")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30, help="timed steps per mechanism")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS), choices=MECHANISMS)
    parser.add_argument("--no-memory", action="store_true", help="skip the per-mechanism memory children")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = time_interleaved(args)
    if not args.no_memory:
        for m in args.mechanisms:
            rows[m]["peak_memory_mb"] = peak_memory(m, args)
    summary = {
        "model": args.model, "position": args.position, "batch_size": args.batch_size, "max_length": args.max_length,
        "rounds": args.rounds, "threads": args.threads, "device": "cpu", "torch": torch.__version__,
        "mechanisms": rows, "step_time_ratio": ratios(rows, "step_time_s"),
        "peak_memory_ratio": {} if args.no_memory else ratios(rows, "peak_memory_mb"),
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{args.model}, batch {args.batch_size}, max_length {args.max_length}, position {args.position}, "
          f"{args.threads} threads, median of {args.rounds} interleaved steps")
    print("| mechanism | step time (s) | peak memory (MB) |")
    print("|---|---|---|")
    for m, r in rows.items():
        mem = f"{r['peak_memory_mb']:.0f}" if "peak_memory_mb" in r else "-"
        print(f"| {m} | {r['step_time_s']:.4f} | {mem} |")
    for name, table in (("step time", summary["step_time_ratio"]), ("peak memory", summary["peak_memory_ratio"])):
        if table:
            print(f"{name} ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in table.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
