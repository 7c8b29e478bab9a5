"""The dataset registry offline: every entry loads, splits are deterministic and disjoint, `hf:` reads
local files through `datasets.load_dataset`, and bad names fail with a message listing what exists."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mechanisms.framework.registry import UnknownName
from workers import datasets
from workers.datasets.contract import Splits
from workers.datasets.text import AttributedSplit

SMALL = {"synthetic": {"n_train": 200, "n_test": 50}, "synthetic-text": {"n_train": 200, "n_test": 50}}
FIXED = ["breast-cancer", "digits", "fashion-mnist", "mnist", "mnist-5k", "rotten-tomatoes", "synthetic",
         "synthetic-text"]


def keys(split, kind: str) -> list[bytes]:
    """Hashable identity of each example, to test disjointness by content."""
    if kind == "text":
        return [t.encode() for t in split.inputs]
    return [np.ascontiguousarray(x).tobytes() for x in split.inputs]


@pytest.fixture(scope="module")
def loaded() -> dict[str, Splits]:
    return {name: datasets.load(name, SMALL.get(name)) for name in FIXED}


def test_every_fixed_entry_is_registered_and_listed():
    listed = datasets.names()
    assert set(FIXED) <= set(listed) and "hf:<name>" in listed
    kinds = {row[0]: row[1] for row in datasets.describe()}
    assert kinds["rotten-tomatoes"] == "text" and kinds["mnist-5k"] == "image" and kinds["synthetic-text"] == "text"
    assert kinds["breast-cancer"] == "tabular" and kinds["mnist"] == "image"


@pytest.mark.parametrize("name", FIXED)
def test_entry_loads_offline_with_consistent_shapes(loaded, name):
    s = loaded[name]
    assert s.name == name and len(s.train) > 0 and len(s.test) > 0
    for split in (s.train, s.val, s.test):
        assert split.labels.dtype == np.int64 and len(split.inputs) == len(split.labels)
        if len(split):
            assert split.labels.min() >= 0 and split.labels.max() < s.num_classes
    if s.kind == "text":
        assert isinstance(s.train.inputs, list) and all(isinstance(t, str) and t for t in s.train.inputs)
        assert s.input_shape is None
    else:
        assert s.train.inputs.dtype == np.float32 and s.train.inputs.shape[1:] == s.input_shape


def test_rotten_tomatoes_is_the_pang_lee_corpus(loaded):
    s = loaded["rotten-tomatoes"]
    sizes = s.sizes()
    assert sum(sizes.values()) == 12752  # unique fresh/rotten snippets
    assert sizes == {"train": 8927, "val": 1275, "test": 2550}
    assert s.num_classes == 2 and 0.55 < s.train.labels.mean() < 0.61  # 57.8% fresh
    assert "A three-hour cinema master class." in s.train.inputs + s.val.inputs + s.test.inputs


def test_mnist_5k_is_balanced_real_digits(loaded):
    s = loaded["mnist-5k"]
    assert sum(s.sizes().values()) == 5000 and s.input_shape == (1, 28, 28)
    allY = np.concatenate([s.train.labels, s.test.labels])
    assert np.bincount(allY).tolist() == [500] * 10
    assert -1.0 <= s.train.inputs.min() and s.train.inputs.max() <= 1.0 and s.train.inputs.std() > 0.3


def test_mnist_is_the_full_original_mnist(loaded):
    """The 60k/10k sets in the IDX files' order: their well-known class counts, and every `mnist-5k` digit
    (read from another package) among them byte for byte, so the pixels are the original ones."""
    s = loaded["mnist"]
    assert s.sizes() == {"train": 60000, "val": 0, "test": 10000} and s.input_shape == (1, 28, 28)
    assert np.bincount(s.train.labels).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert np.bincount(s.test.labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    found = {x.tobytes(): y for split in (s.train, s.test) for x, y in zip(split.inputs, split.labels, strict=True)}
    small = loaded["mnist-5k"]
    pairs = [(x.tobytes(), y) for split in (small.train, small.test) for x, y in zip(split.inputs, split.labels,
                                                                                      strict=True)]
    assert all(found.get(x) == y for x, y in pairs)


def test_mnist_pickle_may_build_arrays_only(tmp_path, monkeypatch):
    """The pickle is data: a global other than numpy's array builders is refused, not called."""
    import gzip
    import os
    import pickle

    from workers.datasets import mnist

    path = tmp_path / "mnist.pkl.gz"
    with gzip.open(path, "wb") as fh:
        pickle.dump((os.system, ("echo pwned",)), fh)  # a callable global, as a malicious file would hold
    monkeypatch.setattr(mnist, "mnist_path", lambda: path)
    with pytest.raises(pickle.UnpicklingError, match="refusing to load posix.system"):
        mnist.read_mnist()


