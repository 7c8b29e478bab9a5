"""The GPU benchmarks run on CPU (so CI exercises them): the clipping benchmark's smoke setting measures
every variant it can and reports the one it must refuse; the config models (BERT-base, GPT-2 small,
ViT-B/16) build and step (slow); the sweep busy-fraction benchmark runs its small grid (slow: a local Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "clipping_engine.py"
ENV = os.environ | {"PYTHONPATH": str(SCRIPT.parents[1])}  # a script run by path finds privbench installed or not


def _run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "result.json"
    subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--json", str(out), *args], check=True,
                   capture_output=True, text=True, timeout=600, env=ENV | {"OMP_NUM_THREADS": "1"})
    return json.loads(out.read_text())


def test_quick_run_measures_fp32_and_bf16(tmp_path):
    result = _run(tmp_path, "--quick")
    res = result["mlp@256"]
    assert set(res["median_s"]) == {"nonprivate", "bk", "ghost", "nonprivate/bf16", "bk/bf16"}
    assert all(t > 0 for t in res["median_s"].values())
    assert "needs grad_sample_mode bk" in res["errors"]["ghost/bf16"]  # Opacus would clip with bf16 norms


@pytest.mark.slow
def test_config_models_build_and_step(tmp_path):
    result = _run(tmp_path, "--models", "bert-base,gpt2-small,vit-b16", "--config-batches", "2", "--variants",
                  "nonprivate,bk", "--precisions", "fp32,bf16", "--rounds", "1", "--no-memory")
    assert set(result) == {"bert-base@2", "gpt2-small@2", "vit-b16@2"}
    for res in result.values():
        assert not res["errors"], res["errors"]
        assert len(res["median_s"]) == 4


@pytest.mark.slow
def test_sweep_busy_smoke(tmp_path):
    """The busy-fraction benchmark on CPU at its smallest: the sweep runs, every trial's training phase is
    read from its record, and the fraction is a share of the CPU slots (a local Ray starts: slow)."""
    out = tmp_path / "busy.json"
    subprocess.run([sys.executable, str(SCRIPT.parent / "sweep_busy.py"), "--small", "--grids", "digits",
                    "--json", str(out)], check=True, capture_output=True, text=True, timeout=900, env=ENV)
    (res,) = json.loads(out.read_text())
    assert res["trials"] == res["finished"] == 2 and res["device"] == "cpu"
    assert res["phase_s"] > 0 and 0 < res["busy_fraction"] <= 1


def gpu_check(tmp_path: Path, *parts: str) -> tuple[dict, str]:
    """`benchmarks/gpu_check.py --small` as CI runs it (the given parts, or all): its JSON and Markdown table."""
    script = SCRIPT.parent / "gpu_check.py"
    done = subprocess.run([sys.executable, str(script), "--small", "--out", str(tmp_path),
                           *(["--parts", ",".join(parts)] if parts else [])],
                          capture_output=True, text=True, timeout=900, env=ENV)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads((tmp_path / "gpu_check.json").read_text()), (tmp_path / "gpu_check.md").read_text()


def test_gpu_check_runs_green_on_the_cpu(tmp_path):
    """Every part but the two sweeps, the quickstart's and the 20-trial grid's busy fraction (the `slow` test below
    runs them: about a minute, a sweep's driver and Ray each): one JSON and one Markdown table, the device named,
    0 host syncs per step, every quickstart trial placed by `gpus: auto`, and the bf16 margin held."""
    out, table = gpu_check(tmp_path, "engine", "syncs", "packing", "margin")
    assert out["device"].startswith("CPU") and out["small"]
    assert {(r["model"], r["precision"]) for r in out["engine"]} == {("mlp", "fp32"), ("mlp", "bf16")}
    assert all(r["ratio"] > 0 for r in out["engine"])
    assert [(r["dp_syncs"], r["nonprivate_syncs"]) for r in out["syncs"]] == [(0, 0)]
    assert out["packing"] and all(r["share"] is None and r["need_mb"] >= 0 for r in out["packing"])  # no GPU here
    assert out["margin"]["certified"] <= 1.0 < out["margin"]["plain"]
    assert "| mlp | 256 | fp32 |" in table and "host syncs / DP step" in table and "bf16 rounding margin" in table


@pytest.mark.slow
def test_gpu_check_every_part_on_the_cpu(tmp_path):
    out, _ = gpu_check(tmp_path)
    assert out["quickstart"]["finished"] == out["quickstart"]["trials"] > 0 and out["quickstart"]["wall_s"] > 0
    assert 0 < out["busy"]["busy_fraction"] <= 1
