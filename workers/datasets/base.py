"""What every dataset loader returns, and the registry that finds loaders by name."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mechanisms.options import from_signature, problems
from mechanisms.registry import UnknownName

KINDS = ("image", "text")


@dataclasses.dataclass(frozen=True)
class Split:
    """Inputs and integer labels of one split: images as float32 (N, C, H, W), texts as list[str]."""

    inputs: Any
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: np.ndarray) -> Split:
        inputs = ([self.inputs[i] for i in index] if isinstance(self.inputs, list)
                  else self.inputs[index])
        return Split(inputs, self.labels[index])


@dataclasses.dataclass(frozen=True)
class Splits:
    """Deterministic, disjoint train / validation / test splits of one dataset."""

    name: str
    kind: str
    num_classes: int
    train: Split
    val: Split
    test: Split
    input_shape: tuple[int, ...] | None = None  # (C, H, W) for images

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "val": len(self.val), "test": len(self.test)}


Loader = Callable[..., Splits]


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    kind: str
    loader: Loader
    description: str


_DATASETS: dict[str, Entry] = {}
_PREFIXES: dict[str, Entry] = {}


def register(name: str, kind: str, description: str, *, prefix: bool = False) -> Callable[[Loader], Loader]:
    """Register `loader(**options) -> Splits` (or `loader(rest, **options)` with `prefix=True`, which
    serves `name:<rest>`). Splits depend only on the options (`split_seed`), never on the trial seed."""

    def deco(loader: Loader) -> Loader:
        table = _PREFIXES if prefix else _DATASETS
        if name in table:
            raise ValueError(f"dataset {name!r} registered twice")
        table[name] = Entry(name, kind, loader, description)
        return loader

    return deco


def get_loader(name: str) -> tuple[Entry, str | None]:
    """The entry for `name`, and the part after the prefix for `hf:`-style names."""
    if name in _DATASETS:
        return _DATASETS[name], None
    head, sep, rest = name.partition(":")
    if sep and head in _PREFIXES and rest:
        return _PREFIXES[head], rest
    raise UnknownName("dataset", name, names())


def names() -> list[str]:
    return sorted(_DATASETS) + [f"{p}:<name>" for p in sorted(_PREFIXES)]


def describe() -> list[tuple[str, str, str]]:
    rows = [(e.name, e.kind, e.description) for e in _DATASETS.values()]
    rows += [(f"{e.name}:<name>", e.kind, e.description) for e in _PREFIXES.values()]
    return sorted(rows)


def option_problems(name: str, options: Mapping[str, Any] | None) -> list[str]:
    """Problems with a dataset's options: the loader's signature is the schema."""
    entry, rest = get_loader(name)
    schema = from_signature(entry.loader, 1 if rest is not None else 0, f"{name}-options")
    return problems(schema, options, name)


def load(name: str, options: Mapping[str, Any] | None = None) -> Splits:
    entry, rest = get_loader(name)
    opts = dict(options or {})
    return entry.loader(rest, **opts) if rest is not None else entry.loader(**opts)


def split_off(split: Split, fraction: float, seed: int) -> tuple[Split, Split]:
    """Deterministically split `split` into (rest, held) with `fraction` of it held out."""
    if not 0 <= fraction < 1:
        raise ValueError(f"validation fraction must lie in [0, 1), got {fraction}")
    order = np.random.default_rng(seed).permutation(len(split))
    n_held = int(round(len(split) * fraction))
    return split.subset(np.sort(order[n_held:])), split.subset(np.sort(order[:n_held]))


def three_way(inputs: Sequence[Any] | np.ndarray, labels: np.ndarray, *, test_fraction: float,
              val_fraction: float, seed: int) -> tuple[Split, Split, Split]:
    """Disjoint train/val/test from one pool; the split seed is fixed per dataset, not per trial."""
    whole = Split(list(inputs) if not isinstance(inputs, np.ndarray) else inputs, np.asarray(labels))
    rest, test = split_off(whole, test_fraction, seed)
    train, val = split_off(rest, val_fraction / (1 - test_fraction) if val_fraction else 0.0, seed + 1)
    return train, val, test
