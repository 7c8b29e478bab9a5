"""What every dataset loader returns (`Splits`), the dataset contract (`Dataset`), and the registry that
finds datasets by name: privbench's and plugins' alike, through `privbench.datasets` entry points."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mechanisms.framework.options import from_signature, problems
from mechanisms.framework.registry import Registry

KINDS = ("image", "text", "tabular")


@dataclasses.dataclass(frozen=True)
class Split:
    """Inputs and integer labels of one split: images as float32 (N, C, H, W), texts as list[str], tabular
    feature vectors as float32 (N, F).

    `units` (training split): one privacy-unit id per row, for data where one person owns several rows (their
    messages, their photos). The guarantee is then about units (user-level DP): the sampler draws units, a
    unit's rows are clipped together, and the accountant counts units. None: every row is its own unit."""

    inputs: Any
    labels: np.ndarray
    units: np.ndarray | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.units is not None and np.shape(self.units) != (len(self.labels),):
            raise ValueError(f"units must give one id per row ({len(self.labels)}), got shape {np.shape(self.units)}")

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: np.ndarray) -> Split:
        inputs = ([self.inputs[i] for i in index] if isinstance(self.inputs, list)
                  else self.inputs[index])
        return Split(inputs, self.labels[index], units=None if self.units is None else np.asarray(self.units)[index])


@dataclasses.dataclass(frozen=True)
class Splits:
    """Deterministic, disjoint train / validation / test splits of one dataset."""

    name: str
    kind: str
    num_classes: int
    train: Split
    val: Split
    test: Split
    input_shape: tuple[int, ...] | None = None  # (C, H, W) for images, (F,) for tabular

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "val": len(self.val), "test": len(self.test)}


Loader = Callable[..., Splits]


def unit_count(split: Any) -> int:
    """The number of privacy units of a training split (`Split.units`; a split that declares none has one per
    row): what the sampler draws from and the accountant counts."""
    units = getattr(split, "units", None)
    return len(split) if units is None else len(np.unique(units))


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A dataset by name: what a `privbench.datasets` entry point names.

    `loader(**options) -> Splits` (or `loader(rest, **options)` with `prefix=True`, which serves
    `name:<rest>`, as `hf:<name>` does); its keyword parameters are the dataset's options (their types and
    defaults are the schema the grid checks). Guarantee: splits depend only on the options (`split_seed`),
    never on the trial seed, and train / validation / test are disjoint. `loader` may be a callable or a
    `module:attr` reference, imported when the dataset is loaded (so that listing stays light).
    """

    name: str
    kind: str
    description: str
    loader: Loader | str
    prefix: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"dataset {self.name}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    def function(self) -> Loader:
        """The loader itself (imported on first use when given as `module:attr`)."""
        return resolve(self.loader)

    def __call__(self, *args: Any, **options: Any) -> Splits:
        return self.function()(*args, **options)


def resolve(target: Callable[..., Any] | str) -> Callable[..., Any]:
    """A callable, or the object a `module:attr` reference names (the entry-point syntax)."""
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def dataset(name: str, kind: str, description: str, *, prefix: bool = False) -> Callable[[Loader], Dataset]:
    """Decorate a loader into a `Dataset` (name it in a `privbench.datasets` entry point to register it)."""

    def deco(loader: Loader) -> Dataset:
        return Dataset(name, kind, description, loader, prefix)

    return deco


def _dataset_name(obj: Any) -> str:
    if not isinstance(obj, Dataset):
        raise TypeError(f"{obj!r} is not a workers.datasets.Dataset")
    return obj.name


DATASETS: Registry[Dataset] = Registry("dataset", {
    "breast-cancer": "workers.datasets.tabular:breast_cancer",
    "digits": "workers.datasets.images:digits",
    "fashion-mnist": "workers.datasets.images:fashion_mnist",
    "hf": "workers.datasets.hf:hf_dataset",
    "mnist": "workers.datasets.mnist:mnist",
    "mnist-5k": "workers.datasets.mnist5k:mnist_5k",
    "rotten-tomatoes": "workers.datasets.text:rotten_tomatoes",
    "synthetic": "workers.datasets.images:synthetic",
    "synthetic-text": "workers.datasets.text:synthetic_text",
}, _dataset_name)


def register(entry: Dataset) -> Dataset:
    """Add a dataset in this process (a notebook's); workers find plugins through entry points or `plugins:`."""
    return DATASETS.register(entry)


def get_loader(name: str) -> tuple[Dataset, str | None]:
    """The dataset for `name`, and the part after the prefix for `hf:`-style names."""
    return DATASETS.resolve(name)


def names() -> list[str]:
    return DATASETS.written_names()


def describe() -> list[tuple[str, str, str]]:
    return sorted((f"{e.name}:<name>" if e.prefix else e.name, e.kind, e.description) for _, e in DATASETS.items())


def option_problems(name: str, options: Mapping[str, Any] | None) -> list[str]:
    """Problems with a dataset's options: the loader's signature is the schema."""
    entry, rest = get_loader(name)
    schema = from_signature(entry.function(), 1 if rest is not None else 0, f"{name}-options")
    return problems(schema, options, name)


def load(name: str, options: Mapping[str, Any] | None = None) -> Splits:
    entry, rest = get_loader(name)
    opts = dict(options or {})
    return entry(rest, **opts) if rest is not None else entry(**opts)


def split_off(split: Split, fraction: float, seed: int) -> tuple[Split, Split]:
    """Deterministically split `split` into (rest, held) with `fraction` of it held out."""
    if not 0 <= fraction < 1:
        raise ValueError(f"validation fraction must lie in [0, 1), got {fraction}")
    n_held = int(round(len(split) * fraction))
    if n_held == 0:  # the rest is the whole split in its order: itself, not a copy (Fashion-MNIST's cost 0.56 s)
        return split, split.subset(np.zeros(0, dtype=np.int64))
    order = np.random.default_rng(seed).permutation(len(split))
    return split.subset(np.sort(order[n_held:])), split.subset(np.sort(order[:n_held]))


def three_way(inputs: Sequence[Any] | np.ndarray, labels: np.ndarray, *, test_fraction: float,
              val_fraction: float, seed: int) -> tuple[Split, Split, Split]:
    """Disjoint train/val/test from one pool; the split seed is fixed per dataset, not per trial."""
    whole = Split(list(inputs) if not isinstance(inputs, np.ndarray) else inputs, np.asarray(labels))
    rest, test = split_off(whole, test_fraction, seed)
    train, val = split_off(rest, val_fraction / (1 - test_fraction) if val_fraction else 0.0, seed + 1)
    return train, val, test
