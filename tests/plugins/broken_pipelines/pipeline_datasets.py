"""Datasets that leak around the mechanism, written as a researcher's plugin would be.

- digits-shifted9: each training image and its 8 one-pixel shifts, stored as 9 rows: one person in 9 rows (several
  rows from one record).
- digits-standardised: pixels standardised with the training split's mean and std: one record moves every row (data-
  derived normalisation).
- digits-pairs: each row the average of two training images: one record in two rows (rows derived from several
  records).
"""

from __future__ import annotations

import numpy as np

from workers.datasets import dataset, load
from workers.datasets.contract import Split, Splits


def _digits() -> Splits:
    return load("digits")


def _shifts(images: np.ndarray) -> np.ndarray:
    """Each (1, 8, 8) image and its 8 one-pixel shifts (edges filled with the background, -1)."""
    out = []
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            shifted = np.full_like(images, -1.0)
            src = images[:, :, max(0, -dy):8 - max(0, dy), max(0, -dx):8 - max(0, dx)]
            shifted[:, :, max(0, dy):8 - max(0, -dy), max(0, dx):8 - max(0, -dx)] = src
            out.append(shifted)
    return np.stack(out, 1).reshape(-1, *images.shape[1:])


@dataset("digits-shifted9", "image", "digits, each training image with its 8 one-pixel shifts as 9 rows")
def digits_shifted9() -> Splits:
    d = _digits()
    train = Split(_shifts(d.train.inputs).astype(np.float32), np.repeat(d.train.labels, 9))
    return Splits("digits-shifted9", "image", 10, train, d.val, d.test, d.input_shape)


@dataset("digits-standardised", "image", "digits standardised with the training split's mean and std")
def digits_standardised() -> Splits:
    d = _digits()
    mean, std = d.train.inputs.mean(0), d.train.inputs.std(0) + 1e-3

    def scale(s: Split) -> Split:
        return Split(((s.inputs - mean) / std).astype(np.float32), s.labels)

    return Splits("digits-standardised", "image", 10, scale(d.train), scale(d.val), scale(d.test), d.input_shape)


@dataset("digits-pairs", "image", "digits whose training rows each average two training images")
def digits_pairs() -> Splits:
    d = _digits()
    x, y = d.train.inputs, d.train.labels
    mixed = ((x + np.roll(x, 1, axis=0)) / 2).astype(np.float32)
    return Splits("digits-pairs", "image", 10, Split(mixed, y), d.val, d.test, d.input_shape)


# correct pipelines: the checkable shape (records plus a per-record transform) and declared privacy units
def _digit_records() -> Splits:
    """digits' records: scikit-learn's 0-16 intensities as stored, one (8, 8) image per record."""
    from sklearn.datasets import load_digits

    from workers.datasets.contract import three_way

    d = load_digits()
    train, val, test = three_way(d.images.astype(np.float32), d.target.astype(np.int64), test_fraction=0.2,
                                 val_fraction=0.0, seed=0)
    return Splits("digits-records", "image", 10, train, val, test, (1, 8, 8))


def contrast_rows(records: np.ndarray) -> np.ndarray:
    """Each record scaled by its own range (a per-record contrast stretch), never by the training set's."""
    x = records.reshape(len(records), 64)
    low, high = x.min(1, keepdims=True, initial=np.inf), x.max(1, keepdims=True, initial=-np.inf)
    return (2 * (x - low) / np.maximum(high - low, 1e-6) - 1).reshape(-1, 1, 8, 8).astype(np.float32)


@dataset("digits-records", "image", "digits as records, each contrast-stretched by a per-record transform",
         transform=contrast_rows)
def digits_records() -> Splits:
    return _digit_records()


@dataset("digits-units", "image", "digits whose writers own two rows each (an image and its mirror): declared units",
         transform=contrast_rows)
def digits_units() -> Splits:
    d = _digit_records()
    x, y = d.train.inputs, d.train.labels
    rows = np.concatenate([x, x[:, :, ::-1]])
    train = Split(rows, np.concatenate([y, y]), units=np.concatenate([np.arange(len(y))] * 2))
    return Splits("digits-units", "image", 10, train, d.val, d.test, d.input_shape)
