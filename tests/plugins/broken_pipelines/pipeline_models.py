"""Models that leak around the mechanism, and correct ones beside them, written from docs/plugins.md as a
researcher's plugin would be (`plugins:` in a grid). privbench must never call a trial of a leaking one `ok`
(tests/mechanisms/test_broken_pipelines.py; the table in docs/auditing.md).

- bn-mlp: BatchNorm1d(affine=False) on the input, in train mode: rows mix, running statistics of the private rows
  (layer that mixes examples; model state).
- batch-softmax-mlp: log_softmax over the batch (dim 0): one example changes every row's loss (batch-coupled loss).
- mean-centre-mlp: a layer without parameters that subtracts the batch mean (layer that mixes examples).
- train-stats-mlp: the builder standardises with the training split's mean and std, kept as buffers (constant
  computed from the training set).
- data-init-mlp: the first layer's weights start as the class means of the training images (data-dependent
  initialisation).
- layernorm-mlp, groupnorm-cnn: correct: per-example normalisation.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from workers.models import model
from workers.models.contract import ModelBundle


def _bundle(module: nn.Module) -> ModelBundle:
    return ModelBundle(module, lambda split: (torch.from_numpy(split.inputs),), {})


def _mlp(n_in: int, classes: int, *head: nn.Module, hidden: int = 128) -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), *head, nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, classes))


class BatchLogSoftmax(nn.Module):
    """The loss normalised over the batch: log-probabilities taken across examples, not classes."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(z, dim=0)


class MeanCentre(nn.Module):
    """A layer without parameters that subtracts the batch's mean: every row moves with every other row."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(0, keepdim=True)


class Standardise(nn.Module):
    """Standardises with a mean and std held as buffers."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


@model("bn-mlp", ("image", "tabular"), "mlp behind BatchNorm1d(affine=False) on the input (mixes rows)")
def bn_mlp(splits):
    n = math.prod(splits.input_shape)
    return _bundle(_mlp(n, splits.num_classes, nn.BatchNorm1d(n, affine=False)))


@model("batch-softmax-mlp", ("image", "tabular"), "mlp whose log-softmax runs over the batch (dim 0)")
def batch_softmax_mlp(splits):
    net = _mlp(math.prod(splits.input_shape), splits.num_classes)
    return _bundle(nn.Sequential(*net, BatchLogSoftmax()))


@model("mean-centre-mlp", ("image", "tabular"), "mlp behind a parameter-free layer that subtracts the batch mean")
def mean_centre_mlp(splits):
    return _bundle(_mlp(math.prod(splits.input_shape), splits.num_classes, MeanCentre()))


@model("train-stats-mlp", ("image", "tabular"), "mlp standardised with the training split's mean and std (buffers)")
def train_stats_mlp(splits):
    x = torch.from_numpy(splits.train.inputs).flatten(1)
    n = x.shape[1]
    return _bundle(_mlp(n, splits.num_classes, Standardise(x.mean(0), x.std(0) + 1e-3)))


@model("data-init-mlp", ("image", "tabular"), "linear model whose weights start as the training set's class means")
def data_init_mlp(splits):
    x = torch.from_numpy(splits.train.inputs).flatten(1)
    y = torch.from_numpy(splits.train.labels)
    layer = nn.Linear(x.shape[1], splits.num_classes)
    with torch.no_grad():
        for c in range(splits.num_classes):
            layer.weight[c] = x[y == c].mean(0)
    return _bundle(nn.Sequential(nn.Flatten(), layer))


@model("layernorm-mlp", ("image", "tabular"), "mlp with LayerNorm on its hidden layer (correct: per example)")
def layernorm_mlp(splits, hidden: int = 128):
    n = math.prod(splits.input_shape)
    return _bundle(nn.Sequential(nn.Flatten(), nn.Linear(n, hidden), nn.LayerNorm(hidden), nn.Tanh(),
                                 nn.Linear(hidden, splits.num_classes)))


@model("groupnorm-cnn", ("image",), "small CNN with GroupNorm (correct: per example)")
def groupnorm_cnn(splits, channels: int = 8):
    c, h, w = splits.input_shape
    return _bundle(nn.Sequential(nn.Conv2d(c, channels, 3, padding=1), nn.GroupNorm(2, channels), nn.Tanh(),
                                 nn.Flatten(), nn.Linear(channels * h * w, splits.num_classes)))
