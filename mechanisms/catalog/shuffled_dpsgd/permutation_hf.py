"""Where the permutation-invariant weights live in Hugging Face BERT/RoBERTa, ViT and GPT-2 blocks.

`find_blocks(model)` walks any module tree (a bare HF model, a privbench adapter around one, or
Opacus' GradSampleModule around either) and returns one `BlockLayout` per block it recognises by
class name. The index form (arXiv 2407.15414) depends on the projection's
storage: `nn.Linear` keeps weight as [out, in], HF's GPT-2 `Conv1D` as [in, out]; privbench's model
registry swaps GPT-2's Conv1D for nn.Linear, so the axis is read from each module, never assumed.

Not permuted, as in the paper: embeddings, LayerNorms, the residual stream, pooler and heads
(a residual-stream permutation is valid but not the paper's mechanism).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from mechanisms.catalog.shuffled_dpsgd.permutation import BlockLayout, Target

Parts = tuple[tuple[str, int], ...]


def _axes(module: nn.Module) -> tuple[int, int]:
    """(output axis, input axis) of a projection's weight."""
    if isinstance(module, nn.Linear):
        return 0, 1
    if type(module).__name__ == "Conv1D":  # transformers.pytorch_utils.Conv1D: y = x W + b, W is [in, out]
        return 1, 0
    raise TypeError(f"unsupported projection {type(module).__name__}: expected nn.Linear or HF Conv1D")


def _outputs(module: nn.Module, parts: Parts, name: str) -> list[Target]:
    """The projection's outputs are permuted: weight along its output axis, and the bias."""
    out_axis, _ = _axes(module)
    targets = [Target(module.weight, out_axis, parts, f"{name}.weight")]
    if getattr(module, "bias", None) is not None:
        targets.append(Target(module.bias, 0, parts, f"{name}.bias"))
    return targets


def _inputs(module: nn.Module, parts: Parts, name: str) -> list[Target]:
    """The projection's inputs are permuted: weight along its input axis only (its bias is untouched)."""
    _, in_axis = _axes(module)
    return [Target(module.weight, in_axis, parts, f"{name}.weight")]


def _out_features(module: nn.Module) -> int:
    out_axis, _ = _axes(module)
    return int(module.weight.shape[out_axis])


def attention_mlp_layout(name: str, heads: int, head_dim: int, q: nn.Module, k: nn.Module, v: nn.Module,
                         o: nn.Module, fc1: nn.Module, fc2: nn.Module) -> BlockLayout:
    """Separate Q/K/V projections (BERT, RoBERTa, ViT): Thm 4 on attention, Thm 3 on the MLP."""
    targets = [*_outputs(q, (("qk", 0),), "q"), *_outputs(k, (("qk", 0),), "k"),
               *_outputs(v, (("v", 0),), "v"), *_inputs(o, (("v", 0),), "o"),
               *_outputs(fc1, (("mlp", 0),), "fc1"), *_inputs(fc2, (("mlp", 0),), "fc2")]
    return BlockLayout(name, heads, head_dim, _out_features(fc1), tuple(targets))


def fused_attention_mlp_layout(name: str, heads: int, head_dim: int, qkv: nn.Module, o: nn.Module,
                               fc1: nn.Module, fc2: nn.Module) -> BlockLayout:
    """One fused projection whose outputs are [Q | K | V] (GPT-2's c_attn)."""
    width = heads * head_dim
    targets = [*_outputs(qkv, (("qk", 0), ("qk", width), ("v", 2 * width)), "qkv"),
               *_inputs(o, (("v", 0),), "o"), *_outputs(fc1, (("mlp", 0),), "fc1"),
               *_inputs(fc2, (("mlp", 0),), "fc2")]
    return BlockLayout(name, heads, head_dim, _out_features(fc1), tuple(targets))


def bert_layout(name: str, layer: nn.Module) -> BlockLayout:
    attn = layer.attention.self
    return attention_mlp_layout(name, attn.num_attention_heads, attn.attention_head_size, attn.query, attn.key,
                                attn.value, layer.attention.output.dense, layer.intermediate.dense,
                                layer.output.dense)


def vit_layout(name: str, layer: nn.Module) -> BlockLayout:
    attn = layer.attention
    if hasattr(attn, "q_proj"):  # transformers >= 5
        return attention_mlp_layout(name, attn.num_attention_heads, attn.head_dim, attn.q_proj, attn.k_proj,
                                    attn.v_proj, attn.o_proj, layer.mlp.fc1, layer.mlp.fc2)
    inner = attn.attention  # transformers 4.x naming
    return attention_mlp_layout(name, inner.num_attention_heads, inner.attention_head_size, inner.query,
                                inner.key, inner.value, attn.output.dense, layer.intermediate.dense,
                                layer.output.dense)


def gpt2_layout(name: str, block: nn.Module) -> BlockLayout:
    attn = block.attn
    return fused_attention_mlp_layout(name, attn.num_heads, attn.head_dim, attn.c_attn, attn.c_proj,
                                      block.mlp.c_fc, block.mlp.c_proj)


LAYOUTS: dict[str, Callable[[str, nn.Module], BlockLayout]] = {
    "BertLayer": bert_layout,
    "RobertaLayer": bert_layout,
    "ViTLayer": vit_layout,
    "GPT2Block": gpt2_layout,
}


def find_blocks(model: nn.Module, *, trainable_only: bool = True) -> list[BlockLayout]:
    """One layout per recognised block, in module order.

    `trainable_only` skips blocks none of whose parameters is trained: their weights never depend
    on the data, so permuting them costs time and changes nothing the analysis talks about.
    """
    layouts = []
    for name, module in model.named_modules():
        build = LAYOUTS.get(type(module).__name__)
        if build is None:
            continue
        if trainable_only and not any(p.requires_grad for p in module.parameters()):
            continue
        layouts.append(build(name, module))
    return layouts
