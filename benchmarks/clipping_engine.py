"""Benchmark: the book-keeping engine against Opacus' modes and a plain torch.func vmap, per registry model.

    python benchmarks/clipping_engine.py [--models mlp,cnn-small,...,bert-base,gpt2-small,vit-b16]
        [--variants nonprivate,bk,hooks,ghost,functorch,vmap] [--precisions fp32,bf16] [--scales 1,8]
        [--config-batches 32,128] [--device auto|cpu|cuda] [--rounds 20] [--threads 1] [--clock auto|cpu|wall]
        [--quick]

On CUDA every step is synchronised before and after it is timed, and peak memory is
`torch.cuda.max_memory_allocated` above the allocation at the step's start (reset per variant).
`--quick` is the CI smoke run (mlp, seconds). Precisions other than fp32 run the forward under autocast;
Opacus' modes are refused there (they would clip with bf16 norms), as in training.

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
VARIANTS = ("nonprivate", "bk", "hooks", "ghost", "functorch", "vmap", "noise")
# `noise` is not an engine: the Gaussian noise of one DP-SGD step alone (one draw per trainable tensor from the
# trial's generator), the floor no engine removes; its ratio to nonprivate is noise generation's share.
# A fixed glibc mmap threshold: large buffers are mapped and unmapped per step, so resident memory returns
# to its level between steps and one step's peak is visible (glibc's dynamic threshold would otherwise keep
# a warmed-up step's buffers in the heap, and every step would read 0 extra).
MEMORY_ENV = os.environ | {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


CONFIG_MODELS = ("bert-base", "gpt2-small", "vit-b16")  # built from transformers configs, random weights
CONFIG_BATCHES = (32, 128)
TEXT_LENGTH = 128


def cases(models: list[str], scales: list[int], config_batches: list[int]) -> list[tuple[str, int]]:
    """(model, batch) pairs: registry models at their example batch times each scale, config models at
    each of `config_batches`."""
    out = []
    for name in models:
        if name in CONFIG_MODELS:
            out += [(name, b) for b in config_batches]
        else:
            out += [(name, MODELS[name][3] * s) for s in scales]
    return out


def _config_model(name: str, batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """BERT-base, GPT-2 small and ViT-B/16 from their `transformers` default configs (no download): text
    at length 128 with every token real, images 224 px, 10 classes."""
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        GPT2Config,
        GPT2ForSequenceClassification,
        ViTConfig,
        ViTForImageClassification,
    )

    from workers.models.transformers import ImageClassifier, TextClassifier, conv1d_to_linear

    torch.manual_seed(0)
    y = torch.randint(0, 10, (batch,))
    if name == "vit-b16":
        model = ViTForImageClassification(ViTConfig(num_labels=10, hidden_dropout_prob=0.0))
        return ImageClassifier(model).train(), (torch.randn(batch, 3, 224, 224), y)
    if name == "bert-base":
        model = BertForSequenceClassification(BertConfig(num_labels=10, hidden_dropout_prob=0.0,
                                                         attention_probs_dropout_prob=0.0))
    else:
        model = GPT2ForSequenceClassification(GPT2Config(num_labels=10, pad_token_id=0, resid_pdrop=0.0,
                                                         embd_pdrop=0.0, attn_pdrop=0.0))
        conv1d_to_linear(model)
    vocab = model.config.vocab_size
    ids = torch.randint(1, vocab, (batch, TEXT_LENGTH))
    return TextClassifier(model, num_classes=10).train(), (ids, torch.ones_like(ids), y)


def _batch(name: str, batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if name in CONFIG_MODELS:
        return _config_model(name, batch)
    from workers import datasets, models

    model, dataset, options, _, _ = MODELS[name]
    torch.manual_seed(0)
    splits = datasets.load(dataset)
    bundle = models.build(model, splits, options)
    if batch > len(splits.train):
        raise ValueError(f"{name}: batch {batch} exceeds the {len(splits.train)} training examples of {dataset}")
    idx = np.arange(batch)
    data = (*bundle.encode(splits.train.subset(idx)), torch.from_numpy(splits.train.labels[idx]).long())
    return bundle.module, data


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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stepper(variant: str, module: nn.Module, data: tuple[torch.Tensor, ...], device: torch.device,
             precision: str) -> Any:
    """One DP-SGD step (sigma 1) of `variant` on its own copy of `module`, under `precision`'s autocast."""
    import mechanisms
    from mechanisms.parts.plan import PrivacySpec
    from workers.acceleration import StepPrecision

    module = copy.deepcopy(module).to(device)
    data = tuple(x.to(device) for x in data)
    amp = StepPrecision(precision, device, private=variant != "nonprivate",
                        grad_sample_mode=None if variant == "nonprivate" else variant)
    opt = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=0.01)
    loader = DataLoader(TensorDataset(*data), batch_size=len(data[-1]))
    inputs, y = data[:-1], data[-1]
    if variant == "vmap":
        step = _vmap_private(module, opt, loader, 1.0, 1.0)
        return lambda: step(*inputs, y)
    if variant == "noise":
        params = [p for p in module.parameters() if p.requires_grad]
        noise_gen = torch.Generator(device).manual_seed(0)

        def noise() -> None:
            for p in params:
                torch.normal(0.0, 1.0, p.shape, generator=noise_gen, device=device, dtype=p.dtype)

        return noise
    mech = mechanisms.get("nonprivate" if variant == "nonprivate" else "dpsgd")
    plan = mech.plan(PrivacySpec(epsilon=None, sigma=1.0, delta=1e-5, dataset_size=len(y), batch_size=len(y),
                                 epochs=1000, sampler="fixed"))  # steps: rounds of the benchmark
    module, opt, _, crit = mech.make_private(module, opt, TensorDataset(*data), plan, criterion=nn.CrossEntropyLoss(),
                                             generator=torch.Generator().manual_seed(0), grad_sample_mode=variant,
                                             noise_generator=torch.Generator(device).manual_seed(0))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = crit(module(*inputs), y)
        amp.backward_and_step(loss, opt)

    return step


