"""What every dataset loader returns (`Splits`), the dataset contract (`Dataset`: records plus a per-record
transform), what a model builder sees of a dataset (`PublicSplits`), the neighbouring datasets the pre-training
checks load (`neighbouring`, `replace_record`), and the registry that finds datasets by name: privbench's and
plugins' alike, through `privbench.datasets` entry points."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from mechanisms.framework.options import from_signature, problems
from mechanisms.framework.registry import Registry

KINDS = ("image", "text", "tabular")
REPLACEMENTS = 256  # candidates `replace_record` looks at for the farthest replacement


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
    public: Split | None = None  # rows declared public (no privacy owed to them): what a model builder may read

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "val": len(self.val), "test": len(self.test)}

    def public_view(self) -> PublicSplits:
        """What a model builder sees: the public information only."""
        return PublicSplits(self.name, self.kind, self.num_classes, self.input_shape, self.public)


@dataclasses.dataclass(frozen=True)
class PublicSplits:
    """The public information of a dataset, all a model builder receives: its kind, classes and shapes, and the
    rows it declares public (`Splits.public`). Private rows reach a model only through releases (`Statistic`,
    which privbench clips and noises and the plan accounts): a builder reading the training rows would put them
    into the model's initial state, which no accountant counts."""

    name: str
    kind: str
    num_classes: int
    input_shape: tuple[int, ...] | None = None
    public: Split | None = None

    def __getattr__(self, name: str) -> Any:
        if name in ("train", "val", "test"):
            raise AttributeError(f"a model builder sees public information only (kind, classes, shapes, "
                                 f"splits.public): `splits.{name}` holds private rows; release what the model "
                                 "needs through a Statistic")
        raise AttributeError(name)


Loader = Callable[..., Splits]
Transform = Callable[..., Any]


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

    `transform(records, **options) -> rows`: the checkable shape. The loader returns records (the raw inputs,
    one per record: pixels as stored, texts as read), and privbench makes the rows by running the transform on
    each split, and on a neighbouring training set (one record replaced) to check that row i depends on record i
    alone. It receives the loader's options its signature names. None: the loader returns rows itself, which
    privbench cannot rerun on a neighbour (an opaque loader: its trials are not certified, and the record says
    its rows were not checked).
    """

    name: str
    kind: str
    description: str
    loader: Loader | str
    prefix: bool = False
    transform: Transform | str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"dataset {self.name}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    def function(self) -> Loader:
        """The loader itself (imported on first use when given as `module:attr`)."""
        return resolve(self.loader)

    def __call__(self, *args: Any, **options: Any) -> Splits:
        return self.function()(*args, **options)

    def rows(self, records: Splits, options: Mapping[str, Any]) -> Splits:
        """Every split's rows: the transform run on its records (the records themselves without one)."""
        if self.transform is None:
            return records
        fn = resolve(self.transform)
        named = inspect.signature(fn).parameters
        kw = {k: v for k, v in options.items() if k in named}

        def run(split: Split) -> Split:
            rows = fn(split.inputs, **kw)
            if len(rows) != len(split):
                raise ValueError(f"dataset {self.name}: the transform returned {len(rows)} rows for "
                                 f"{len(split)} records (one row per record)")
            return dataclasses.replace(split, inputs=rows)

        return dataclasses.replace(records, train=run(records.train), val=run(records.val), test=run(records.test),
                                   public=run(records.public) if records.public is not None else None)


def records_are_rows(records: Any) -> Any:
    """The transform of a loader whose records are its rows (texts as read, generated vectors): each row is its
    record, so a neighbour's rows differ in the replaced one alone."""
    return records


def resolve(target: Callable[..., Any] | str) -> Callable[..., Any]:
    """A callable, or the object a `module:attr` reference names (the entry-point syntax)."""
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def dataset(name: str, kind: str, description: str, *, prefix: bool = False,
            transform: Transform | str | None = None) -> Callable[[Loader], Dataset]:
    """Decorate a loader into a `Dataset` (name it in a `privbench.datasets` entry point to register it)."""

    def deco(loader: Loader) -> Dataset:
        return Dataset(name, kind, description, loader, prefix, transform)

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


# the training record a neighbouring-data check replaces (`neighbouring`), and the neighbours loaded so far; None:
# every load is the real data
_NEIGHBOUR: contextvars.ContextVar[tuple[Callable[[int], int], dict[str, Splits]] | None] = \
    contextvars.ContextVar("neighbour", default=None)


def load(name: str, options: Mapping[str, Any] | None = None) -> Splits:
    """The dataset's rows (`Dataset.rows` of its records). Inside `neighbouring`, a neighbouring dataset: one
    training record replaced before the transform runs, whoever asks (a plugin's hook or builder too)."""
    entry, rest = get_loader(name)
    opts = dict(options or {})
    neighbour = _NEIGHBOUR.get()
    key = repr((name, sorted(opts.items())))
    if neighbour is not None and key in neighbour[1]:
        return neighbour[1][key]
    records = entry(rest, **opts) if rest is not None else entry(**opts)
    if neighbour is None:
        return entry.rows(records, opts)
    rows = neighbour[1][key] = entry.rows(replace_record(records, neighbour[0](len(records.train))), opts)
    return rows


@contextlib.contextmanager
def neighbouring(index: Callable[[int], int]) -> Iterator[None]:
    """Within the block, `load` returns a neighbour of every dataset: the training record `index(N)` replaced
    (`replace_record`), each loaded once."""
    token = _NEIGHBOUR.set((index, {}))
    try:
        yield
    finally:
        _NEIGHBOUR.reset(token)


def in_neighbour_check() -> bool:
    """Whether a neighbouring-data check is running here (`neighbouring`): loads must not come from a cache."""
    return _NEIGHBOUR.get() is not None


def replace_record(records: Splits, index: int) -> Splits:
    """`records` with training record `index` replaced by one from outside the training split, of another class
    where there is one, and the farthest of the first `REPLACEMENTS` such (so the class counts, the means and most
    order statistics change), the training set's size kept: the plan's legitimate inputs (N, the geometry) stay
    equal, and only what reads the records can tell."""
    train = records.train
    label = train.labels[index]
    for source in (records.test, records.val, train):
        other = np.flatnonzero(source.labels != label)[:REPLACEMENTS]
        if len(other):
            break
    else:
        source, other = train, np.array([(index + 1) % len(train)])
    pick = int(other[0])
    if isinstance(source.inputs, np.ndarray) and np.issubdtype(source.inputs.dtype, np.number):
        gaps = source.inputs[other].reshape(len(other), -1).astype(np.float64) - \
            np.asarray(train.inputs[index], dtype=np.float64).reshape(1, -1)
        pick = int(other[np.argmax(np.einsum("ij,ij->i", gaps, gaps))])
    if isinstance(train.inputs, list):
        inputs = list(train.inputs)
        inputs[index] = source.inputs[pick]
    else:
        inputs = np.array(train.inputs, copy=True)
        inputs[index] = source.inputs[pick]
    labels = np.array(train.labels, copy=True)
    labels[index] = source.labels[pick]
    return dataclasses.replace(records, train=dataclasses.replace(train, inputs=inputs, labels=labels))


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
