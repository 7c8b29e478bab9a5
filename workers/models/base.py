"""What every model builder returns, and the registry that finds builders by name."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from mechanisms.options import from_signature, problems
from mechanisms.registry import UnknownName
from workers.datasets.base import Split, Splits


@dataclasses.dataclass
class ModelBundle:
    """A classifier whose `module(*encode(split.inputs))` gives logits, whatever the modality."""

    module: nn.Module
    encode: Callable[[Split], tuple[torch.Tensor, ...]]
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. trainable params, tokenizer


Builder = Callable[..., ModelBundle]


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    kinds: tuple[str, ...]
    builder: Builder
    description: str


_MODELS: dict[str, Entry] = {}
_PREFIXES: dict[str, Entry] = {}


def register(name: str, kinds: tuple[str, ...], description: str, *,
             prefix: bool = False) -> Callable[[Builder], Builder]:
    """Register `builder(splits, **options) -> ModelBundle` (`builder(rest, splits, **options)` with
    `prefix=True`, serving `name:<rest>`). Builders draw their initial weights from torch's seeded RNG."""

    def deco(builder: Builder) -> Builder:
        table = _PREFIXES if prefix else _MODELS
        if name in table:
            raise ValueError(f"model {name!r} registered twice")
        table[name] = Entry(name, kinds, builder, description)
        return builder

    return deco


def get_entry(name: str) -> tuple[Entry, str | None]:
    if name in _MODELS:
        return _MODELS[name], None
    head, sep, rest = name.partition(":")
    if sep and head in _PREFIXES and rest:
        return _PREFIXES[head], rest
    raise UnknownName("model", name, names())


def names() -> list[str]:
    return sorted(_MODELS) + [f"{p}:<name>" for p in sorted(_PREFIXES)]


def describe() -> list[tuple[str, str, str]]:
    rows = [(e.name, ",".join(e.kinds), e.description) for e in _MODELS.values()]
    rows += [(f"{e.name}:<name>", ",".join(e.kinds), e.description) for e in _PREFIXES.values()]
    return sorted(rows)


def supports(name: str, kind: str) -> bool:
    return kind in get_entry(name)[0].kinds


def option_problems(name: str, options: Mapping[str, Any] | None) -> list[str]:
    """Problems with a model's options (unknown keys, wrong types, bad values): the builder's signature
    is the schema (`mechanisms.options.from_signature`)."""
    entry, rest = get_entry(name)
    schema = from_signature(entry.builder, 2 if rest is not None else 1, f"{name}-options")
    return problems(schema, options, name)


def build(name: str, splits: Splits, options: dict[str, Any] | None = None) -> ModelBundle:
    entry, rest = get_entry(name)
    if splits.kind not in entry.kinds:
        raise ValueError(f"model {name!r} takes {'/'.join(entry.kinds)} data, dataset {splits.name!r} is "
                         f"{splits.kind}")
    opts = dict(options or {})
    return entry.builder(rest, splits, **opts) if rest is not None else entry.builder(splits, **opts)
