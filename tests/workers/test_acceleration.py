"""`train: {precision, compile}`: what is refused before a trial runs, and a bf16 / compiled trial that
trains and records its precision."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from orchestrator.grid import parse
from workers.acceleration import StepPrecision
from workers.train import TrainConfig
from workers.trial import run_trial


@pytest.mark.parametrize(("settings", "message"), [
    ({"precision": "fp8"}, "precision must be one of"),
    ({"precision": "bf16", "grad_sample_mode": "hooks"}, "needs grad_sample_mode bk"),
    ({"compile": True, "grad_sample_mode": "ghost"}, "supports grad_sample_mode bk only"),
    ({"compile": "yes"}, "compile must be true or false"),
])
def test_bad_settings_are_refused_by_the_config(settings, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**settings)


def test_fp16_needs_cuda_and_is_refused_for_private_training():
    with pytest.raises(ValueError, match="needs CUDA"):
        StepPrecision("fp16", torch.device("cpu"), private=False, grad_sample_mode=None)
    with pytest.raises(ValueError, match="refused for private training"):
        StepPrecision("fp16", torch.device("cuda"), private=True, grad_sample_mode="bk")


def test_cpu_bf16_autocast_runs_matmuls_in_bf16():
    precision = StepPrecision("bf16", torch.device("cpu"), private=True, grad_sample_mode="bk")
    with precision.autocast():
        out = torch.nn.functional.linear(torch.randn(2, 3), torch.randn(4, 3))
    assert out.dtype == torch.bfloat16 and precision.scaler is None


GRID = """
name: precision
seeds: [0]
grid: {dataset: [digits], model: [mlp], mechanism: [dpsgd], epsilon: [8]}
train: {epochs: 4, batch_size: 256, lr: 0.5, max_train_examples: 512}
audit: {mode: "off"}
resources: {cpus: 1, gpus: 0}
"""


@pytest.mark.parametrize("train", [{"precision": "bf16"}, {"compile": True}], ids=["bf16", "compile"])
def test_a_private_trial_trains_with_the_setting(train):
    trial = parse(GRID).trials[0]
    record = run_trial(dataclasses.replace(trial, train=dataclasses.replace(trial.train, **train)))
    assert record["status"] == "finished", record.get("traceback")
    assert record["metrics"]["accuracy"] > 0.3  # 10 classes, 8 steps: it learned something
    assert record["metrics"]["steps_run"] == record["privacy"]["steps"]
