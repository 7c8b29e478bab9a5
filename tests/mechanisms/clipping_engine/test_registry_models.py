"""The engine against Opacus' hooks on every model of the registry: per-sample norms and clipped sums
within 1e-5 relative, at batch sizes 1 and 64, all parameters trainable and with frozen layers, on padded
text batches, on tabular feature vectors and on cached scattering features; flat and per-layer clipping.
Models are built with dropout off so both see one function."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bk_reference import assert_close, bookkeeping, no_dropout, one_at_a_time, opacus_hooks

from workers import datasets, models

# (model, dataset, model options, Opacus chunk): a 30k-token embedding costs V d floats per example in hooks
CASES = {
    "mlp": ("mlp", "digits", {"hidden": 32}, 64),
    "cnn-small": ("cnn-small", "digits", {}, 64),
    "vit-tiny": ("vit-tiny", "digits", {}, 64),
    "vit-tiny-top-2": ("vit-tiny", "digits", {"trainable": "top-2"}, 64),
    "bert-tiny": ("bert-tiny", "synthetic-text", {"max_length": 32}, 16),
    "bert-tiny-top-1": ("bert-tiny", "synthetic-text", {"max_length": 32, "trainable": "top-1"}, 64),
    "gpt2-tiny": ("gpt2-tiny", "synthetic-text", {"max_length": 32}, 16),
    "gpt2-tiny-head": ("gpt2-tiny", "synthetic-text", {"max_length": 32, "trainable": "head"}, 64),
    "minilm-top-2": ("minilm", "synthetic-text", {"max_length": 32, "trainable": "top-2"}, 64),
    "minilm-all": ("minilm", "synthetic-text", {"max_length": 32, "trainable": "all"}, 4),
    "cnn-tanh": ("cnn-tanh", "synthetic", {}, 64),
    "scatternet-linear": ("scatternet-linear", "synthetic", {}, 64),
    "scatternet-cnn": ("scatternet-cnn", "synthetic", {}, 64),
    "linear-tabular": ("linear", "breast-cancer", {}, 64),
    "mlp-tabular": ("mlp", "breast-cancer", {"hidden": 32}, 64),
}
DATASET_OPTIONS = {"synthetic-text": {"n_train": 96, "n_test": 8, "num_classes": 3},
                   "synthetic": {"side": 28, "n_train": 96, "n_test": 8, "num_classes": 10}}
SLOW = {("minilm-all", 64), ("minilm-top-2", 64)}


@pytest.fixture(autouse=True)
def feature_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVBENCH_CACHE_DIR", str(tmp_path))  # the scatternet models' scattering features


def _splits(name: str):
    return datasets.load(name, DATASET_OPTIONS.get(name))


def _case(case: str, batch: int):
    model, dataset, options, chunk = CASES[case]
    splits = _splits(dataset)
    torch.manual_seed(0)
    bundle = models.build(model, splits, options)
    no_dropout(bundle.module).train()
    idx = np.arange(batch)
    part = splits.train.subset(idx)
    inputs = bundle.encode(part)
    return bundle.module, inputs, torch.from_numpy(part.labels[: batch]).long(), chunk


PARAMS = [pytest.param(c, b, marks=pytest.mark.slow) if (c, b) in SLOW else (c, b)
          for c in CASES for b in (1, 64)]


@pytest.mark.parametrize(("case", "batch"), PARAMS)
def test_matches_opacus_hooks(case, batch):
    module, inputs, y, chunk = _case(case, batch)
    bound = 0.5  # below most per-sample norms, so clipping is active
    expected = opacus_hooks(module, inputs, y, bound, chunk=chunk)
    got = bookkeeping(module, inputs, y, bound)
    assert_close(expected, got)
    assert (expected[0] > bound).any()  # the clip really cut something


@pytest.mark.parametrize("case", ["cnn-small", "vit-tiny-top-2", "bert-tiny-top-1", "gpt2-tiny-head", "cnn-tanh",
                                  "scatternet-cnn"])
def test_per_layer_clipping_matches_opacus_hooks(case):
    module, inputs, y, chunk = _case(case, 16)
    n = sum(1 for p in module.parameters() if p.requires_grad)
    bounds = [0.05 * (1 + i % 3) for i in range(n)]
    assert_close(opacus_hooks(module, inputs, y, bounds, chunk=chunk), bookkeeping(module, inputs, y, bounds))


@pytest.mark.parametrize("case", ["bert-tiny", "gpt2-tiny", "minilm-top-2"])
def test_padding_changes_nothing(case):
    """An example's per-sample norm is the same alone (no padding) and in a batch padded to a longer one."""
    module, inputs, y, _ = _case(case, 8)
    ids, mask = inputs
    lengths = mask.sum(1)
    padded = (lengths < lengths.max()).nonzero().flatten().tolist()
    assert padded  # the batch is padded
    norms, _, _ = bookkeeping(module, inputs, y, 1e6)
    for i in padded[:3]:
        alone, _, _ = bookkeeping(module, (ids[i:i + 1, : lengths[i]], mask[i:i + 1, : lengths[i]]), y[i:i + 1], 1e6)
        assert alone[0].item() == pytest.approx(norms[i].item(), rel=1e-4)


@pytest.mark.parametrize("case", ["mlp", "vit-tiny-top-2", "gpt2-tiny-head"])
def test_matches_one_example_at_a_time(case):
    module, inputs, y, _ = _case(case, 8)
    assert_close(one_at_a_time(module, inputs, y, 0.5), bookkeeping(module, inputs, y, 0.5))
