"""mechanisms/catalog/dp_forward/forward_noise.py: the noise layer on real Hugging Face models. The hook reaches
the intended sub-layer (checked against an independent eval-mode BERT layer computed from the weights), drops the
residual after MHA and FFN, is the plain model at zero noise, noises the head input of a mean-pooling adapter,
adds the planned noise at inference, and bounds each example's norm."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from transformers import BertModel

from mechanisms.accounting.analytic_gaussian import amgm_sigma
from mechanisms.catalog import dp_forward
from mechanisms.catalog.dp_forward.forward_noise import bound_norm, install, parse_position
from tests.mechanisms.catalog.dp_forward.dp_forward_setting import DELTA, spec, tiny_config
from workers.models.transformers import TextClassifier


def manual_layer(layer: nn.Module, h: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """An independent eval-mode BERT layer: the tensor at every sub-position (from the weights alone)."""
    sa = layer.attention.self
    b, n, d = h.shape
    heads, hd = sa.num_attention_heads, sa.attention_head_size

    def split(x: torch.Tensor) -> torch.Tensor:
        return x.view(b, n, heads, hd).transpose(1, 2)

    scores = split(sa.query(h)) @ split(sa.key(h)).transpose(-1, -2) / math.sqrt(hd)
    scores = scores + (1 - mask[:, None, None, :].float()) * torch.finfo(h.dtype).min
    ctx = (scores.softmax(-1) @ split(sa.value(h))).transpose(1, 2).reshape(b, n, d)
    mha = layer.attention.output.dense(ctx)
    add_norm_1 = layer.attention.output.LayerNorm(mha + h)
    ffn = layer.output.dense(layer.intermediate(add_norm_1))
    return {"mha": mha, "add-norm-1": add_norm_1, "ffn": ffn, "add-norm-2": layer.output.LayerNorm(ffn + add_norm_1)}


def observe(model: nn.Module, position: str, ids: torch.Tensor, mask: torch.Tensor, **kw) -> tuple[list, torch.Tensor]:
    seen: list[torch.Tensor] = []
    kw = {"sigma": 0.0, "clip": 1e9, "normalization": "clip"} | kw
    noise = install(model, position, observer=lambda bounded, released: seen.append(released), **kw)
    logits = model(input_ids=ids, attention_mask=mask).logits
    noise.remove()
    return seen, logits


@pytest.mark.parametrize("position", ["embedding", "encoder-1-mha", "encoder-1-add-norm-1", "encoder-1-ffn",
                                      "encoder-1", "encoder-2-mha", "encoder-2-ffn", "last-encoder", "pooled"])
def test_hook_reaches_the_intended_sublayer(bert, batch, position):
    """Shapes and values: with zero noise and no bound the hooked tensor is the reference tensor."""
    ids, mask = batch
    ref = bert(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    seen, _ = observe(bert, position, ids, mask)
    assert len(seen) == 1
    pos = parse_position(position).resolve(2)
    if pos.kind == "embedding":
        expected = ref.hidden_states[0]
    elif pos.kind == "pooled":
        expected = bert.bert.pooler(ref.hidden_states[-1])
    else:
        expected = manual_layer(bert.bert.encoder.layer[pos.layer - 1], ref.hidden_states[pos.layer - 1],
                                mask)[pos.sublayer]
    assert seen[0].shape == ((4, 16) if pos.kind == "pooled" else (4, 9, 16))
    torch.testing.assert_close(seen[0], expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("position", ["embedding", "encoder-1-add-norm-1", "encoder-2", "pooled"])
def test_zero_noise_unbounded_is_the_plain_model(bert, batch, position):
    ids, mask = batch
    plain = bert(input_ids=ids, attention_mask=mask).logits
    _, hooked = observe(bert, position, ids, mask)
    torch.testing.assert_close(hooked, plain, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(bert(input_ids=ids, attention_mask=mask).logits, plain)  # removed cleanly


@pytest.mark.parametrize("sub", ["mha", "ffn"])
def test_residual_is_dropped_after_mha_and_ffn(bert, batch, sub):
    """The post-noise Add&Norm sees only the noisy tensor, never the clean input X."""
    ids, mask = batch
    ref = bert(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    layer = bert.bert.encoder.layer[0]
    expected = manual_layer(layer, ref.hidden_states[0], mask)
    add_norm = layer.attention.output if sub == "mha" else layer.output
    got: list[torch.Tensor] = []
    handle = add_norm.register_forward_hook(lambda m, a, out: got.append(out))
    observe(bert, f"encoder-1-{sub}", ids, mask)
    handle.remove()
    norm = add_norm.LayerNorm
    torch.testing.assert_close(got[0], norm(expected[sub]), atol=2e-5, rtol=1e-4)
    assert not torch.allclose(got[0], expected["add-norm-1" if sub == "mha" else "add-norm-2"], atol=1e-3)


def test_normalised_zero_noise_equals_manual_pipeline(bert, batch):
    """Encoder-2 output normalised to C per example, then pooler and classifier: the hooked logits."""
    ids, mask = batch
    ref = bert(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    h = ref.hidden_states[2]
    normed = h * (0.7 / h.reshape(4, -1).norm(dim=1)).view(4, 1, 1)
    expected = bert.classifier(bert.bert.pooler(normed))
    _, hooked = observe(bert, "encoder-2", ids, mask, clip=0.7, normalization="normalize")
    torch.testing.assert_close(hooked, expected, atol=2e-5, rtol=1e-4)


def test_mean_pooling_adapter_noises_the_head_input(batch):
    """MiniLM-style TextClassifier (mean pooling, no BertPooler): `pooled` is the head's input vector."""
    torch.manual_seed(0)
    model = TextClassifier(BertModel(tiny_config(), add_pooling_layer=False), num_classes=2, pooling="mean").eval()
    ids, mask = batch
    seen: list[torch.Tensor] = []
    noise = install(model, "pooled", sigma=0.0, clip=1e9, normalization="clip",
                    observer=lambda b, r: seen.append(r))
    model(ids, mask)
    noise.remove()
    length = int(mask.sum(1).max())
    hidden = model.model(input_ids=ids[:, :length], attention_mask=mask[:, :length]).last_hidden_state
    m = mask[:, :length, None].float()
    torch.testing.assert_close(seen[0], (hidden * m).sum(1) / m.sum(1), atol=2e-5, rtol=1e-4)