@pytest.mark.parametrize("name", ["fashion-mnist", "mnist"])
def test_image_scaling_is_fixed_unit_or_symmetric(name):
    """`scaling: unit` is torchvision's ToTensor ([0, 1]); the default maps the same pixels to [-1, 1]."""
    unit, symmetric = (datasets.load(name, {"scaling": s}) for s in ("unit", "symmetric"))
    assert unit.test.inputs.min() == 0.0 and unit.test.inputs.max() == 1.0
    assert np.allclose(symmetric.test.inputs, 2 * unit.test.inputs - 1, atol=1e-6)
    assert datasets.option_problems(name, {"scaling": "standard"})  # a fixed list, checked by the grid


@pytest.mark.parametrize("scaling", ["unit", "symmetric"])
def test_as_images_gives_the_bits_of_the_plain_formula_and_leaves_its_input(scaling):
    """The in-place scaling is an optimisation only: every pixel value of every dtype the loaders pass gives the
    bits of (x / scale - 0.5) / 0.5, so a trial's data did not change with it; the caller's array is untouched."""
    from workers.datasets.images import as_images

    for pixels, scale in ((np.arange(256, dtype=np.uint8).reshape(4, 8, 8), 255.0),
                          (np.linspace(0, 16, 4 * 64, dtype=np.float32).reshape(4, 8, 8), 16.0)):
        kept = pixels.copy()
        x = pixels.astype(np.float32)[:, None] / scale
        expected = x if scaling == "unit" else (x - 0.5) / 0.5
        got = as_images(pixels, scale, scaling)
        assert got.dtype == np.float32 and got.shape == expected.shape
        assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
        assert np.array_equal(pixels, kept)


def test_breast_cancer_is_tabular_and_scaled_without_reading_the_data(loaded):
    from sklearn.datasets import load_breast_cancer

    s = loaded["breast-cancer"]
    assert s.kind == "tabular" and s.input_shape == (30,) and s.num_classes == 2
    assert s.sizes() == {"train": 455, "val": 0, "test": 114}
    raw = datasets.load("breast-cancer", {"scaling": "none"})
    assert np.allclose(s.train.inputs, np.log1p(raw.train.inputs))
    everything = load_breast_cancer().data.astype(np.float32)
    assert {x.tobytes() for x in raw.train.inputs} <= {x.tobytes() for x in everything}


@pytest.mark.parametrize("name", FIXED)
def test_splits_are_disjoint(loaded, name):
    s = loaded[name]
    train, val, test = (set(keys(x, s.kind)) for x in (s.train, s.val, s.test))
    assert not (train & test) and not (train & val) and not (val & test)


@pytest.mark.parametrize("name", ["rotten-tomatoes", "mnist-5k", "synthetic-text"])
def test_splits_depend_only_on_options(loaded, name):
    again = datasets.load(name, SMALL.get(name))
    first = loaded[name]
    for a, b in ((first.train, again.train), (first.val, again.val), (first.test, again.test)):
        assert keys(a, first.kind) == keys(b, first.kind) and np.array_equal(a.labels, b.labels)
    other = datasets.load(name, (SMALL.get(name) or {}) | {"split_seed": 1})
    assert keys(other.test, first.kind) != keys(first.test, first.kind)


def test_rotten_tomatoes_split_fractions_are_options():
    s = datasets.load("rotten-tomatoes", {"test_fraction": 0.1, "val_fraction": 0.0})
    assert s.sizes() == {"train": 11477, "val": 0, "test": 1275}


def test_synthetic_text_has_a_planted_signal_and_a_nuisance_attribute():
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    s = datasets.load("synthetic-text", {"n_train": 1500, "n_test": 500, "num_classes": 3})
    vec = CountVectorizer().fit(s.train.inputs)
    clf = LogisticRegression(max_iter=500).fit(vec.transform(s.train.inputs), s.train.labels)
    accuracy = clf.score(vec.transform(s.test.inputs), s.test.labels)
    assert 0.6 < accuracy < 1.0, accuracy  # far above chance (1/3), not trivially perfect
    assert isinstance(s.train, AttributedSplit) and isinstance(s.test, AttributedSplit)
    assert set(np.unique(s.train.attributes)) == {0, 1}
    # independent by default; tied to the label when asked
    assert abs(np.mean(s.train.attributes == s.train.labels % 2) - 0.5) < 0.06
    tied = datasets.load("synthetic-text", {"n_train": 400, "n_test": 10, "attribute_correlation": 1.0})
    assert np.array_equal(tied.train.attributes, tied.train.labels % 2)
    sub = tied.train.subset(np.arange(5))  # max_train_examples keeps the attribute aligned
    assert isinstance(sub, AttributedSplit) and np.array_equal(sub.attributes, sub.labels % 2)


def test_synthetic_text_rejects_bad_options():
    with pytest.raises(ValueError, match="classes"):
        datasets.load("synthetic-text", {"num_classes": 9})
    with pytest.raises(TypeError):
        datasets.load("synthetic-text", {"no_such_option": 1})


# ---- hf: through local files -------------------------------------------------------------------

def _frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    words = np.array(["good fun", "bad dull"])
    return pd.DataFrame({"sentence": [f"{words[v]} number {i}" for i, v in enumerate(y)], "label": y,
                         "idx": np.arange(n)})


