"""Mechanisms whose plan-time hooks read the private training set, written through the public contract.

- median-clip: `parts()` sets the clip to the median per-example input norm of the training set (data-dependent plan
  parameter).
- claim-extras: `claim()` writes the class counts and the mean image into `Claim.extra` (private values written into
  the record).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mechanisms.catalog.dpsgd import DpSgd
from mechanisms.framework.mechanism import Claim


def _training_set() -> Any:
    from workers.datasets import load

    return load("digits").train


class MedianClip(DpSgd):
    """DP-SGD whose clip is the median norm of the training images (the record stores the clip)."""

    ID = "median-clip"

    def parts(self, spec: Any, options: Any) -> Any:
        from mechanisms.parts.clipping import FlatClipping
        from mechanisms.parts.noise_addition import GaussianNoise
        from mechanisms.parts.plan import Parts

        x = _training_set().inputs
        clip = float(np.median(np.linalg.norm(x.reshape(len(x), -1), axis=1))) / 8.0
        return Parts(spec.batch_selection, FlatClipping(clip), GaussianNoise(clip))


class ClaimExtras(DpSgd):
    """DP-SGD whose claim carries the training set's class counts and mean image as extras."""

    ID = "claim-extras"

    def claim(self, sigma: float, spec: Any, options: Any, parts: Any, certified: float | None) -> Claim:
        train = _training_set()
        counts = np.bincount(train.labels, minlength=10).tolist()
        return Claim(certified, "dp-sgd's analysis", {"class_counts": counts,
                                                      "mean_image": train.inputs.mean(0).ravel().round(4).tolist()})


median_clip = MedianClip()
claim_extras = ClaimExtras()