def _label(variant: str, precision: str) -> str:
    return variant if precision == "fp32" else f"{variant}/{precision}"


def _split(label: str) -> tuple[str, str]:
    variant, _, precision = label.partition("/")
    return variant, precision or "fp32"


def memory(name: str, batch: int, label: str, device: torch.device) -> dict[str, Any]:
    """The peak extra memory of one step after warm-up (a fresh process per variant on CPU)."""
    from workers.measure import PeakMemory

    module, data = _batch(name, batch)
    variant, precision = _split(label)
    step = _stepper(variant, module, data, device, precision)
    for _ in range(WARMUP):
        step()
    with PeakMemory(device=device) as mem:
        step()
    return {"peak_mb": mem.extra_mb}


def timing(name: str, batch: int, labels: list[str], rounds: int, device: torch.device,
           clock: Any = time.perf_counter) -> dict[str, Any]:
    """Median step seconds per variant, taken in turns; `clock`: the wall clock (`perf_counter`, always on CUDA)
    or the process's CPU time (`process_time`, on the CPU: a loaded machine's wall clock counts other processes)."""
    module, data = _batch(name, batch)
    steppers, errors = {}, {}
    for label in labels:
        variant, precision = _split(label)
        try:
            steppers[label] = _stepper(variant, module, data, device, precision)
            steppers[label]()
        except Exception as exc:  # noqa: BLE001 - a failing variant is a row of the table
            errors[label] = f"{type(exc).__name__}: {str(exc)[:120]}"
            steppers.pop(label, None)
    names = list(steppers)
    times: dict[str, list[float]] = {v: [] for v in names}
    for r in range(rounds + WARMUP):
        for v in names[r % len(names):] + names[: r % len(names)]:
            _sync(device)
            t0 = clock()
            steppers[v]()
            _sync(device)  # CUDA runs asynchronously: the step ends when its kernels have
            if r >= WARMUP:
                times[v].append(clock() - t0)
    return {"batch": batch, "median_s": {v: statistics.median(t) for v, t in times.items()}, "errors": errors}


