"""Fixtures of the DP-Forward tests: a tiny random BERT classifier and a padded batch for it."""

from __future__ import annotations

import pytest
import torch
from transformers import BertForSequenceClassification

from tests.mechanisms.catalog.dp_forward.dp_forward_setting import tiny_config


@pytest.fixture
def bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(tiny_config()).eval()


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 60, (4, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    mask[2, 4:] = 0
    return ids, mask
