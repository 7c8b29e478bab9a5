"""A linear classifier on flattened images (torch is imported only when it is built)."""

from __future__ import annotations

from workers.models import ModelBundle, model


@model("ext-linear", ("image",), "a linear layer on the flattened image (multinomial logistic regression)")
def linear(splits, bias: bool = True) -> ModelBundle:
    import math

    import torch
    from torch import nn

    module = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(splits.input_shape), splits.num_classes, bias=bias))
    return ModelBundle(module, lambda split: (torch.from_numpy(split.inputs),))
