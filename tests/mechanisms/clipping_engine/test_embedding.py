"""`nn.Embedding` alone against the definition, with ids repeated within an example (their gradients add up in
one row) and a `padding_idx` (no gradient), and the configurations it refuses."""

from __future__ import annotations

import pytest
import torch
from bk_reference import MeanOverPositions, assert_close, bookkeeping, one_at_a_time
from torch import nn

from mechanisms.clipping_engine import BookkeepingEngine, UnsupportedModule


@pytest.mark.parametrize("padding_idx", [None, 0])
def test_embedding_matches_the_definition(padding_idx):
    torch.manual_seed(0)
    model = MeanOverPositions(nn.Embedding(6, 3, padding_idx=padding_idx))
    ids = torch.randint(0, 6, (10, 8))  # 8 ids among 6 rows: every example repeats some
    y = torch.randint(0, 3, (10,))
    expected = one_at_a_time(model, (ids,), y, 0.3)
    assert_close(expected, bookkeeping(model, (ids,), y, 0.3))
    if padding_idx is not None:
        assert not expected[1][0][padding_idx].any()  # the reference itself leaves the padding row untouched


@pytest.mark.parametrize(("layer", "reason"), [(nn.Embedding(5, 2, max_norm=1.0), "max_norm"),
                                               (nn.Embedding(5, 2, scale_grad_by_freq=True), "scale_grad_by_freq"),
                                               (nn.Embedding(5, 2, sparse=True), "sparse")])
def test_unsupported_configurations_are_refused(layer, reason):
    with pytest.raises(UnsupportedModule, match=reason):
        BookkeepingEngine(layer, 1.0)
