"""Small classifiers built from scratch for images and feature vectors; all Opacus-compatible (no BatchNorm)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from workers.datasets.contract import PublicSplits, Split
from workers.models.contract import ModelBundle, Statistic

# book-keeping clipping (mechanisms/clipping_engine): measured faster than Opacus' modes (docs/clipping.md)
GRAD_SAMPLE_MODE = "bk"


def _array_tensors(split: Split) -> tuple[torch.Tensor, ...]:
    return (torch.from_numpy(split.inputs),)


def _bundle(module: nn.Module) -> ModelBundle:
    return ModelBundle(module, _array_tensors, {"grad_sample_mode": GRAD_SAMPLE_MODE})


Prior = Literal["none", "private"]
PRIOR_BOUND = 1.0  # each example's one-hot row: norm 1, so one example moves the histogram by at most 1


def label_prior(head: nn.Linear, classes: int, noise_multiplier: float) -> Statistic:
    """A prior on the classes from the training set's label histogram, released privately before training
    (each example's one-hot label clipped to PRIOR_BOUND, Gaussian noise of `noise_multiplier` times it, the release
    composed into the plan like any `Statistic`): the head's bias starts at the log of the noised class shares
    (a count the noise drove below 1 counts as 1), so the model starts at the prior instead of a uniform guess."""
    from mechanisms.parts.releases import DatasetStatistic  # lazy: keeps grid validation light

    def one_hot(xs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return nn.functional.one_hot(xs[-1].long(), classes).double()[:, None, :]

    def receive(sums: torch.Tensor, n: int) -> None:
        counts = sums[0].clamp(min=1.0)
        with torch.no_grad():
            head.bias.copy_(torch.log(counts / counts.sum()).to(head.bias.dtype))

    return Statistic(DatasetStatistic("label_counts", (PRIOR_BOUND,), noise_multiplier), one_hot, receive,
                     labels=True)


def _with_prior(module: nn.Sequential, classes: int, prior: Prior, noise_multiplier: float) -> ModelBundle:
    bundle = _bundle(module)
    if prior == "private":
        bundle.statistics = (label_prior(module[-1], classes, noise_multiplier),)
    return bundle


def mlp(splits: PublicSplits, hidden: int = 128, label_prior: Prior = "none",
        prior_noise_multiplier: float = 10.0) -> ModelBundle:
    """`label_prior: private`: the head's bias starts at a privately released class prior (`label_prior`)."""
    n_in = math.prod(splits.input_shape)
    module = nn.Sequential(nn.Flatten(), nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, splits.num_classes))
    return _with_prior(module, splits.num_classes, label_prior, prior_noise_multiplier)


def linear(splits: PublicSplits, label_prior: Prior = "none", prior_noise_multiplier: float = 10.0) -> ModelBundle:
    """Multinomial logistic regression on the flattened input: the classic DP baseline for tabular data
    (`label_prior` as for `mlp`)."""
    module = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(splits.input_shape), splits.num_classes))
    return _with_prior(module, splits.num_classes, label_prior, prior_noise_multiplier)


def cnn_small(splits: PublicSplits, channels: int = 16) -> ModelBundle:
    c, h, w = splits.input_shape
    module = nn.Sequential(
        nn.Conv2d(c, channels, 5, stride=2, padding=2), nn.Tanh(),
        nn.Conv2d(channels, 2 * channels, 3, stride=2, padding=1), nn.Tanh(),
        nn.Flatten(),
        nn.Linear(2 * channels * math.ceil(h / 4) * math.ceil(w / 4), splits.num_classes),
    )
    return _bundle(module)


def flat_size(features: nn.Module, shape: tuple[int, ...]) -> int:
    """How many values `features` makes of one input of `shape` (one dry forward, no gradient)."""
    with torch.no_grad():
        return features(torch.zeros(1, *shape)).numel()


def cnn_tanh(splits: PublicSplits) -> ModelBundle:
    """Tramèr & Boneh (ICLR 2021)'s end-to-end CNN for MNIST and Fashion-MNIST, layer for layer as in their
    code (after Papernot et al.'s tempered-sigmoid CNN): conv 16 8x8 stride 2 padding 2, tanh, max-pool 2
    stride 1, conv 32 4x4 stride 2, tanh, max-pool 2 stride 1, linear 32, tanh, linear. 26,010 parameters
    on 28x28 inputs with 10 classes."""
    c = splits.input_shape[0]
    features = nn.Sequential(
        nn.Conv2d(c, 16, 8, stride=2, padding=2), nn.Tanh(), nn.MaxPool2d(2, stride=1),
        nn.Conv2d(16, 32, 4, stride=2), nn.Tanh(), nn.MaxPool2d(2, stride=1),
        nn.Flatten(),
    )
    hidden = 32
    return _bundle(nn.Sequential(*features, nn.Linear(flat_size(features, splits.input_shape), hidden), nn.Tanh(),
                                 nn.Linear(hidden, splits.num_classes)))
