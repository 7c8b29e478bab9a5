"""`nn.LayerNorm`'s affine parameters alone against the definition, on vectors and on positions."""

from __future__ import annotations

import pytest
import torch
from bk_reference import MeanOverPositions, assert_close, bookkeeping, frozen_head, one_at_a_time
from torch import nn


@pytest.mark.parametrize("positions", [False, True])
def test_layernorm_matches_the_definition(positions):
    torch.manual_seed(0)
    norm = nn.LayerNorm(6)
    with torch.no_grad():  # away from the initial (1, 0), so that both parameters matter
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    model = nn.Sequential(norm, frozen_head(6))
    x = torch.randn(10, 5, 6) if positions else torch.randn(10, 6)
    if positions:
        model = MeanOverPositions(model)
    y = torch.randint(0, 3, (10,))
    assert_close(one_at_a_time(model, (x,), y, 0.3), bookkeeping(model, (x,), y, 0.3))
