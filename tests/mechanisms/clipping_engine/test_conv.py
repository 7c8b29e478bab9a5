"""`nn.Conv2d` alone (stride, padding, dilation, bias) in each norm mode against the definition, and the
configurations it refuses."""

from __future__ import annotations

import pytest
import torch
from bk_reference import assert_close, bookkeeping, frozen_head, one_at_a_time
from torch import nn

from mechanisms.clipping_engine import BookkeepingEngine, UnsupportedModule


@pytest.mark.parametrize("norm_mode", ["ghost", "instantiate"])
@pytest.mark.parametrize("conv", [dict(stride=2, padding=1), dict(dilation=2, bias=False)], ids=["strided", "dilated"])
def test_conv2d_matches_the_definition(norm_mode, conv):
    torch.manual_seed(0)
    layer = nn.Conv2d(2, 3, 3, **conv)
    features = layer(torch.zeros(1, 2, 9, 9)).numel()
    model = nn.Sequential(layer, nn.Flatten(), frozen_head(features))
    x, y = torch.randn(10, 2, 9, 9), torch.randint(0, 3, (10,))
    assert_close(one_at_a_time(model, (x,), y, 0.3), bookkeeping(model, (x,), y, 0.3, norm_mode))


@pytest.mark.parametrize(("layer", "reason"), [(nn.Conv2d(4, 4, 3, groups=2), "groups"),
                                               (nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect"), "padding_mode"),
                                               (nn.Conv2d(2, 2, 3, padding="same"), "explicit padding")])
def test_unsupported_configurations_are_refused(layer, reason):
    with pytest.raises(UnsupportedModule, match=reason):
        BookkeepingEngine(layer, 1.0)
