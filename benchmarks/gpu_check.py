"""One command for the accelerator figures of docs/clipping.md, on whatever device is present.

    python benchmarks/gpu_check.py [--small] [--out DIR] [--parts quickstart,busy,engine,syncs,packing,margin]

It measures, on CUDA when a GPU is present and on the CPU otherwise (the card, or the CPU, is named in the output):

- `quickstart`: the wall time of examples/quickstart.yaml as `privbench sweep run` (fresh store, own local Ray),
  and the share of it the trials spent training (`benchmarks/sweep_busy.py`);
- `busy`: the busy fraction of the 20-trial digits grid (`sweep_busy.py`'s `digits`);
- `engine`: the book-keeping engine against the non-private step, interleaved in one process
  (`benchmarks/clipping_engine.py`), for the registry models and BERT-base, GPT-2 small and ViT-B/16 built
  from their `transformers` configs, in fp32 and bf16;
- `syncs`: dispatched ops and host synchronisations per steady-state step, DP (canaries on) and non-private
  (`benchmarks/step_profile.py`);
- `packing`: what `gpus: auto` gives each quickstart trial: its measured step memory and its GPU share
  (`orchestrator.cluster.packed_share`); without a GPU, `auto` runs on the CPU and the memory is the CPU's;
- `margin`: the certified bf16 rounding margin over its adversarial inputs, with the device's own norm kernels
  (`benchmarks/rounding_margin.py`): the largest clipped per-example norm, recomputed in fp64, over the bound.

It writes `gpu_check.json` (every figure) and `gpu_check.md` (the tables) into `--out` and prints the Markdown.
`--small` is the CI run (a minute or two on a CPU): the grids shrunk to a few one-epoch trials, the engine and
syncs on mlp only, two rounds. A part that fails is reported with its error; the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # privbench from this checkout
sys.path.insert(0, str(ROOT / "benchmarks"))

import clipping_engine  # noqa: E402
import rounding_margin  # noqa: E402
import step_profile  # noqa: E402
import sweep_busy  # noqa: E402

PARTS = ("quickstart", "busy", "engine", "syncs", "packing", "margin")
REGISTRY = ("mlp", "cnn-small", "vit-tiny", "bert-tiny", "gpt2-tiny")  # minilm's weights are not on every machine
CONFIGS = ("bert-base", "gpt2-small", "vit-b16")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}, torch {torch.__version__})"
    return f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores (torch {torch.__version__})"


def quickstart(small: bool, gpus: int) -> dict[str, Any]:
    res = sweep_busy.run("quickstart", gpu=gpus > 0, gpus=gpus, small=small)
    return {"wall_s": res["wall_s"], "trials": res["trials"], "finished": res["finished"],
            "busy_fraction": res["busy_fraction"]}


def busy(small: bool, gpus: int) -> dict[str, Any]:
    res = sweep_busy.run("digits", gpu=gpus > 0, gpus=gpus, small=small)
    return {"wall_s": res["wall_s"], "trials": res["trials"], "finished": res["finished"],
            "busy_fraction": res["busy_fraction"], "slots": res["slots"]}


def engine(small: bool, device: torch.device) -> list[dict[str, Any]]:
    models = ("mlp",) if small else REGISTRY + CONFIGS
    precisions = ("fp32", "bf16")
    labels = [clipping_engine._label(v, p) for p in precisions for v in ("nonprivate", "bk")]
    rows = []
    for name, batch in clipping_engine.cases(list(models), [1], [32]):
        res = clipping_engine.timing(name, batch, labels, 2 if small else 20, device)
        med = res["median_s"]
        for precision in precisions:
            base, dp = med.get(clipping_engine._label("nonprivate", precision)), med.get(
                clipping_engine._label("bk", precision))
            rows.append({"model": name, "batch": batch, "precision": precision,
                         "nonprivate_ms": None if base is None else 1e3 * base,
                         "bk_ms": None if dp is None else 1e3 * dp,
                         "ratio": dp / base if base and dp else None, "errors": res["errors"]})
    return rows


def syncs(small: bool, device: torch.device) -> list[dict[str, Any]]:
    rows = []
    for model in ("mlp",) if small else REGISTRY:
        dp = step_profile.profile(model, "dpsgd", steps=2 if small else 4, device=device)
        plain = step_profile.profile(model, "nonprivate", steps=2 if small else 4, canaries=False, device=device)
        rows.append({"model": model, "dp_syncs": dp.syncs_per_step, "nonprivate_syncs": plain.syncs_per_step,
                     "op_ratio": dp.ops_per_step / plain.ops_per_step, "sync_ops": sorted({*dp.syncs, *plain.syncs})})
    return rows


def packing(small: bool) -> list[dict[str, Any]]:
    from orchestrator.cluster import packed_share
    from orchestrator.grid import parse
    from workers.trial import step_memory

    spec = sweep_busy.grid("quickstart", gpu=torch.cuda.is_available(), small=small)
    seen, rows = set(), []
    for trial in parse(json.dumps(spec)).trials:
        if trial.memory_key in seen:
            continue
        seen.add(trial.memory_key)
        need, size = step_memory(trial)
        rows.append({"trial": f"{trial.model} {trial.mechanism} batch {trial.train.batch_size}", "need_mb": need,
                     "gpu_mb": size, "share": packed_share(need, size) if size else None})
    return rows


def margin(device: torch.device) -> dict[str, float]:
    res = rounding_margin.worst(device)
    if res["certified"] > 1.0:
        raise AssertionError(f"a certified clipped example has norm {res['certified']!r} x the bound")
    return res


def markdown(out: dict[str, Any]) -> str:
    lines = [f"Device: {out['device']}; {'small settings' if out['small'] else 'full settings'}; "
             f"{time.strftime('%Y-%m-%d', time.gmtime(out['started']))}.", ""]
    for part in ("quickstart", "busy"):
        r = out.get(part)
        if isinstance(r, dict) and "wall_s" in r:
            what = "quickstart" if part == "quickstart" else "digits grid"
            lines.append(f"- {what}: {r['finished']}/{r['trials']} trials in {r['wall_s']:.1f} s, "
                         f"busy fraction {r['busy_fraction']:.2f}")
    if isinstance(out.get("engine"), list):
        lines += ["", "| model | batch | precision | non-private ms | bk ms | bk / non-private |",
                  "|---|---|---|---|---|---|"]
        for r in out["engine"]:
            ms = [f"{v:.1f}" if v is not None else "failed" for v in (r["nonprivate_ms"], r["bk_ms"])]
            ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
            lines.append(f"| {r['model']} | {r['batch']} | {r['precision']} | {ms[0]} | {ms[1]} | {ratio} |")
    if isinstance(out.get("syncs"), list):
        lines += ["", "| model | host syncs / DP step | host syncs / non-private step | op ratio |",
                  "|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['dp_syncs']:g} | {r['nonprivate_syncs']:g} | {r['op_ratio']:.2f}x |"
                  for r in out["syncs"]]
    if isinstance(out.get("packing"), list):
        lines += ["", "| `gpus: auto` trial | step memory MB | GPU MB | share |", "|---|---|---|---|"]
        lines += [f"| {r['trial']} | {r['need_mb']:.0f} | {r['gpu_mb'] or '-'} | "
                  f"{r['share'] if r['share'] is not None else 'CPU (no GPU)'} |" for r in out["packing"]]
    if isinstance(out.get("margin"), dict) and "certified" in out["margin"]:
        lines += ["", f"- bf16 rounding margin: the largest clipped norm is {out['margin']['certified']:.6f} x the "
                      f"bound certified, {out['margin']['plain']:.4f} x with the plain factor"]
    lines += [f"- {part}: failed: {out[part]['error']}" for part in PARTS
              if isinstance(out.get(part), dict) and "error" in out[part]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CI settings: a few one-epoch trials, mlp only, 2 rounds")
    ap.add_argument("--out", default=".", help="folder for gpu_check.json and gpu_check.md (default: here)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    args = ap.parse_args(argv)
    parts = args.parts.split(",")
    if unknown := sorted(set(parts) - set(PARTS)):
        ap.error(f"unknown parts {unknown}; known: {', '.join(PARTS)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    torch.set_num_threads(1)  # the engine and syncs figures are one-thread figures on the CPU (docs/clipping.md)
    out: dict[str, Any] = {"device": device_name(device), "small": args.small, "started": time.time()}
    run = {"quickstart": lambda: quickstart(args.small, gpus), "busy": lambda: busy(args.small, gpus),
           "engine": lambda: engine(args.small, device), "syncs": lambda: syncs(args.small, device),
           "packing": lambda: packing(args.small), "margin": lambda: margin(device)}
    for part in parts:
        print(f"gpu_check: {part} ...", file=sys.stderr, flush=True)
        try:
            out[part] = run[part]()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a failing part is a line of the report
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
            out[part] = {"error": f"{type(exc).__name__}: {last}", "traceback": traceback.format_exc()[-2000:]}
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu_check.json").write_text(json.dumps(out, indent=1, default=str))
    text = markdown(out)
    (folder / "gpu_check.md").write_text(text)
    print(text)
    return 1 if any(isinstance(out.get(p), dict) and "error" in out[p] for p in parts) else 0


if __name__ == "__main__":
    raise SystemExit(main())
