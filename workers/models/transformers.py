"""Hugging Face transformer classifiers: pretrained MiniLM (offline), tiny BERT / GPT-2 / ViT built from a
config, and `hf:<checkpoint>` for anything on the hub or in a local folder.

Every model is wrapped so that `module(*encode(split))` returns logits and Opacus can compute
per-sample gradients (measured on this project's 2-core CPU):
* text models receive `position_ids` / `token_type_ids` as contiguous (B, L) tensors, because the
  HF defaults are (1, L) or expanded buffers that break Opacus' hooks and ghost norms;
* GPT-2's `Conv1D` layers (a Linear with transposed weight) are swapped for `nn.Linear`, which Opacus
  supports in every mode, instead of falling back to slow functorch per-sample gradients;
* each training batch is trimmed to its longest example by the batches themselves (`info["trim_by"]`: the
  lengths are known on the host, so trimming reads nothing back from the device), each evaluation chunk here;
* BERT- and GPT-2-family models get their attention mask as the 4D boolean mask transformers would build
  from it (bidirectional, or causal): transformers' own construction first checks on the host whether the
  batch has padding at all, a device synchronisation in every step.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from workers.datasets.contract import PublicSplits, Split
from workers.datasets.hf import hub_is_offline, hub_offline_default
from workers.models.contract import ModelBundle
from workers.models.tokenize import DEFAULT_TOKENIZER, encode_texts, load_tokenizer, minilm_dir

# Models whose default position ids are computed per example from input_ids (offset by the padding
# index), so passing 0..L-1 would be wrong; their default is already (B, L) and fine for Opacus.
PADDING_OFFSET_POSITIONS = {"roberta", "xlm-roberta", "camembert", "data2vec-text", "longformer", "mpnet",
                            "xlm-roberta-xl", "roberta-prelayernorm", "ibert"}
# Opacus modes measured with benchmarks/mechanism_overhead.py (README, Workloads): ghost clipping is 1.3-3.2x
# faster than hooks on the text models (whose 30k-token embeddings make per-sample gradients costly), but
# slower on ViT, whose patch Conv2d and LayerNorms fall back to per-sample gradients in ghost mode anyway.
# Since issue 11 the default is the book-keeping engine (mechanisms/clipping_engine, docs/clipping.md), measured
# faster than every Opacus mode on each registry model by benchmarks/clipping_engine.py; a checkpoint it
# cannot clip (an unsupported layer) falls back to the Opacus mode measured best before, recorded per trial.
TEXT_GRAD_SAMPLE_MODE = "bk"
IMAGE_GRAD_SAMPLE_MODE = "bk"  # vit-tiny: 1.16x non-private against 2.29x for the best Opacus mode
FALLBACK = {"text": "ghost", "image": "hooks"}


class TextClassifier(nn.Module):
    """(input_ids, attention_mask) -> logits around a Hugging Face text model.

    With `pooling` None the wrapped model is a `*ForSequenceClassification` and brings its own head;
    otherwise it is a base model whose hidden states are pooled (`mean` over real tokens, as
    sentence-transformers trained MiniLM, or `cls`) into a new linear head.
    """

    def __init__(self, model: nn.Module, *, num_classes: int, pooling: str | None = None,
                 dropout: float = 0.1, eval_chunk: int = 64) -> None:
        super().__init__()
        self.model = model
        self.pooling = pooling
        self.eval_chunk = eval_chunk
        config = model.config
        params = inspect.signature(model.forward).parameters
        self.pass_positions = "position_ids" in params and config.model_type not in PADDING_OFFSET_POSITIONS
        self.pass_token_types = "token_type_ids" in params and getattr(config, "type_vocab_size", 0) > 0
        if pooling is not None:
            if pooling not in ("mean", "cls"):
                raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
            self.dropout = nn.Dropout(dropout)
            self.head = nn.Linear(config.hidden_size, num_classes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            if input_ids.shape[0] > self.eval_chunk:
                return self._bucketed(input_ids, attention_mask)
            input_ids, attention_mask = _trimmed(input_ids, attention_mask)
        return self._forward(input_ids, attention_mask)

    def _bucketed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Evaluation only (no autograd, so no Opacus hooks see it): run length-sorted chunks, each trimmed
        to its own longest example; on short texts this halves evaluation time."""
        order = torch.argsort(attention_mask.sum(dim=1), stable=True)
        parts = [self._forward(*_trimmed(input_ids[idx], attention_mask[idx])) for idx in order.split(self.eval_chunk)]
        logits = torch.cat(parts)
        out = torch.empty_like(logits)
        out[order] = logits
        return out

    def _forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        batch, length = input_ids.shape
        kwargs: dict[str, torch.Tensor] = {"input_ids": input_ids, "attention_mask": self._mask(attention_mask)}
        if self.pass_positions:
            kwargs["position_ids"] = torch.arange(length, device=input_ids.device).expand(batch, length).contiguous()
        if self.pass_token_types:
            kwargs["token_type_ids"] = torch.zeros_like(input_ids)
        out = self.model(**kwargs)
        if self.pooling is None:
            return out.logits
        hidden = out.last_hidden_state
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
        return self.head(self.dropout(pooled))


    def _mask(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The 4D boolean mask (True: attend) transformers builds for this model family under SDPA, built on the
        device; another family or attention implementation gets the 2D mask, as transformers takes it."""
        kind = MASK_KINDS.get(self.model.config.model_type)
        if kind is None or getattr(self.model.config, "_attn_implementation", None) != "sdpa":
            return attention_mask
        batch, length = attention_mask.shape
        keep = attention_mask.bool()[:, None, None, :]
        if kind == "causal":
            return keep & torch.ones(length, length, dtype=torch.bool, device=keep.device).tril()
        return keep.expand(batch, 1, length, length)


def _trimmed(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An evaluation batch cut to its longest example (a host read: evaluation is not a training step)."""
    if input_ids.shape[0] == 0:
        return input_ids, attention_mask
    length = int(attention_mask.sum(dim=1).max().clamp_min(1))
    return input_ids[:, :length].contiguous(), attention_mask[:, :length].contiguous()


# Families whose attention mask transformers builds as a bidirectional or causal 4D mask (tested equal).
MASK_KINDS = {"bert": "bidirectional", "gpt2": "causal"}


class ImageClassifier(nn.Module):
    """pixels (B, C, H, W) -> logits around a Hugging Face image model; grey images are repeated to the
    model's channels and resized to its `image_size` per batch (so a 224px checkpoint takes 28px data
    without materialising a resized copy of the dataset)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        size = getattr(model.config, "image_size", None)
        self.size = (size, size) if isinstance(size, int) else tuple(size) if size else None
        self.channels = getattr(model.config, "num_channels", None)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.channels and pixels.shape[1] == 1 and self.channels != 1:
            pixels = pixels.expand(-1, self.channels, -1, -1)
        if self.size and tuple(pixels.shape[-2:]) != self.size and pixels.shape[0] > 0:
            pixels = nn.functional.interpolate(pixels, size=self.size, mode="bilinear", align_corners=False)
        return self.model(pixel_values=pixels.contiguous()).logits


# ---- surgery and trainable parameters ------------------------------------------------------------

def conv1d_to_linear(model: nn.Module) -> int:
    """Replace transformers' `Conv1D` (y = x W + b, W of shape (in, out)) by the equal `nn.Linear`."""
    from transformers.pytorch_utils import Conv1D  # lazy: heavy (transformers)

    swapped = 0
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, Conv1D):
                linear = nn.Linear(child.nx, child.nf, device=child.weight.device, dtype=child.weight.dtype)
                with torch.no_grad():
                    linear.weight.copy_(child.weight.t())
                    linear.bias.copy_(child.bias)
                linear.weight.requires_grad_(child.weight.requires_grad)
                linear.bias.requires_grad_(child.bias.requires_grad)
                setattr(parent, child_name, linear)
                swapped += 1
    return swapped


