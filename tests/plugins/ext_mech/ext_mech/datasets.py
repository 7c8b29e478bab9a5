"""Gaussian blobs as tiny images: one prototype per class plus noise, deterministic in `split_seed`."""

from __future__ import annotations

import numpy as np

from workers.datasets import Splits, dataset
from workers.datasets.contract import records_are_rows, three_way


@dataset("ext-blobs", "image", "Gaussian blobs as 1x4x4 images, one prototype per class (seeded)",
         transform=records_are_rows)  # each generated image is its record: privbench checks the rows on a neighbour
def blobs(n: int = 600, num_classes: int = 3, noise: float = 0.5, split_seed: int = 0) -> Splits:
    rng = np.random.default_rng(split_seed)
    prototypes = rng.standard_normal((num_classes, 1, 4, 4)).astype(np.float32)
    labels = rng.integers(0, num_classes, n)
    images = prototypes[labels] + noise * rng.standard_normal((n, 1, 4, 4)).astype(np.float32)
    train, val, test = three_way(images, labels, test_fraction=0.25, val_fraction=0.0, seed=split_seed)
    return Splits("ext-blobs", "image", num_classes, train, val, test, (1, 4, 4))
