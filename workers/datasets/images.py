"""Image datasets that work offline: Fashion-MNIST (Debian package), scikit-learn digits, synthetic."""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Literal

import numpy as np

from workers.datasets.contract import Split, Splits, dataset, records_are_rows, split_off, three_way

FASHION_MNIST_DIR = Path(os.environ.get("PRIVBENCH_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))


def _read_idx_gz(path: Path) -> np.ndarray:
    data = gzip.open(path, "rb").read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


Scaling = Literal["symmetric", "unit"]


def as_images(pixels: np.ndarray, scale: float, scaling: Scaling = "symmetric") -> np.ndarray:
    """uint8 (N, H, W) -> float32 (N, 1, H, W), scaled with fixed constants (no data peeking): `symmetric`
    to [-1, 1], `unit` to [0, 1] (torchvision's `ToTensor`, what published MNIST code usually feeds).
    In place on one float32 copy: the same operations in the same order, so the same bits, without three more
    temporaries of the whole set (their first-touch page faults cost Fashion-MNIST's 60k images 0.5-1.4 CPU s,
    paid by every fresh worker's plan and training phases)."""
    # a copy (the caller's array is left as it was) given its channel axis by a reshape, not `[:, None]`: a new
    # axis of stride 0 is legal, but Opacus' convolution rule computed other per-sample gradients from such a
    # tensor (norms 25% low on cnn-small), so the rows keep the canonical layout whatever splits them later
    x = pixels.astype(np.float32).reshape(len(pixels), 1, *pixels.shape[1:])
    x /= scale
    if scaling != "unit":
        x -= 0.5
        x /= 0.5
    return x


def grey_rows(records: np.ndarray, scaling: Scaling = "symmetric") -> np.ndarray:
    """The per-record transform of the 8-bit grey image datasets: stored bytes (N, H, W) -> images, each
    scaled alone by fixed constants (`as_images`)."""
    return as_images(records, 255.0, scaling)


def digit_rows(records: np.ndarray) -> np.ndarray:
    """digits' per-record transform: scikit-learn's 0-16 intensities (N, 8, 8) -> images in [-1, 1]."""
    return as_images(records, 16.0)


@dataset("fashion-mnist", "image", "Zalando Fashion-MNIST, 60k train / 10k test, 28x28 grey, 10 classes "
          "(Debian package dataset-fashion-mnist)", transform=grey_rows)
def fashion_mnist(val_fraction: float = 0.0, split_seed: int = 0, scaling: Scaling = "symmetric") -> Splits:
    root = FASHION_MNIST_DIR
    files = {s: (root / f"{s}-images-idx3-ubyte.gz", root / f"{s}-labels-idx1-ubyte.gz")
             for s in ("train", "t10k")}
    missing = [str(f) for pair in files.values() for f in pair if not f.exists()]
    if missing:
        raise FileNotFoundError(
            f"Fashion-MNIST not found ({missing[0]}); install it with "
            "`apt-get update && apt-get install -y dataset-fashion-mnist` or set PRIVBENCH_FASHION_MNIST")
    (xi, yi), (ti, tl) = ((_read_idx_gz(a), _read_idx_gz(b)) for a, b in files.values())
    del scaling  # the transform's option (`grey_rows`)
    train, val = split_off(Split(xi, yi.astype(np.int64)), val_fraction, split_seed)
    test = Split(ti, tl.astype(np.int64))
    return Splits("fashion-mnist", "image", 10, train, val, test, (1, 28, 28))


@dataset("digits", "image", "scikit-learn handwritten digits, 1,797 images 8x8, 10 classes (bundled)",
         transform=digit_rows)
def digits(test_fraction: float = 0.2, val_fraction: float = 0.0, split_seed: int = 0) -> Splits:
    from sklearn.datasets import load_digits  # lazy: heavy (sklearn)

    d = load_digits()
    train, val, test = three_way(d.images.astype(np.float32), d.target.astype(np.int64), test_fraction=test_fraction,
                                 val_fraction=val_fraction, seed=split_seed)
    return Splits("digits", "image", 10, train, val, test, (1, 8, 8))


@dataset("synthetic", "image", "generated class prototypes plus noise, 1x16x16, any size (seeded)",
         transform=records_are_rows)
def synthetic(n_train: int = 2000, n_test: int = 500, num_classes: int = 4, side: int = 16,
              noise: float = 1.0, val_fraction: float = 0.0, split_seed: int = 0) -> Splits:
    """A planted signal: accuracy well above chance, so DP-vs-non-DP gaps mean something."""
    rng = np.random.default_rng(split_seed)
    prototypes = rng.standard_normal((num_classes, 1, side, side)).astype(np.float32)

    def draw(n: int) -> Split:
        y = rng.integers(0, num_classes, n)
        x = prototypes[y] + noise * rng.standard_normal((n, 1, side, side)).astype(np.float32)
        return Split(x.astype(np.float32), y.astype(np.int64))

    train, val = split_off(draw(n_train), val_fraction, split_seed)
    return Splits("synthetic", "image", num_classes, train, val, draw(n_test), (1, side, side))