def test_hf_parquet_with_train_and_test_files(tmp_path: Path):
    _frame(60, 0).to_parquet(tmp_path / "train.parquet")
    test = _frame(20, 1)
    test["sentence"] = "held out " + test["sentence"]
    test.to_parquet(tmp_path / "test.parquet")
    opts = {"data_files": {"train": str(tmp_path / "train.parquet"), "test": str(tmp_path / "test.parquet")},
            "cache_dir": str(tmp_path / "cache"), "val_fraction": 0.25}
    s = datasets.load("hf:parquet", opts)
    assert s.name == "hf:parquet" and s.kind == "text" and s.num_classes == 2
    assert s.sizes() == {"train": 45, "val": 15, "test": 20}
    assert all(t.startswith("held out ") for t in s.test.inputs)  # the file's test split is the test split
    assert not set(s.train.inputs) & set(s.val.inputs)
    again = datasets.load("hf:parquet", opts)
    assert again.train.inputs == s.train.inputs and again.val.inputs == s.val.inputs


def test_hf_csv_single_file_string_labels_and_column_mapping(tmp_path: Path):
    df = pd.DataFrame({"review": [f"text {i}" for i in range(50)], "title": ["t"] * 50,
                       "stars": ["neg", "pos", "neutral", "pos", "neg"] * 10})
    df.to_csv(tmp_path / "all.csv", index=False)
    s = datasets.load("hf:csv", {"data_files": str(tmp_path / "all.csv"), "cache_dir": str(tmp_path / "c"),
                                 "text_column": ["title", "review"], "label_column": "stars",
                                 "text_separator": " / ", "test_fraction": 0.2, "val_fraction": 0.2})
    assert s.num_classes == 3 and s.sizes() == {"train": 30, "val": 10, "test": 10}
    assert all(t.startswith("t / text ") for t in s.train.inputs)
    by_text = dict(zip(df["review"], df["stars"], strict=True))
    names = sorted({"neg", "pos", "neutral"})  # labels are numbered in sorted order
    for text, label in zip(s.train.inputs, s.train.labels, strict=True):
        assert names[label] == by_text[text.split(" / ")[1]]


def test_hf_unlabelled_test_split_falls_back_to_validation(tmp_path: Path):
    """GLUE publishes test rows with label -1: the validation split becomes the test split."""
    files = {}
    for split, n, labelled in (("train", 40, True), ("validation", 12, True), ("test", 10, False)):
        df = _frame(n, len(files))
        if not labelled:
            df["label"] = -1
        df["sentence"] = split + " " + df["sentence"]
        df.to_csv(tmp_path / f"{split}.csv", index=False)
        files[split] = str(tmp_path / f"{split}.csv")
    s = datasets.load("hf:csv", {"data_files": files, "cache_dir": str(tmp_path / "c"), "val_fraction": 0.25})
    assert all(t.startswith("validation ") for t in s.test.inputs) and len(s.test) == 12
    assert all(t.startswith("train ") for t in s.val.inputs + s.train.inputs) and len(s.val) == 10


def test_hf_images_from_arrays(tmp_path: Path):
    from datasets import Dataset

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (30, 8, 8), dtype=np.uint8)
    Dataset.from_dict({"img": [p for p in pixels], "label": rng.integers(0, 3, 30)}).to_parquet(
        str(tmp_path / "imgs.parquet"))
    s = datasets.load("hf:parquet", {"data_files": str(tmp_path / "imgs.parquet"), "image_column": "img",
                                     "cache_dir": str(tmp_path / "c")})
    assert s.kind == "image" and s.input_shape == (1, 8, 8) and s.train.inputs.dtype == np.float32
    assert len(s.train) + len(s.test) == 30 and -1.0 <= s.train.inputs.min() and s.train.inputs.max() <= 1.0


def test_hf_bad_columns_and_splits_name_what_exists(tmp_path: Path):
    _frame(20, 0).to_csv(tmp_path / "a.csv", index=False)
    opts = {"data_files": str(tmp_path / "a.csv"), "cache_dir": str(tmp_path / "c")}
    with pytest.raises(ValueError, match=r"label column 'target' not in \['idx', 'label', 'sentence'\]"):
        datasets.load("hf:csv", opts | {"label_column": "target"})
    with pytest.raises(ValueError, match=r"split 'dev' not in .*\['train'\]"):
        datasets.load("hf:csv", opts | {"val_split": "dev"})


def test_hf_hub_name_offline_fails_fast_with_a_hint(tmp_path: Path):
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="HF_HUB_OFFLINE=1.*hf:csv"):
        datasets.load("hf:privbench-test/no-such-dataset", {"cache_dir": str(tmp_path)})
    assert time.perf_counter() - t0 < 20  # offline mode: no 25 s of retries


def test_unknown_dataset_lists_what_exists():
    with pytest.raises(UnknownName) as err:
        datasets.load("rotten-potatoes")
    message = str(err.value)
    assert "unknown dataset 'rotten-potatoes'" in message
    for name in ("rotten-tomatoes", "mnist-5k", "synthetic-text", "hf:<name>"):
        assert name in message
    with pytest.raises(UnknownName):
        datasets.load("hf:")  # a prefix needs a name
