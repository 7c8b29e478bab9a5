"""mechanisms/catalog/shuffled_dpsgd/permutation_hf.py: where the permutation-invariant weights live in Hugging
Face blocks. `find_blocks` finds them through Opacus and skips frozen blocks, and reads each projection's axis
from the module (GPT-2's Conv1D stores [in, out], nn.Linear [out, in])."""

from __future__ import annotations

import pytest
from torch import nn

from mechanisms.catalog.shuffled_dpsgd.permutation_hf import find_blocks, fused_attention_mlp_layout
from tests.mechanisms.catalog.shuffled_dpsgd.tiny_transformers import tiny


def test_blocks_are_found_through_opacus_and_frozen_blocks_are_skipped():
    from opacus import GradSampleModule

    model, _ = tiny("bert")
    for p in model.bert.encoder.layer[0].parameters():
        p.requires_grad_(False)
    assert [layout.name for layout in find_blocks(model)] == ["bert.encoder.layer.1"]
    assert len(find_blocks(model, trainable_only=False)) == 2
    wrapped = GradSampleModule(model)
    inner = find_blocks(wrapped)
    assert len(inner) == 1 and inner[0].targets[0].tensor is model.bert.encoder.layer[1].attention.self.query.weight
    assert find_blocks(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))) == []


@pytest.mark.parametrize(("kind", "out_axis"), [("gpt2", 1), ("gpt2-linear", 0)])
def test_gpt2_projection_axes_are_read_from_each_module(kind, out_axis):
    """The fused [Q | K | V] projection is permuted along its output axis (3 x 32 wide), c_proj along its input
    axis, whichever way the weight is stored; a projection of another type is refused."""
    model, _ = tiny(kind)
    attn = model.transformer.h[0].attn
    targets = {t.name: t for t in find_blocks(model)[0].targets}
    assert targets["qkv.weight"].tensor is attn.c_attn.weight and targets["qkv.weight"].axis == out_axis
    assert attn.c_attn.weight.shape[out_axis] == 3 * 32 and attn.c_attn.weight.shape[1 - out_axis] == 32
    assert targets["o.weight"].tensor is attn.c_proj.weight and targets["o.weight"].axis == 1 - out_axis
    assert targets["qkv.bias"].axis == 0 and "o.bias" not in targets  # an input permutation leaves the bias
    with pytest.raises(TypeError, match="unsupported projection Identity"):
        fused_attention_mlp_layout("b", 4, 8, nn.Identity(), attn.c_proj, attn.c_proj, attn.c_proj)
