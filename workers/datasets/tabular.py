"""Tabular datasets (feature vectors) that work offline: scikit-learn's breast cancer (bundled)."""

from __future__ import annotations

from typing import Literal

import numpy as np

from workers.datasets.contract import Splits, dataset, three_way


def cancer_rows(records: np.ndarray, scaling: Literal["log1p", "none"] = "log1p") -> np.ndarray:
    """breast-cancer's per-record transform: each record's features through log(1 + x), or as they are."""
    return np.log1p(records) if scaling == "log1p" else records


@dataset("breast-cancer", "tabular", "Wisconsin diagnostic breast cancer, 569 examples x 30 features, 2 classes "
         "(scikit-learn, bundled)", transform=cancer_rows)
def breast_cancer(scaling: Literal["log1p", "none"] = "log1p", test_fraction: float = 0.2, val_fraction: float = 0.0,
                  split_seed: int = 0) -> Splits:
    """`scaling: log1p` maps every (non-negative) feature through log(1 + x), a fixed transform that brings
    areas in the thousands and smoothness in hundredths to a few units each without reading the data;
    standardising with the training split's mean and variance would release statistics of the private data
    that no accountant counts."""
    from sklearn.datasets import load_breast_cancer  # lazy: heavy (sklearn)

    d = load_breast_cancer()
    del scaling  # the transform's option (`cancer_rows`)
    x = d.data.astype(np.float32)
    train, val, test = three_way(x, d.target.astype(np.int64), test_fraction=test_fraction,
                                 val_fraction=val_fraction, seed=split_seed)
    return Splits("breast-cancer", "tabular", 2, train, val, test, (x.shape[1],))