def transformer_blocks(model: nn.Module) -> nn.ModuleList:
    """The stack of transformer layers: the `ModuleList` holding the most parameters."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        raise ValueError(f"no layer stack found in {type(model).__name__}")
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


def set_trainable(model: nn.Module, spec: str) -> dict[str, int]:
    """`all`, `head` (everything after the layer stack: final norm, pooler, classifier) or `top-<k>`
    (the head plus the last k layers). Relies on parameters being registered bottom-up, as in every
    HF model: embeddings, then layers, then what follows them. Frozen bottoms cost no backward pass."""
    blocks = transformer_blocks(model)
    match = re.fullmatch(r"top-(\d+)", spec)
    if spec not in ("all", "head") and not match:
        raise ValueError(f"trainable must be 'all', 'head' or 'top-<k>', got {spec!r}")
    k = 0 if spec == "head" else len(blocks) if spec == "all" else int(match.group(1))  # type: ignore[union-attr]
    if k > len(blocks):
        raise ValueError(f"trainable {spec!r}: the model has only {len(blocks)} layers")
    in_block = {id(p): i for i, block in enumerate(blocks) for p in block.parameters()}
    seen_block = False
    for param in model.parameters():
        index = in_block.get(id(param))
        seen_block = seen_block or index is not None
        if spec == "all":
            param.requires_grad_(True)
        elif index is not None:
            param.requires_grad_(index >= len(blocks) - k)
        else:
            param.requires_grad_(seen_block)  # before the stack: embeddings (frozen); after it: the head
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"trainable_params": trainable, "total_params": sum(p.numel() for p in model.parameters()),
            "num_layers": len(blocks)}


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    from transformers.utils import logging as hf_logging  # lazy: heavy (transformers)

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


# ---- bundles ------------------------------------------------------------------------------------

def _text_bundle(module: TextClassifier, tokenizer: Any, max_length: int, trainable: str,
                 **info: Any) -> ModelBundle:
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    counts = set_trainable(module, trainable)
    module.train()  # from_pretrained returns eval mode; Opacus only records activations in training mode

    def encode(split: Split) -> tuple[torch.Tensor, ...]:
        return encode_texts(tokenizer, list(split.inputs), max_length)

    return ModelBundle(module, encode, {
        "grad_sample_mode": TEXT_GRAD_SAMPLE_MODE, "fallback_grad_sample_mode": FALLBACK["text"],
        "tokenizer": tokenizer, "max_length": max_length, "trim_by": 1,  # batches cut to the attention mask's
        # longest row: encode gives (input_ids, attention_mask), right-padded
        "trainable": trainable, "blocks": transformer_blocks(module), **counts, **info})


def _image_bundle(module: ImageClassifier, trainable: str, **info: Any) -> ModelBundle:
    counts = set_trainable(module, trainable)
    module.train()

    def encode(split: Split) -> tuple[torch.Tensor, ...]:
        return (torch.from_numpy(split.inputs).contiguous(),)

    return ModelBundle(module, encode, {"grad_sample_mode": IMAGE_GRAD_SAMPLE_MODE,
                                        "fallback_grad_sample_mode": FALLBACK["image"], "trainable": trainable,
                                        "blocks": transformer_blocks(module), **counts, **info})


def minilm(splits: PublicSplits, trainable: str = "all", pooling: str = "mean", max_length: int = 64,
           dropout: float = 0.1) -> ModelBundle:
    hub_offline_default()
    from transformers import BertModel  # lazy: heavy (transformers)

    path = minilm_dir()
    with _quiet_transformers():  # the load report would list the unused pooler weights as "unexpected"
        backbone = BertModel.from_pretrained(str(path), add_pooling_layer=False)  # mean pooling replaces it
    module = TextClassifier(backbone, num_classes=splits.num_classes, pooling=pooling, dropout=dropout)
    return _text_bundle(module, load_tokenizer(DEFAULT_TOKENIZER), max_length, trainable, family="bert",
                        source=str(path), pretrained=True)


def bert_tiny(splits: PublicSplits, layers: int = 2, hidden: int = 128, heads: int = 2, max_length: int = 64,
              tokenizer: str = DEFAULT_TOKENIZER, trainable: str = "all", dropout: float = 0.1) -> ModelBundle:
    from transformers import BertConfig, BertForSequenceClassification  # lazy: heavy (transformers)

    tok = load_tokenizer(tokenizer)
    config = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * hidden,
                        max_position_embeddings=max(128, max_length), pad_token_id=tok.pad_token_id,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                        num_labels=splits.num_classes)
    module = TextClassifier(BertForSequenceClassification(config), num_classes=splits.num_classes)
    return _text_bundle(module, tok, max_length, trainable, family="bert", pretrained=False)


def gpt2_tiny(splits: PublicSplits, layers: int = 2, hidden: int = 128, heads: int = 2, max_length: int = 64,
              tokenizer: str = DEFAULT_TOKENIZER, trainable: str = "all", dropout: float = 0.1) -> ModelBundle:
    from transformers import GPT2Config, GPT2ForSequenceClassification  # lazy: heavy (transformers)

    tok = load_tokenizer(tokenizer)
    config = GPT2Config(vocab_size=len(tok), n_positions=max(128, max_length), n_embd=hidden, n_layer=layers,
                        n_head=heads, pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id,
                        eos_token_id=tok.sep_token_id, resid_pdrop=dropout, embd_pdrop=dropout,
                        attn_pdrop=dropout, num_labels=splits.num_classes)
    model = GPT2ForSequenceClassification(config)
    conv1d_to_linear(model)
    module = TextClassifier(model, num_classes=splits.num_classes)
    return _text_bundle(module, tok, max_length, trainable, family="gpt2", pretrained=False)


def vit_tiny(splits: PublicSplits, layers: int = 4, hidden: int = 128, heads: int = 4, patch_size: int | None = None,
             trainable: str = "all", dropout: float = 0.0) -> ModelBundle:
    from transformers import ViTConfig, ViTForImageClassification  # lazy: heavy (transformers)

    channels, height, width = splits.input_shape or (1, 28, 28)
    patch = patch_size or (4 if min(height, width) >= 16 else 2)
    if height % patch or width % patch:
        raise ValueError(f"patch_size {patch} does not divide the {height}x{width} images")
    config = ViTConfig(image_size=height if height == width else (height, width), patch_size=patch,
                       num_channels=channels, hidden_size=hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, intermediate_size=2 * hidden, hidden_dropout_prob=dropout,
                       attention_probs_dropout_prob=dropout, num_labels=splits.num_classes)
    module = ImageClassifier(ViTForImageClassification(config))
    return _image_bundle(module, trainable, family="vit", pretrained=False)


def hf_model(rest: str, splits: PublicSplits, trainable: str = "all", max_length: int = 128,
             tokenizer: str | None = None, revision: str | None = None) -> ModelBundle:
    hub_offline_default()
    # lazy: heavy (transformers)
    from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification

    auto = AutoModelForImageClassification if splits.kind == "image" else AutoModelForSequenceClassification
    try:
        model = auto.from_pretrained(rest, num_labels=splits.num_classes, ignore_mismatched_sizes=True,
                                     revision=revision)
        tok = load_tokenizer(tokenizer or rest) if splits.kind == "text" else None
    except (OSError, ValueError) as exc:
        hint = ("offline mode is on (HF_HUB_OFFLINE=1): set HF_HUB_OFFLINE=0 to download, or give a local "
                "folder" if hub_is_offline() else "give a hub id or a local folder")
        raise RuntimeError(f"could not load Hugging Face model {rest!r}: {type(exc).__name__}: {exc}. "
                           f"{hint} (hf:/path/to/checkpoint)") from exc
    conv1d_to_linear(model)
    family = model.config.model_type
    if tok is None:
        return _image_bundle(ImageClassifier(model), trainable, family=family, source=rest, pretrained=True)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tok.pad_token_id  # GPT-2-style heads find the last real token by it
    module = TextClassifier(model, num_classes=splits.num_classes)
    return _text_bundle(module, tok, max_length, trainable, family=family, source=rest, pretrained=True)