def test_noise_is_present_at_inference_with_the_planned_std(bert, batch):
    ids, mask = batch
    p = dp_forward.mechanism.plan(spec(8.0, accounting="local", local_composition="per-release", epsilon_labels=None,
                             clip=0.5))
    assert p.sigma == pytest.approx(amgm_sigma(8.0, DELTA, 2.0))
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    noise = install(bert, "encoder-2", sigma=p.sigma, clip=0.5, seed=3, observer=lambda b, r: pairs.append((b, r)))
    bert.eval()
    with torch.no_grad():
        first, second = bert(input_ids=ids, attention_mask=mask).logits, bert(input_ids=ids, attention_mask=mask).logits
        for _ in range(10):
            bert(input_ids=ids, attention_mask=mask)
    assert not torch.allclose(first, second)
    bounded = torch.cat([b for b, _ in pairs])
    residual = torch.cat([r - b for b, r in pairs])
    torch.testing.assert_close(bounded.reshape(bounded.shape[0], -1).norm(dim=1),
                               torch.full((bounded.shape[0],), 0.5), atol=1e-5, rtol=1e-5)
    assert residual.std().item() == pytest.approx(p.sigma * 0.5, rel=0.03)
    assert abs(residual.mean().item()) < 0.02 * p.sigma
    noise.remove()
    off = install(bert, "encoder-2", sigma=p.sigma, clip=0.5, inference_noise=False)
    with torch.no_grad():
        assert torch.equal(bert(input_ids=ids, attention_mask=mask).logits,
                           bert(input_ids=ids, attention_mask=mask).logits)
        bert.train()
        assert not torch.equal(bert(input_ids=ids, attention_mask=mask).logits,
                               bert(input_ids=ids, attention_mask=mask).logits)
    off.remove()


def test_bound_norm_modes():
    h = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    torch.testing.assert_close(bound_norm(h, 1.0, "normalize"), torch.tensor([[0.6, 0.8], [0.6, 0.8], [0.0, 0.0]]))
    torch.testing.assert_close(bound_norm(h, 1.0, "clip"), torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]]))
