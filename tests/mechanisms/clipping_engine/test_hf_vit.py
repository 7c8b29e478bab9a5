"""Hugging Face's `ViTEmbeddings` (the [CLS] token and position embeddings, broadcast over the batch, and the
patch projection) against the definition, and the trainable mask token it refuses."""

from __future__ import annotations

import pytest
import torch
from bk_reference import MeanOverPositions, assert_close, bookkeeping, frozen_head, one_at_a_time
from torch import nn

from mechanisms.clipping_engine import BookkeepingEngine, UnsupportedModule


def _embeddings(mask_token: bool = False) -> nn.Module:
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTEmbeddings

    config = ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=6, hidden_dropout_prob=0.0)
    return ViTEmbeddings(config, use_mask_token=mask_token)


def test_vit_embeddings_match_the_definition():
    torch.manual_seed(0)
    embeddings = _embeddings()
    with torch.no_grad():  # non-zero, so that the [CLS] token and positions reach the output distinctly
        embeddings.cls_token.normal_()
        embeddings.position_embeddings.normal_()
    model = MeanOverPositions(nn.Sequential(embeddings, nn.Tanh(), frozen_head(6)))
    x, y = torch.randn(10, 1, 8, 8), torch.randint(0, 3, (10,))
    bounds = [0.1, 0.2, 0.3, 0.4]  # cls_token, position_embeddings, projection weight and bias
    assert_close(one_at_a_time(model, (x,), y, bounds), bookkeeping(model, (x,), y, bounds))


def test_trainable_mask_token_is_refused():
    with pytest.raises(UnsupportedModule, match="mask_token"):
        BookkeepingEngine(_embeddings(mask_token=True), 1.0)
