"""What every model builder returns (`ModelBundle`), the model contract (`Model`), and the registry that
finds models by name: privbench's and plugins' alike, through `privbench.models` entry points."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from mechanisms.framework.options import from_signature, problems
from mechanisms.framework.registry import Registry
from workers.datasets.contract import KINDS, PublicSplits, Split, Splits, resolve

if TYPE_CHECKING:
    import torch
    from torch import nn

    from mechanisms.parts.releases import DatasetStatistic


@dataclasses.dataclass(frozen=True)
class Statistic:
    """A statistic of the training set a model needs before it trains (a private standardisation's channel
    means): privbench computes `per_example` on the encoded training set, releases the sums through `release`
    (privbench's part: it clips each example's rows and adds the noise; the plan composes it with the steps),
    and hands the noised sums and the training set's size to `receive`, which is post-processing.

    `labels`: `per_example` also gets the examples' labels (B,) after the encoded inputs (a label histogram, for
    a prior on the classes: each example's one-hot row).

    Guarantee a model keeps: row i of `per_example(inputs)` depends on example i alone."""

    release: DatasetStatistic
    per_example: Callable[[tuple[torch.Tensor, ...]], torch.Tensor]  # encoded inputs (B, ...) -> (B, rows, width)
    receive: Callable[[torch.Tensor, int], None]  # the released sums (rows, width) and N, into the model
    labels: bool = False


@dataclasses.dataclass
class ModelBundle:
    """A classifier whose `module(*encode(split.inputs))` gives logits, whatever the modality; `statistics`
    are what it needs released about the training set before training (none for most models)."""

    module: nn.Module
    encode: Callable[[Split], tuple[torch.Tensor, ...]]
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. trainable params, tokenizer
    statistics: tuple[Statistic, ...] = ()


Builder = Callable[..., ModelBundle]


@dataclasses.dataclass(frozen=True)
class Model:
    """A model family by name: what a `privbench.models` entry point names.

    `builder(splits, **options) -> ModelBundle` (`builder(rest, splits, **options)` with `prefix=True`,
    serving `name:<rest>`); its keyword parameters are the model's options (the schema the grid checks).
    `splits` is the dataset's public information (`PublicSplits`: kind, classes, shapes, a declared public
    split), never its private rows: what the model needs of those it gets through `statistics` (releases).
    Guarantee: the initial weights come from torch's seeded generator (the worker seeds it per trial), and
    `module(*encode(split))` gives logits for every kind in `kinds`. `builder` may be a callable or a
    `module:attr` reference, imported when a model is built (so that listing stays light).
    """

    name: str
    kinds: tuple[str, ...]
    description: str
    builder: Builder | str
    prefix: bool = False

    def __post_init__(self) -> None:
        if not self.kinds or not set(self.kinds) <= set(KINDS):
            raise ValueError(f"model {self.name}: kinds must be among {', '.join(KINDS)}, got {self.kinds!r}")

    def function(self) -> Builder:
        return resolve(self.builder)

    def __call__(self, *args: Any, **options: Any) -> ModelBundle:
        return self.function()(*args, **options)


def model(name: str, kinds: tuple[str, ...], description: str, *, prefix: bool = False) -> Callable[[Builder], Model]:
    """Decorate a builder into a `Model` (name it in a `privbench.models` entry point to register it)."""

    def deco(builder: Builder) -> Model:
        return Model(name, tuple(kinds), description, builder, prefix)

    return deco


def _model_name(obj: Any) -> str:
    if not isinstance(obj, Model):
        raise TypeError(f"{obj!r} is not a workers.models.Model")
    return obj.name


MODELS: Registry[Model] = Registry("model", {
    name: f"workers.models.catalog:{attr}" for name, attr in (
        ("mlp", "MLP"), ("linear", "LINEAR"), ("cnn-small", "CNN_SMALL"), ("cnn-tanh", "CNN_TANH"),
        ("scatternet-linear", "SCATTERNET_LINEAR"), ("scatternet-cnn", "SCATTERNET_CNN"), ("minilm", "MINILM"),
        ("bert-tiny", "BERT_TINY"), ("gpt2-tiny", "GPT2_TINY"), ("vit-tiny", "VIT_TINY"), ("hf", "HF_MODEL"))
}, _model_name)


def register(entry: Model) -> Model:
    """Add a model in this process (a notebook's); workers find plugins through entry points or `plugins:`."""
    return MODELS.register(entry)


def get_entry(name: str) -> tuple[Model, str | None]:
    return MODELS.resolve(name)


def names() -> list[str]:
    return MODELS.written_names()


def describe() -> list[tuple[str, str, str]]:
    return sorted((f"{e.name}:<name>" if e.prefix else e.name, ",".join(e.kinds), e.description)
                  for _, e in MODELS.items())


def supports(name: str, kind: str) -> bool:
    return kind in get_entry(name)[0].kinds


def option_problems(name: str, options: Mapping[str, Any] | None) -> list[str]:
    """Problems with a model's options (unknown keys, wrong types, bad values): the builder's signature
    is the schema (`mechanisms.framework.options.from_signature`)."""
    entry, rest = get_entry(name)
    schema = from_signature(entry.function(), 2 if rest is not None else 1, f"{name}-options")
    return problems(schema, options, name)


def build(name: str, splits: Splits | PublicSplits, options: dict[str, Any] | None = None) -> ModelBundle:
    """The model `name` for the dataset, its builder handed the public information only (`PublicSplits`)."""
    entry, rest = get_entry(name)
    if splits.kind not in entry.kinds:
        raise ValueError(f"model {name!r} takes {'/'.join(entry.kinds)} data, dataset {splits.name!r} is "
                         f"{splits.kind}")
    opts = dict(options or {})
    public = splits.public_view() if isinstance(splits, Splits) else splits
    return entry(rest, public, **opts) if rest is not None else entry(public, **opts)
