"""Tiny Hugging Face transformers for the permutation tests (`test_permutation.py`, `test_permutation_hf.py`):
random 2-block, 4-head models of every layout privbench permutes, with weights spread wide enough that
"unchanged to 1e-5" and "every tensor moved" are demanding checks."""

from __future__ import annotations

import warnings

import torch
from torch import nn


def quiet() -> None:
    """Silence transformers' warnings about freshly initialised weights: the models are random on purpose."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    warnings.filterwarnings("ignore")


def _spread(model: nn.Module) -> nn.Module:
    """HF's init (std 0.02, zero biases) gives ~0.01 logits and constant biases; widen it so that
    "unchanged to 1e-5" and "every tensor moved" are demanding checks."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" not in name and "ln_" not in name and "layernorm" not in name:
                p.normal_(0.0, 0.15)
    return model


def tiny(kind: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Tiny HF models from configs (2 blocks, 4 heads): fast, random, every layout we support."""
    model, inputs = _tiny(kind)
    return _spread(model), inputs


def _tiny(kind: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    quiet()
    import transformers as tf

    torch.manual_seed(0)
    ids = torch.randint(1, 60, (3, 9))
    if kind in ("bert", "roberta"):
        config_cls, model_cls = ((tf.BertConfig, tf.BertForSequenceClassification) if kind == "bert"
                                 else (tf.RobertaConfig, tf.RobertaForSequenceClassification))
        model = model_cls(config_cls(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=32, pad_token_id=0))
        return model, {"input_ids": ids}
    if kind == "vit":
        model = tf.ViTForImageClassification(tf.ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=32,
                                                          num_hidden_layers=2, num_attention_heads=4,
                                                          intermediate_size=48))
        return model, {"pixel_values": torch.randn(3, 1, 8, 8)}
    model = tf.GPT2ForSequenceClassification(tf.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                                            n_positions=32, pad_token_id=0))
    if kind == "gpt2-linear":  # what privbench's model registry does to GPT-2
        from workers.models.transformers import conv1d_to_linear

        conv1d_to_linear(model)
    return model, {"input_ids": ids}