def main() -> None:
    ap = argparse.ArgumentParser(description="Per-sample clipping engines side by side (docs/clipping.md).")
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"registry models ({', '.join(MODELS)}) and/or config models ({', '.join(CONFIG_MODELS)})")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--precisions", default="fp32", help="comma-separated: fp32, bf16 (CPU and CUDA), fp16 (CUDA)")
    ap.add_argument("--scales", default="1", help="registry models run at their example batch times each (e.g. 1,8)")
    ap.add_argument("--config-batches", default=",".join(map(str, CONFIG_BATCHES)),
                    help="batch sizes of the config models (text length 128, images 224 px)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", default="auto", choices=("auto", "cpu", "wall"),
                    help="step times from the CPU time of this process (cpu; auto on the CPU) or the wall clock "
                         "(wall; auto on CUDA)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run in seconds: mlp, nonprivate/bk/ghost, fp32 and bf16, 2 rounds, no memory")
    ap.add_argument("--memory", default=None, help="internal: measure one variant's memory in this process")
    ap.add_argument("--batch", type=int, default=None, help="internal: the batch of --memory")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.exit(2, "clipping_engine: --device cuda but no CUDA device is available\n")
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    torch.set_num_threads(args.threads)
    if args.memory:
        print(json.dumps(memory(args.models, args.batch, args.memory, device)))
        return
    if args.quick:
        args.models, args.variants, args.precisions, args.rounds, args.no_memory = \
            "mlp", "nonprivate,bk,ghost", "fp32,bf16", 2, True
    labels = [_label(v, p) for p in args.precisions.split(",") for v in args.variants.split(",")]
    results = {}
    for name, batch in cases(args.models.split(","), [int(s) for s in args.scales.split(",")],
                             [int(b) for b in args.config_batches.split(",")]):
        clock = time.process_time if args.clock == "cpu" or (args.clock == "auto" and device.type == "cpu") \
            else time.perf_counter
        res = timing(name, batch, labels, args.rounds, device, clock)
        res["clock"] = "cpu" if clock is time.process_time else "wall"
        res["peak_mb"] = {}
        for label in labels if not args.no_memory else []:
            if label in res["errors"]:
                continue
            if device.type == "cuda":  # allocated memory only: the caching allocator's state does not leak in
                res["peak_mb"][label] = memory(name, batch, label, device)["peak_mb"]
                continue
            out = subprocess.run([sys.executable, __file__, "--models", name, "--batch", str(batch), "--memory", label,
                                  "--threads", str(args.threads), "--device", "cpu"],
                                 capture_output=True, text=True, env=MEMORY_ENV)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            res["peak_mb"][label] = json.loads(lines[-1])["peak_mb"] if lines else None
        results[f"{name}@{batch}"] = res
        _print(name, res, labels)
    print(f"device: {device}; threads: {args.threads}; clock: {args.clock}; load average: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


OPACUS = ("hooks", "ghost", "functorch")


def summary(res: dict[str, Any]) -> dict[str, float]:
    """The ratios the issue asks for: bk over non-private (per precision), the best Opacus mode over bk,
    and the bf16 DP step over the fp32 one."""
    med, out = res["median_s"], {}
    for label, t in med.items():
        variant, precision = _split(label)
        base = med.get(_label("nonprivate", precision))
        if variant == "bk" and base:
            out[f"bk/nonprivate {precision}"] = t / base
    opacus = [med[v] for v in OPACUS if v in med]
    if "bk" in med and opacus:
        out["best Opacus/bk"] = min(opacus) / med["bk"]
    for precision in ("bf16", "fp16"):
        if "bk" in med and _label("bk", precision) in med:
            out[f"bk {precision}/fp32"] = med[_label("bk", precision)] / med["bk"]
    return out


def _print(name: str, res: dict[str, Any], labels: list[str]) -> None:
    med, peak = res["median_s"], res["peak_mb"]
    base_t, base_m = med.get("nonprivate"), peak.get("nonprivate")
    batch = res["batch"]
    source = MODELS[name][4] if name in MODELS else "transformers config, random weights"
    print(f"\n{name} (batch {batch}, {source})")
    print(f"{'variant':<16} {'step ms':>9} {'x nonpriv':>9} {'peak MB':>9} {'x nonpriv':>9}")
    for v in labels:
        if v in res["errors"]:
            print(f"{v:<16} failed: {res['errors'][v]}")
            continue
        t, m = med[v], peak.get(v)
        rt = t / base_t if base_t else float("nan")
        rm = m / base_m if m is not None and base_m and base_m >= 1.0 else float("nan")  # < 1 MB: noise
        print(f"{v:<16} {1000 * t:9.1f} {rt:9.2f} {m if m is not None else float('nan'):9.1f} {rm:9.2f}", flush=True)
    print("  " + "; ".join(f"{k} {v:.2f}x" for k, v in summary(res).items()))


if __name__ == "__main__":
    main()
