"""Benchmark: the book-keeping engine against Opacus' modes and a plain torch.func vmap, per registry model.

    python benchmarks/clipping_engine.py [--models mlp,cnn-small,...] [--rounds 20] [--threads 1]
                                         [--variants nonprivate,bk,hooks,ghost,functorch,vmap]

Each model runs at its example batch size (examples/*.yaml; the issue's table for mlp and bert-tiny).
Step time: every variant wraps its own copy of the model (same weights) with DP-SGD at sigma 1 (noise is
part of every private step) and the variants take turns in ONE process, one step each per round in a
rotating order, on the same real batch, so machine load hits all alike; the median over rounds is
reported as a ratio to nonprivate. Peak memory: a fresh process per variant (`--memory VARIANT`) runs
two warm-up steps, then one step inside `workers.measure.PeakMemory` (VmHWM reset through clear_refs on
CPU, max_memory_allocated on a GPU): the extra resident memory the step needed. A variant that fails
(e.g. Opacus on a model it cannot handle) is reported with its error instead of numbers.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

WARMUP = 2
TEXT = {"max_length": 64}
MODELS: dict[str, tuple[str, str, dict[str, Any], int, str]] = {
    # name: (model, dataset, model options, batch, where the batch size comes from)
    "mlp": ("mlp", "fashion-mnist", {}, 256, "issue 11 table"),
    "cnn-small": ("cnn-small", "fashion-mnist", {}, 512, "examples/quickstart.yaml"),
    "vit-tiny": ("vit-tiny", "digits", {}, 128, "examples/shuffled_dpsgd.yaml"),
    "bert-tiny": ("bert-tiny", "rotten-tomatoes", TEXT, 32, "examples/text.yaml"),
    "gpt2-tiny": ("gpt2-tiny", "rotten-tomatoes", TEXT, 32, "as bert-tiny"),
    "minilm-top-2": ("minilm", "rotten-tomatoes", TEXT | {"trainable": "top-2"}, 32, "examples/text.yaml"),
    "minilm-all": ("minilm", "rotten-tomatoes", TEXT | {"trainable": "all"}, 32, "examples/text.yaml, all layers"),
}
VARIANTS = ("nonprivate", "bk", "hooks", "ghost", "functorch", "vmap")
# A fixed glibc mmap threshold: large buffers are mapped and unmapped per step, so resident memory returns
# to its level between steps and one step's peak is visible (glibc's dynamic threshold would otherwise keep
# a warmed-up step's buffers in the heap, and every step would read 0 extra).
MEMORY_ENV = os.environ | {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


def _batch(name: str) -> tuple[Any, tuple[torch.Tensor, ...]]:
    from workers import datasets, models

    model, dataset, options, batch, _ = MODELS[name]
    torch.manual_seed(0)
    splits = datasets.load(dataset)
    bundle = models.build(model, splits, options)
    idx = np.arange(batch)
    data = (*bundle.encode(splits.train.subset(idx)), torch.from_numpy(splits.train.labels[idx]).long())
    return bundle, data


def _vmap_private(module: nn.Module, optimizer: Any, loader: Any, sigma: float, clip: float) -> tuple[Any, ...]:
    """Plain torch.func: vmap(grad) per-sample gradients, flat clip, sum into p.grad; Opacus' noise step."""
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from torch.func import functional_call, grad, vmap

    names = [n for n, p in module.named_parameters() if p.requires_grad]
    params = [p for p in module.parameters() if p.requires_grad]
    frozen = {n: p.detach() for n, p in module.named_parameters() if not p.requires_grad}
    buffers = dict(module.named_buffers())

    def loss_one(trainable: dict[str, torch.Tensor], *xs: torch.Tensor) -> torch.Tensor:
        *inputs, y = (x.unsqueeze(0) for x in xs)
        out = functional_call(module, (trainable | frozen | buffers), tuple(inputs))
        return nn.functional.cross_entropy(out, y)

    class Loss:
        def __call__(self, out: torch.Tensor, y: torch.Tensor) -> Any:
            return self

    opt = DPOptimizerFastGradientClipping(optimizer, noise_multiplier=sigma, max_grad_norm=clip,
                                          expected_batch_size=loader.batch_size)

    def step(*xs: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        trainable = {n: p.detach() for n, p in zip(names, params, strict=True)}
        g = vmap(grad(loss_one), in_dims=(None,) + (0,) * len(xs), randomness="different")(trainable, *xs)
        batch = xs[0].shape[0]
        norms = torch.stack([g[n].reshape(batch, -1).norm(2, dim=1) for n in names], 1).norm(2, dim=1)
        c = (clip / (norms + 1e-6)).clamp(max=1.0)
        for n, p in zip(names, params, strict=True):
            p.grad = torch.einsum("i,i...", c, g[n])
        opt.step()

    return step


def _stepper(variant: str, bundle: Any, data: tuple[torch.Tensor, ...]) -> Any:
    import mechanisms
    from mechanisms.plan import PrivacySpec

    module = copy.deepcopy(bundle.module)
    opt = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=0.01)
    loader = DataLoader(TensorDataset(*data), batch_size=len(data[-1]))
    inputs, y = data[:-1], data[-1]
    if variant == "vmap":
        step = _vmap_private(module, opt, loader, 1.0, 1.0)
        return lambda: step(*inputs, y)
    mech = mechanisms.get("nonprivate" if variant == "nonprivate" else "dpsgd")
    plan = mech.plan(PrivacySpec(epsilon=None, sigma=1.0, delta=1e-5, dataset_size=len(y), batch_size=len(y),
                                 epochs=1000, sampler="fixed"))  # steps: rounds of the benchmark
    module, opt, _, crit = mech.make_private(module, opt, TensorDataset(*data), plan, criterion=nn.CrossEntropyLoss(),
                                             generator=torch.Generator().manual_seed(0), grad_sample_mode=variant)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        crit(module(*inputs), y).backward()
        opt.step()

    return step


