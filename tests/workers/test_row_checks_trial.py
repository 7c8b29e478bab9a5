"""Real trials (`workers.trial.run_trial`, digits, DP-SGD at target epsilon 2, the issue's geometry) with models that
break DP-SGD through the model and the loss: a known mixer is refused by the plan phase in one line naming the
module and the fix; a mixer no rule names trains but comes out `uncertified`, the reason naming where the rows mix;
the same models made correct (Opacus-style `fix`, and the control) are `ok` at the certified epsilon of today."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch
from torch import nn

from mechanisms.framework.integrity import model_checks
from orchestrator.grid import parse
from workers import models
from workers.config import Resources
from workers.models.contract import Model, ModelBundle
from workers.trial import run_trial

CERTIFIED = 1.9989271503165622  # the control's certified epsilon on this grid before these checks (issue 37)


def _bundle(module: nn.Module) -> ModelBundle:
    return ModelBundle(module, lambda split: (torch.from_numpy(split.inputs),), {"grad_sample_mode": "bk"})


def _width(splits) -> int:
    return math.prod(splits.input_shape)


def batchnorm_mlp(splits) -> ModelBundle:
    return _bundle(nn.Sequential(nn.Flatten(), nn.BatchNorm1d(_width(splits), affine=False),
                                 nn.Linear(_width(splits), 128), nn.Tanh(), nn.Linear(128, splits.num_classes)))


def fixed_batchnorm_mlp(splits) -> ModelBundle:
    return _bundle(model_checks.fix(batchnorm_mlp(splits).module))


class BatchSoftmax(nn.Module):
    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(width, 128), nn.Tanh(), nn.Linear(128, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.net(x), dim=0)  # normalised over the batch


def batch_softmax_mlp(splits) -> ModelBundle:
    return _bundle(BatchSoftmax(_width(splits), splits.num_classes))


MODELS = {"rows-batchnorm": batchnorm_mlp, "rows-batchnorm-fixed": fixed_batchnorm_mlp,
          "rows-batch-softmax": batch_softmax_mlp}


@pytest.fixture(scope="module", autouse=True)
def registered():
    for name, builder in MODELS.items():
        models.register(Model(name, ("image",), "a row-probe test model", builder))
    try:
        yield
    finally:
        for name in MODELS:
            models.MODELS.unregister(name)


def trial(model: str) -> dict:
    warnings.filterwarnings("ignore")
    config = parse(f"""
name: rows
seeds: [0]
delta: 1e-5
grid: {{dataset: [digits], model: [{model}], mechanism: [dpsgd], epsilon: [2]}}
train: {{epochs: 2, batch_size: 64}}
audit: {{mode: "off"}}
""").trials[0]
    return run_trial(dataclasses.replace(config, resources=Resources(cpus=1, gpus=0)))


def test_a_batchnorm_model_is_refused_before_training_in_one_line():
    record = trial("rows-batchnorm")
    assert record["status"] == "failed" and "training_s" not in record["metrics"]
    error = record["error"]
    assert error.startswith("ModelRefused: the model's module `1` (BatchNorm1d)") and "\n" not in error
    assert "GroupNorm or LayerNorm" in error


@pytest.mark.parametrize("model", ["mlp", "rows-batchnorm-fixed"])
def test_the_control_and_the_fixed_model_are_ok_at_todays_certified_epsilon(model):
    record = trial(model)
    assert record["status"] == "finished", record.get("traceback")
    privacy = record["privacy"]
    assert privacy["claim_status"] == "ok" and privacy["integrity_failed"] == [], privacy["integrity_failed"]
    assert privacy["integrity_checks"]["row_independence"] and privacy["integrity_checks"]["model_state"]
    assert privacy["epsilon_certified"] == pytest.approx(CERTIFIED, rel=1e-9)


def test_a_loss_normalised_over_the_batch_is_uncertified_naming_where_rows_mix():
    record = trial("rows-batch-softmax")
    assert record["status"] == "finished", record.get("traceback")
    privacy = record["privacy"]
    assert privacy["claim_status"] == "uncertified"
    before, during = [r for r in privacy["integrity_failed"] if r.startswith("row_independence")]
    assert before.startswith("row_independence: before training, changing one example of a batch of 64")
    assert during.startswith("row_independence: at step ")  # the training probe (one step of the 44) sees it too
    assert all("the model's own forward (BatchSoftmax.forward" in r for r in (before, during))
    assert privacy["integrity_checks"]["row_independence"] is False
