"""Hugging Face's `Conv1D` (GPT-2's projections, the weight stored transposed) alone against the definition."""

from __future__ import annotations

import pytest
import torch
from bk_reference import MeanOverPositions, assert_close, bookkeeping, one_at_a_time


@pytest.mark.parametrize("norm_mode", ["ghost", "instantiate"])
def test_conv1d_matches_the_definition(norm_mode):
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    model = MeanOverPositions(Conv1D(3, 6))  # 6 features in, 3 out
    x, y = torch.randn(10, 5, 6), torch.randint(0, 3, (10,))
    assert_close(one_at_a_time(model, (x,), y, [0.2, 0.1]), bookkeeping(model, (x,), y, [0.2, 0.1], norm_mode))