def memory(name: str, variant: str) -> dict[str, Any]:
    """One fresh process per variant: the peak extra memory of one step after warm-up."""
    from workers.measure import PeakMemory

    bundle, data = _batch(name)
    step = _stepper(variant, bundle, data)
    for _ in range(WARMUP):
        step()
    with PeakMemory() as mem:
        step()
    return {"peak_mb": mem.extra_mb}


def timing(name: str, variants: list[str], rounds: int) -> dict[str, Any]:
    bundle, data = _batch(name)
    steppers, errors = {}, {}
    for v in variants:
        try:
            steppers[v] = _stepper(v, bundle, data)
            steppers[v]()
        except Exception as exc:  # noqa: BLE001 - a failing variant is a row of the table
            errors[v] = f"{type(exc).__name__}: {str(exc)[:120]}"
            steppers.pop(v, None)
    names = list(steppers)
    times: dict[str, list[float]] = {v: [] for v in names}
    for r in range(rounds + WARMUP):
        for v in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            steppers[v]()
            if r >= WARMUP:
                times[v].append(time.perf_counter() - t0)
    return {"median_s": {v: statistics.median(t) for v, t in times.items()}, "errors": errors}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--memory", default=None, help="internal: measure one variant's memory in this process")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory:
        print(json.dumps(memory(args.models, args.memory)))
        return
    variants = args.variants.split(",")
    results = {}
    for name in args.models.split(","):
        res = timing(name, variants, args.rounds)
        res["peak_mb"] = {}
        for v in variants:
            if v in res["errors"]:
                continue
            out = subprocess.run([sys.executable, __file__, "--models", name, "--memory", v, "--threads",
                                  str(args.threads)], capture_output=True, text=True, env=MEMORY_ENV)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            res["peak_mb"][v] = json.loads(lines[-1])["peak_mb"] if lines else None
        results[name] = res
        _print(name, res, variants)
    print(f"load average: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def _print(name: str, res: dict[str, Any], variants: list[str]) -> None:
    med, peak = res["median_s"], res["peak_mb"]
    base_t, base_m = med.get("nonprivate"), peak.get("nonprivate")
    _, _, _, batch, source = MODELS[name]
    print(f"\n{name} (batch {batch}, {source})")
    print(f"{'variant':<11} {'step ms':>9} {'x nonpriv':>9} {'peak MB':>9} {'x nonpriv':>9}")
    for v in variants:
        if v in res["errors"]:
            print(f"{v:<11} failed: {res['errors'][v]}")
            continue
        t, m = med[v], peak.get(v)
        rt = t / base_t if base_t else float("nan")
        rm = m / base_m if m is not None and base_m and base_m >= 1.0 else float("nan")  # < 1 MB: noise
        print(f"{v:<11} {1000 * t:9.1f} {rt:9.2f} {m if m is not None else float('nan'):9.1f} {rm:9.2f}", flush=True)


if __name__ == "__main__":
    main()
