"""`hf:<name>[:<config>]`: any Hugging Face dataset through `datasets.load_dataset`.

Online users write `hf:stanfordnlp/sst2` or `hf:nyu-mll/glue:sst2`; offline, the same code reads local
files with a builder name: `hf:csv` / `hf:parquet` / `hf:json` plus `data_files` (or a local folder,
`hf:/data/my_corpus`). Column names and which hub split plays train / validation / test come from
`dataset_options`, so no code is needed for a new dataset.

Offline by default: each failed hub call costs ~25 s of retries when the hub is unreachable, so
`HF_HUB_OFFLINE=1` / `HF_DATASETS_OFFLINE=1` are set unless the user set them (set them to 0 to use the hub).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from workers.datasets.contract import Split, Splits, dataset, split_off, three_way

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
TEXT_COLUMNS = ("text", "sentence", "content", "review", "document", "question")
VAL_SPLITS = ("validation", "valid", "dev")


def hub_offline_default() -> None:
    """Turn on Hugging Face offline mode unless the user chose a mode themselves.

    The hub libraries read these variables once, at import; if they were imported before us (and the
    user did not choose), their module constants are switched as well.
    """
    user_chose = any(v in os.environ for v in (*OFFLINE_VARS, "TRANSFORMERS_OFFLINE"))
    if user_chose:
        return
    for var in OFFLINE_VARS:
        os.environ[var] = "1"
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        config = sys.modules["datasets"].config
        config.HF_HUB_OFFLINE = config.HF_DATASETS_OFFLINE = True


def hub_is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def _load_dict(name: str, config: str | None, **kwargs: Any) -> Any:
    from datasets import DatasetDict, load_dataset  # lazy: heavy (datasets)

    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    try:
        loaded = load_dataset(name, config, **kwargs)
    except Exception as exc:
        hint = ("offline mode is on (HF_HUB_OFFLINE=1): set HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0 to reach "
                "the hub, or" if hub_is_offline() else "check the name, or")
        raise RuntimeError(
            f"could not load Hugging Face dataset {name!r}" + (f" config {config!r}" if config else "")
            + f": {type(exc).__name__}: {exc}. {hint} read local files with `hf:csv` / `hf:parquet` / "
            "`hf:json` and dataset_options `data_files`") from exc
    return loaded if isinstance(loaded, DatasetDict) else DatasetDict(train=loaded)


def _pick_text_column(features: dict[str, Any], label_column: str) -> str:
    for name in TEXT_COLUMNS:
        if name in features:
            return name
    strings = [c for c, f in features.items()
               if c != label_column and getattr(f, "dtype", None) in ("string", "large_string")]
    if not strings:
        raise ValueError(f"no text column found among {sorted(features)}; set dataset_options text_column")
    return strings[0]


def _image_column(features: dict[str, Any]) -> str | None:
    return next((c for c, f in features.items() if type(f).__name__ == "Image"), None)


def _images(values: Sequence[Any]) -> np.ndarray:
    """PIL images or arrays -> float32 (N, C, H, W) in [-1, 1], the scaling the image loaders use."""
    arrays = [np.asarray(v) for v in values]
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise ValueError(f"images of different sizes {sorted(shapes)[:3]}...; resize them before loading")
    x = np.stack(arrays).astype(np.float32)
    x = x[:, None] if x.ndim == 3 else np.moveaxis(x, -1, 1)
    return (x / (255.0 if x.max() > 1.0 else 1.0) - 0.5) / 0.5


class _Labels:
    """Label values -> 0..K-1: ClassLabel as is, integers as is, anything else by sorted value."""

    def __init__(self, feature: Any, values: list[Any]) -> None:
        self.names: list[str] | None = getattr(feature, "names", None)
        labelled = [v for v in values if not self.unlabelled(v)]
        if not labelled:
            raise ValueError("the train split has no labels")
        self.mapping: dict[Any, int] | None = None
        if self.names is None and not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                          for v in labelled):
            self.mapping = {v: i for i, v in enumerate(sorted(set(labelled), key=str))}
        self.num_classes = (len(self.names) if self.names is not None else
                            len(self.mapping) if self.mapping is not None else int(max(labelled)) + 1)

    @staticmethod
    def unlabelled(v: Any) -> bool:  # GLUE-style test splits carry -1
        return v is None or (isinstance(v, (int, np.integer)) and v < 0)

    def encode(self, values: list[Any]) -> np.ndarray:
        if self.mapping is None:
            return np.asarray(values, dtype=np.int64)
        unknown = {v for v in values if v not in self.mapping}
        if unknown:
            raise ValueError(f"labels {sorted(map(str, unknown))[:5]} do not occur in the train split")
        return np.asarray([self.mapping[v] for v in values], dtype=np.int64)


@dataset("hf", "text", "any Hugging Face dataset via datasets.load_dataset (hub when online; local "
          "csv/parquet/json with data_files); options text_column/image_column/label_column, splits",
          prefix=True)
def hf_dataset(rest: str, *, text_column: str | list[str] | None = None, label_column: str = "label",
               image_column: str | None = None, train_split: str = "train", val_split: str | None = None,
               test_split: str | None = None, data_files: Any = None, data_dir: str | None = None,
               revision: str | None = None, cache_dir: str | None = None, text_separator: str = " ",
               test_fraction: float = 0.2, val_fraction: float = 0.0, split_seed: int = 0) -> Splits:
    """Which split is which, deterministically: `test` is `test_split`, else a fully labelled `test`
    split, else the hub's `validation` split (GLUE's test labels are hidden), else `test_fraction` of
    train; `val` is `val_split`, else an unused `validation` split, else `val_fraction` of train."""
    hub_offline_default()
    name, _, config = rest.partition(":")
    dd = _load_dict(name, config or None, data_files=data_files, data_dir=data_dir, revision=revision,
                    cache_dir=cache_dir)
    for wanted in (train_split, val_split, test_split):
        if wanted is not None and wanted not in dd:
            raise ValueError(f"split {wanted!r} not in dataset {rest!r}; it has {sorted(dd)}")
    features = dict(dd[train_split].features)
    if label_column not in features:
        raise ValueError(f"label column {label_column!r} not in {sorted(features)}; set dataset_options "
                         "label_column")
    image_column = image_column or (None if text_column else _image_column(features))
    kind = "image" if image_column else "text"
    columns = [image_column] if image_column else (
        [text_column] if isinstance(text_column, str) else list(text_column or [])) or [
        _pick_text_column(features, label_column)]
    for col in columns:
        if col not in features:
            raise ValueError(f"column {col!r} not in {sorted(features)}")
    labels = _Labels(features[label_column], list(dd[train_split][label_column]))

    def labelled(split_name: str) -> bool:
        return not any(_Labels.unlabelled(v) for v in dd[split_name][label_column])

    def to_split(split_name: str) -> Split:
        ds = dd[split_name]
        keep = np.flatnonzero([not _Labels.unlabelled(v) for v in ds[label_column]])
        ds = ds.select(keep) if len(keep) < len(ds) else ds
        if kind == "image":
            inputs: Any = _images(list(ds[image_column]))
        else:
            cols = [list(ds[c]) for c in columns]
            inputs = [text_separator.join("" if v is None else str(v) for v in row) for row in zip(*cols, strict=True)]
        return Split(inputs, labels.encode(list(ds[label_column])))

    val_name = val_split or next((s for s in VAL_SPLITS if s in dd and s != test_split), None)
    test_name = test_split or ("test" if "test" in dd and labelled("test") else None)
    if test_name is None and val_split is None and val_name is not None:
        test_name, val_name = val_name, None
    train = to_split(train_split)
    if test_name is None:
        train, val_carved, test = three_way(train.inputs, train.labels, test_fraction=test_fraction,
                                            val_fraction=0.0 if val_name else val_fraction, seed=split_seed)
        val = to_split(val_name) if val_name else val_carved
    else:
        test = to_split(test_name)
        if val_name is not None:
            val = to_split(val_name)
        else:
            train, val = split_off(train, val_fraction, split_seed + 1)
    shape = tuple(int(s) for s in train.inputs.shape[1:]) if kind == "image" else None
    return Splits(f"hf:{rest}", kind, labels.num_classes, train, val, test, shape)
