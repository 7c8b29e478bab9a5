"""The setting the DP-Forward tests share (`test_dp_forward.py`, `test_forward_noise.py`, `test_label_rr.py`,
conftest.py's tiny BERT): delta, a privacy spec builder and a tiny BERT configuration."""

from __future__ import annotations

import math

from transformers import BertConfig

from mechanisms import PrivacySpec

DELTA = 1e-5
LN9 = math.log(9)  # the default label budget: keep a binary label with probability 0.9


def spec(epsilon: float | None = 8.0, *, n: int = 512, epochs: int = 3, sigma: float | None = None,
         calibration: str = "claimed", clip: float = 1.0, batch_size: int = 32, **options) -> PrivacySpec:
    return PrivacySpec(epsilon=epsilon, delta=DELTA, dataset_size=n, batch_size=batch_size, epochs=epochs, clip=clip,
                       sigma=sigma, calibration=calibration, options=options)


def tiny_config(**kw) -> BertConfig:
    return BertConfig(**{"vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                         "intermediate_size": 32, "max_position_embeddings": 32, "num_labels": 2} | kw)
