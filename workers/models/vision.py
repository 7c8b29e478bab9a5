"""Small image classifiers built from scratch; both are Opacus-compatible (no BatchNorm)."""

from __future__ import annotations

import math

import torch
from torch import nn

from workers.datasets.base import Split, Splits
from workers.models.base import ModelBundle

# book-keeping clipping (mechanisms/bookkeeping): measured faster than Opacus' modes (docs/clipping.md)
GRAD_SAMPLE_MODE = "bk"


def _image_tensors(split: Split) -> tuple[torch.Tensor, ...]:
    return (torch.from_numpy(split.inputs),)


def mlp(splits: Splits, hidden: int = 128) -> ModelBundle:
    n_in = math.prod(splits.input_shape)
    module = nn.Sequential(nn.Flatten(), nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, splits.num_classes))
    return ModelBundle(module, _image_tensors, {"grad_sample_mode": GRAD_SAMPLE_MODE})


def cnn_small(splits: Splits, channels: int = 16) -> ModelBundle:
    c, h, w = splits.input_shape
    module = nn.Sequential(
        nn.Conv2d(c, channels, 5, stride=2, padding=2), nn.Tanh(),
        nn.Conv2d(channels, 2 * channels, 3, stride=2, padding=1), nn.Tanh(),
        nn.Flatten(),
        nn.Linear(2 * channels * math.ceil(h / 4) * math.ceil(w / 4), splits.num_classes),
    )
    return ModelBundle(module, _image_tensors, {"grad_sample_mode": GRAD_SAMPLE_MODE})
