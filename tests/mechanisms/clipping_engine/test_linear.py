"""`nn.Linear` alone, with and without positions and bias, in each norm mode and with flat and per-layer bounds,
against the definition (each example's gradient from its own backward pass)."""

from __future__ import annotations

import pytest
import torch
from bk_reference import MeanOverPositions, assert_close, bookkeeping, one_at_a_time
from torch import nn


def _model(positions: bool, bias: bool) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layer = nn.Linear(6, 3, bias=bias)
    if positions:
        return MeanOverPositions(layer), torch.randn(10, 7, 6)
    return layer, torch.randn(10, 6)


@pytest.mark.parametrize("norm_mode", ["ghost", "instantiate"])
@pytest.mark.parametrize("positions", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_the_definition(norm_mode, positions, bias):
    model, x = _model(positions, bias)
    y = torch.randint(0, 3, (10,))
    bounds = [0.2, 0.1] if bias else 0.3
    assert_close(one_at_a_time(model, (x,), y, bounds), bookkeeping(model, (x,), y, bounds, norm_mode))
