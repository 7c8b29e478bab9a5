"""The transformer models offline: each registry entry builds and gives logits, MiniLM is the real
pretrained checkpoint, `trainable` freezes what it says, padding costs nothing and changes nothing,
Opacus' per-sample gradient norms (hooks and ghost) match a one-example-at-a-time reference, and
`hf:` loads local checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from mechanisms.framework.registry import UnknownName
from workers import datasets, models
from workers.datasets.contract import Split, Splits
from workers.models import tokenize
from workers.models.transformers import TextClassifier, conv1d_to_linear, set_trainable

TEXT_MODELS = ["minilm", "bert-tiny", "gpt2-tiny"]
IMAGE_DATASETS = ["digits", "mnist-5k", "synthetic"]
MINILM_LAYER = 1_774_464  # parameters of one MiniLM transformer layer (hidden 384, FFN 1536)


@pytest.fixture(scope="module")
def text() -> Splits:
    return datasets.load("synthetic-text", {"n_train": 64, "n_test": 16, "num_classes": 3})


@pytest.fixture(scope="module")
def images() -> dict[str, Splits]:
    return {name: datasets.load(name, {"n_train": 64, "n_test": 16} if name == "synthetic" else None)
            for name in IMAGE_DATASETS}


def batch(split: Split, n: int) -> Split:
    return split.subset(np.arange(n))


def test_registry_lists_every_model_with_its_kinds():
    rows = {name: kinds for name, kinds, _ in models.describe()}
    for name in TEXT_MODELS:
        assert rows[name] == "text"
    assert rows["vit-tiny"] == "image" and rows["hf:<name>"] == "text,image"


@pytest.mark.parametrize("name", TEXT_MODELS)
def test_text_model_builds_offline_and_gives_logits(text, name):
    torch.manual_seed(0)
    bundle = models.build(name, text)
    ids, mask = bundle.encode(batch(text.train, 5))
    assert ids.dtype == mask.dtype == torch.long and ids.shape == mask.shape and ids.shape[1] <= 64
    logits = bundle.module(ids, mask)
    assert logits.shape == (5, 3) and torch.isfinite(logits).all()
    info = bundle.info
    assert info["tokenizer"] is not None and info["grad_sample_mode"] == "bk"
    assert info["trainable_params"] == info["total_params"] > 1_000_000  # default: all trainable
    assert len(info["blocks"]) == info["num_layers"] == (6 if name == "minilm" else 2)


@pytest.mark.parametrize("dataset", IMAGE_DATASETS)
def test_vit_tiny_builds_on_image_datasets(images, dataset):
    torch.manual_seed(0)
    s = images[dataset]
    bundle = models.build("vit-tiny", s)
    (pixels,) = bundle.encode(batch(s.train, 4))
    logits = bundle.module(pixels)
    assert logits.shape == (4, s.num_classes) and torch.isfinite(logits).all()
    assert 300_000 < bundle.info["total_params"] < 1_000_000 and bundle.info["num_layers"] == 4
    assert bundle.info["grad_sample_mode"] == "bk" and bundle.info["fallback_grad_sample_mode"] == "hooks"


def test_kind_mismatch_is_refused(text, images):
    with pytest.raises(ValueError, match="takes image data"):
        models.build("vit-tiny", text)
    with pytest.raises(ValueError, match="takes text data"):
        models.build("bert-tiny", images["digits"])


def test_minilm_is_the_pretrained_sentence_encoder(text):
    bundle = models.build("minilm", text, {"trainable": "head"})
    assert bundle.info["total_params"] == 22_713_216 - (384 * 384 + 384) + (384 * 3 + 3)  # no pooler, new head
    backbone = bundle.module.model.eval()
    tok = bundle.info["tokenizer"]
    enc = tok(["A cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell sharply today."],
              padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = backbone(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    emb = nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)
    similar, unrelated = float(emb[0] @ emb[1]), float(emb[0] @ emb[2])
    assert similar > 0.5 and unrelated < 0.2, (similar, unrelated)  # random weights give neither


def test_trainable_head_top_k_all(text):
    head = models.build("minilm", text, {"trainable": "head"})
    assert head.info["trainable_params"] == 384 * 3 + 3
    top2 = models.build("minilm", text, {"trainable": "top-2"})
    assert top2.info["trainable_params"] == 384 * 3 + 3 + 2 * MINILM_LAYER
    module = top2.module
    assert not any(p.requires_grad for p in module.model.embeddings.parameters())
    assert not any(p.requires_grad for p in module.model.encoder.layer[3].parameters())
    assert all(p.requires_grad for p in module.model.encoder.layer[4].parameters())
    counts = set_trainable(module, "all")
    assert counts["trainable_params"] == counts["total_params"]
    for bad in ("top-7", "top", "bottom-2", "everything"):
        with pytest.raises(ValueError, match="trainable"):
            set_trainable(module, bad)
    gpt_head = models.build("gpt2-tiny", text, {"trainable": "head"}).module
    trainable = {n for n, p in gpt_head.named_parameters() if p.requires_grad}
    assert trainable == {"model.transformer.ln_f.weight", "model.transformer.ln_f.bias", "model.score.weight"}


def test_padding_is_trimmed_and_changes_nothing(text):
    torch.manual_seed(0)
    bundle = models.build("bert-tiny", text, {"dropout": 0.0})
    module = bundle.module.eval()
    tok = bundle.info["tokenizer"]
    sentences = ["good", "a much longer sentence with many more words than the first", "bad film"]
    padded = tok(sentences, padding="max_length", max_length=64, return_tensors="pt")
    with torch.enable_grad():  # the per-batch path
        together = module(padded["input_ids"], padded["attention_mask"])
    for i, s in enumerate(sentences):
        alone = tok([s], return_tensors="pt")
        with torch.enable_grad():
            single = module(alone["input_ids"], alone["attention_mask"])
        torch.testing.assert_close(single[0], together[i], rtol=1e-4, atol=1e-5)
    split = batch(text.train, 40)
    with torch.enable_grad():
        direct = module(*bundle.encode(split))
    module.eval_chunk = 8
    with torch.no_grad():  # evaluation: length-sorted chunks
        bucketed = module(*bundle.encode(split))
    torch.testing.assert_close(bucketed, direct, rtol=1e-4, atol=1e-5)


def test_tokenization_is_cached_and_truncated(text):
    tok = tokenize.load_tokenizer()
    assert tokenize.load_tokenizer() is tok  # one tokenizer per process
    texts = list(text.train.inputs)
    first = tokenize.encode_texts(tok, texts, 64)
    size = tokenize.cache_info()
    again = tokenize.encode_texts(tok, list(texts), 64)
    assert again[0] is first[0] and tokenize.cache_info() == size
    short = tokenize.encode_texts(tok, texts, 6)
    assert short[0].shape[1] == 6 and (short[0][:, -1] == tok.sep_token_id).all()
    assert short[0] is not first[0] and tokenize.cache_info() == size + 1


def test_gpt2_conv1d_becomes_an_equal_linear():
    from transformers import GPT2Config, GPT2ForSequenceClassification
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    model = GPT2ForSequenceClassification(GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1,
                                                     n_head=2, pad_token_id=0, num_labels=2)).eval()
    ids = torch.randint(1, 50, (3, 10))
    before = model(input_ids=ids).logits
    assert conv1d_to_linear(model) == 4
    assert not any(isinstance(m, Conv1D) for m in model.modules())
    torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=1e-5, atol=1e-6)


# ---- Opacus per-sample gradients on the HF models -------------------------------------------------

def reference_norms(module: nn.Module, inputs: tuple[torch.Tensor, ...], y: torch.Tensor) -> torch.Tensor:
    """Per-example gradient norms, one example at a time with plain autograd."""
    params = [p for p in module.parameters() if p.requires_grad]
    norms = []
    for i in range(len(y)):
        grads = torch.autograd.grad(nn.functional.cross_entropy(module(*(x[i:i + 1] for x in inputs)), y[i:i + 1]),
                                    params, allow_unused=True)
        norms.append(torch.sqrt(sum((g ** 2).sum() for g in grads if g is not None)))
    return torch.stack(norms)


def opacus_norms(module: nn.Module, inputs: tuple[torch.Tensor, ...], y: torch.Tensor, mode: str) -> torch.Tensor:
    from opacus.grad_sample import GradSampleModule, GradSampleModuleFastGradientClipping

    if mode == "ghost":
        gsm = GradSampleModuleFastGradientClipping(module, loss_reduction="sum", max_grad_norm=1.0)
        nn.functional.cross_entropy(gsm(*inputs), y, reduction="sum").backward()
        norms = gsm.get_norm_sample()
    else:
        gsm = GradSampleModule(module, loss_reduction="sum")
        nn.functional.cross_entropy(gsm(*inputs), y, reduction="sum").backward()
        per_param = [p.grad_sample.reshape(len(y), -1) for p in module.parameters() if p.requires_grad]
        norms = torch.cat(per_param, dim=1).norm(dim=1)
    gsm._close()
    return norms.detach()


CASES = [("bert-tiny", "all"), ("gpt2-tiny", "all"), ("minilm", "top-1"), ("vit-tiny", "all")]


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
@pytest.mark.parametrize(("name", "trainable"), CASES)
def test_opacus_per_sample_norms_match_reference(text, images, name, trainable, mode):
    torch.manual_seed(0)
    data = images["digits"] if name == "vit-tiny" else text
    options = {"trainable": trainable} | ({} if name in ("minilm", "vit-tiny") else {"dropout": 0.0})
    bundle = models.build(name, data, options)
    module = bundle.module
    if name == "minilm":  # dropout off without leaving training mode (Opacus hooks need it)
        for m in module.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
    split = batch(data.train, 4)
    inputs, y = bundle.encode(split), torch.from_numpy(split.labels)
    expected = reference_norms(module, inputs, y)
    got = opacus_norms(module, inputs, y, mode)
    assert (expected > 0).all()
    torch.testing.assert_close(got, expected, rtol=2e-3, atol=1e-5)


# ---- hf: local checkpoints and bad names ---------------------------------------------------------

def test_hf_local_text_checkpoint_matches_the_saved_model(text, tmp_path):
    torch.manual_seed(0)
    original = models.build("bert-tiny", text, {"dropout": 0.0})
    original.module.model.save_pretrained(tmp_path / "ckpt")
    original.info["tokenizer"].save_pretrained(tmp_path / "ckpt")
    loaded = models.build(f"hf:{tmp_path / 'ckpt'}", text, {"max_length": 64})
    assert loaded.info["family"] == "bert" and loaded.info["pretrained"]
    split = batch(text.test, 6)
    with torch.no_grad():
        a = original.module.eval()(*original.encode(split))
        b = loaded.module.eval()(*loaded.encode(split))
    torch.testing.assert_close(b, a)


def test_hf_local_image_checkpoint(images, tmp_path):
    torch.manual_seed(0)
    s = images["digits"]
    original = models.build("vit-tiny", s)
    original.module.model.save_pretrained(tmp_path / "vit")
    loaded = models.build(f"hf:{tmp_path / 'vit'}", s, {"trainable": "top-1"})
    assert loaded.info["trainable_params"] < loaded.info["total_params"]
    (pixels,) = loaded.encode(batch(s.test, 3))
    with torch.no_grad():
        torch.testing.assert_close(loaded.module.eval()(pixels), original.module.eval()(pixels))


def test_hf_model_offline_fails_with_a_hint(text):
    with pytest.raises(RuntimeError, match="HF_HUB_OFFLINE=1"):
        models.build("hf:privbench-test/no-such-model", text)


def test_unknown_model_lists_what_exists(text):
    with pytest.raises(UnknownName) as err:
        models.build("bert-huge", text)
    for name in ("minilm", "bert-tiny", "gpt2-tiny", "vit-tiny", "hf:<name>"):
        assert name in str(err.value)


def test_text_classifier_rejects_unknown_pooling(text):
    from transformers import BertConfig, BertModel

    with pytest.raises(ValueError, match="pooling"):
        TextClassifier(BertModel(BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                            intermediate_size=8)), num_classes=2, pooling="max")
    with pytest.raises(ValueError, match="pooling"):
        models.build("minilm", text, {"pooling": "max"})
