"""Benchmark: the cost of shuffled DP-SGD's permutation, two ways.

    python benchmarks/permutation_speed.py                  # Table VII (n = 1000, 2000, 4000) + step overhead
    python benchmarks/permutation_speed.py --sizes 10000    # the paper's 10^4 matrix (the dense mm takes ~1 min)
    python benchmarks/permutation_speed.py --json           # one JSON object on stdout

1. Table VII of the paper: permuting the rows of an n x n matrix by index (`index_select`, as allocated
   by `matrix[indices]`, and into a preallocated `out=` buffer, which shows what is page-fault cost)
   versus multiplying by the permutation matrix, dense (`torch.mm`) and sparse (`torch.sparse.mm`, COO).
   All results are checked equal.
2. Step overhead: one training step of `nonprivate`, `dpsgd`, `shuffled-dpsgd` (and its two parts
   alone: batch clip + noise without the permutation, and the permutation with fresh rather than
   canonical noise) on the same registry model, same initial weights, same fixed batches,
   interleaved in one process (round robin, step by step, so machine load hits all alike).
   Reports median step time, peak extra RSS per step, and ratios to `dpsgd` and to `nonprivate`.

Timings are wall-clock on a shared 2-core machine: read the ratios, not the seconds. torch runs on
`--threads` threads (1 by default: oversubscribed threads on a loaded machine make timings erratic).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

PAPER_TABLE_VII_MS = {"index": 0.9799, "mm": 1316.6, "sparse_mm": 322.62}  # n = 10^4, RTX 3090


def _time_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def index_vs_matmul(n: int, repeats: int = 5) -> dict[str, Any]:
    """Row permutation of an n x n matrix: index_select vs dense and sparse permutation-matrix products."""
    gen = torch.Generator().manual_seed(n)
    weight = torch.randn(n, n, generator=gen)
    idx = torch.randperm(n, generator=gen)
    dense = torch.zeros(n, n).index_put_((torch.arange(n), idx), torch.ones(n))  # (P W)[i] = W[idx[i]]
    sparse = dense.to_sparse()
    reference = weight.index_select(0, idx)
    if not (torch.equal(dense @ weight, reference) and torch.equal(torch.sparse.mm(sparse, weight), reference)):
        raise AssertionError("the three ways of permuting disagree")
    mm_repeats = max(1, repeats if n <= 4000 else 1)
    out = torch.empty_like(weight)
    row = {"n": n,
           "index_ms": _time_ms(lambda: weight.index_select(0, idx), repeats),  # the paper's `matrix[indices]`
           "index_out_ms": _time_ms(lambda: torch.index_select(weight, 0, idx, out=out), repeats),  # no allocation
           "mm_ms": _time_ms(lambda: torch.mm(dense, weight), mm_repeats),
           "sparse_mm_ms": _time_ms(lambda: torch.sparse.mm(sparse, weight), repeats)}
    row["index_over_mm"] = row["index_ms"] / row["mm_ms"]
    row["index_over_sparse_mm"] = row["index_ms"] / row["sparse_mm_ms"]
    return row


# ---- step overhead ------------------------------------------------------------------------------

VARIANTS = {  # name -> (mechanism id, make_private extras)
    "nonprivate": ("nonprivate", {}),
    "dpsgd": ("dpsgd", {}),
    "shuffled-dpsgd": ("shuffled-dpsgd", {}),
    "shuffled, no permutation": ("shuffled-dpsgd", {"permute": False}),  # the plan's parts, no after-step
    "shuffled, fresh noise": ("shuffled-dpsgd", {"canonical_noise": False}),
}
WORKLOADS = {"bert-tiny": "rotten-tomatoes", "gpt2-tiny": "rotten-tomatoes", "vit-tiny": "digits"}


def step_overhead(model_name: str, *, steps: int = 30, batch_size: int = 32, mode: str | None = None,
                  sigma: float = 1.0, variants: tuple[str, ...] = tuple(VARIANTS)) -> dict[str, Any]:
    """Median step time and per-step peak extra RSS of each variant, interleaved step by step."""
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import mechanisms
    from mechanisms.catalog import shuffled_dpsgd
    from mechanisms.framework import private_training
    from mechanisms.parts.plan import PrivacySpec
    from workers import datasets, models
    from workers.measure import PeakMemory

    splits = datasets.load(WORKLOADS[model_name], {})
    n = min(len(splits.train), batch_size * steps)
    train = splits.train.subset(list(range(n)))
    wrapped: dict[str, tuple[Any, Any, Any]] = {}
    shufflers: dict[str, Any] = {}
    info: dict[str, Any] = {}
    for name in variants:
        mech_id, extras = VARIANTS[name]
        torch.manual_seed(0)  # same initial weights for every variant
        bundle = models.build(model_name, splits, {})
        module = bundle.module
        xs = bundle.encode(train)
        data = TensorDataset(*xs, torch.from_numpy(train.labels))
        loader = DataLoader(data, batch_size=batch_size)
        grad_mode = mode or bundle.info.get("grad_sample_mode", "hooks")
        num_params = shuffled_dpsgd.trainable_params(module)
        options = {"num_params": num_params, "batch_clip_ratio": 16, "permutation_seed": 0} \
            if mech_id == shuffled_dpsgd.ID else {}
        options |= {k: v for k, v in extras.items() if k != "permute"}
        spec = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=n, batch_size=batch_size, epochs=1_000, sigma=sigma,
                           options=options)
        mech = mechanisms.get(mech_id)
        plan = mech.plan(spec)
        optimizer = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=1e-3)
        wrap = private_training.make_private if extras.get("permute") is False else mech.make_private
        module, optimizer, _, criterion = wrap(
            module, optimizer, loader.dataset, plan, criterion=nn.CrossEntropyLoss(), grad_sample_mode=grad_mode,
            generator=torch.Generator().manual_seed(0), noise_generator=torch.Generator().manual_seed(1))
        module.train()
        wrapped[name] = (module, optimizer, criterion)
        shufflers[name] = getattr(optimizer, "post_processing", None)
        info = {"model": model_name, "dataset": WORKLOADS[model_name], "trainable_params": num_params,
                "grad_sample_mode": grad_mode, "batch_size": batch_size, "steps": steps}
    batches = [tuple(t[i:i + batch_size] for t in (*xs, torch.from_numpy(train.labels)))
               for i in range(0, n - batch_size + 1, batch_size)][:steps]
    times: dict[str, list[float]] = {name: [] for name in variants}
    peaks: dict[str, list[float]] = {name: [] for name in variants}
    for batch in batches:
        *inputs, labels = batch
        for name in variants:
            module, optimizer, criterion = wrapped[name]
            with PeakMemory(interval_s=0.001) as memory:
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                loss = criterion(module(*inputs), labels)
                loss.backward()
                optimizer.step()
                times[name].append(time.perf_counter() - start)
            peaks[name].append(memory.extra_mb)
    warm = slice(2, None)  # the first steps allocate buffers
    rows = {}
    for name in variants:
        row = {"step_ms": 1e3 * statistics.median(times[name][warm]),
               "peak_extra_mb": max(peaks[name][warm])}
        shuffler = shufflers[name]
        if shuffler is not None and shuffler.shuffles:
            row["permutation_ms"] = 1e3 * shuffler.seconds / shuffler.shuffles
        rows[name] = row
    for row in rows.values():
        for ref in ("dpsgd", "nonprivate"):
            if ref in rows:
                row[f"step_time_ratio_vs_{ref}"] = row["step_ms"] / rows[ref]["step_ms"]
    return info | {"variants": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000, 2000, 4000])
    parser.add_argument("--models", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--mode", default=None, help="Opacus grad_sample_mode (default: the model's, ghost)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    out: dict[str, Any] = {"threads": args.threads, "paper_table_vii_ms_n10000": PAPER_TABLE_VII_MS}
    out["table_vii"] = [index_vs_matmul(n) for n in args.sizes]
    out["step_overhead"] = [step_overhead(m, steps=args.steps, batch_size=args.batch_size, mode=args.mode)
                            for m in args.models]
    if args.json:
        json.dump(out, sys.stdout)
        print()
        return 0
    print(f"Table VII (torch threads: {args.threads}); paper at n=10^4: {PAPER_TABLE_VII_MS}")
    for row in out["table_vii"]:
        print(f"  n={row['n']:>6}: index {row['index_ms']:.3f} ms (into out=: {row['index_out_ms']:.3f}) | "
              f"mm {row['mm_ms']:.1f} ms | sparse.mm "
              f"{row['sparse_mm_ms']:.2f} ms | index/mm {row['index_over_mm']:.2e} | "
              f"index/sparse {row['index_over_sparse_mm']:.2e}")
    for result in out["step_overhead"]:
        print(f"step overhead: {result['model']} on {result['dataset']} ({result['trainable_params']} params, "
              f"{result['grad_sample_mode']}, batch {result['batch_size']}, {result['steps']} interleaved steps)")
        for name, row in result["variants"].items():
            perm = f", permutation {row['permutation_ms']:.2f} ms" if "permutation_ms" in row else ""
            print(f"  {name:<26} {row['step_ms']:8.1f} ms  x{row.get('step_time_ratio_vs_dpsgd', float('nan')):.3f} "
                  f"of dpsgd  x{row.get('step_time_ratio_vs_nonprivate', float('nan')):.3f} of nonprivate  "
                  f"peak +{row['peak_extra_mb']:.1f} MB{perm}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
