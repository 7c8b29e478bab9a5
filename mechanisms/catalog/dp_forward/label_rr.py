"""Label randomized response for DP-Forward (arXiv 2309.06746, section 3.4), applied ONCE per training example.

DP-Forward protects a training pair (X, y) by noising f(X) and by releasing y through K-ary randomized
response (Warner 1965): keep y with probability e^eps2 / (e^eps2 + K - 1), else report one of the other
K - 1 labels uniformly. The released code (`sanitize_labels`) perturbs the training set once before
training, so every epoch sees the same noisy label: the label costs eps2 once, not once per epoch.

Three things live here:
- `randomized_response` and `relabeled`: the mechanism itself, on numpy labels and on a dataset;
- `rr_event`: the dp-accounting event of what is released (for the certified, replace-one analysis);
- `shuffled_rr_epsilon`: the paper's *claimed* central cost of the labels ("only 0.03" on SST-2), i.e.
  N compositions of RR on a subsample of size one at rate q = 1/N, computed exactly (binomial sums).
"""

from __future__ import annotations

import math
from typing import Any

import dp_accounting
import numpy as np
import torch
from scipy import optimize, stats
from torch.utils.data import TensorDataset

from mechanisms.accounting.composition import rr_keep_probability

# Binomial tails below this mass are dropped from the exact sums and added to delta (so never optimistic).
_TAIL = 1e-16


def rr_noise_parameter(epsilon: float, num_classes: int) -> float:
    """dp-accounting's RR parameter p (output uniform over all K w.p. p) for our eps-RR: K / (e^eps + K - 1)."""
    keep = rr_keep_probability(epsilon, num_classes)
    return (1.0 - keep) * num_classes / (num_classes - 1)


def rr_event(epsilon: float, num_classes: int) -> dp_accounting.RandomizedResponseDpEvent:
    """The release of one label through eps-RR over K classes (replace-one adjacency in dp-accounting)."""
    return dp_accounting.RandomizedResponseDpEvent(rr_noise_parameter(epsilon, num_classes), num_classes)


def randomized_response(labels: np.ndarray, epsilon: float, num_classes: int,
                        rng: np.random.Generator) -> np.ndarray:
    """Each label kept w.p. e^eps / (e^eps + K - 1), else replaced by a uniform *other* label."""
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got range [{labels.min()}, {labels.max()}]")
    keep = rr_keep_probability(epsilon, num_classes)
    flip = rng.random(labels.shape) >= keep
    shift = rng.integers(1, num_classes, size=labels.shape)  # 1..K-1: never the true label
    return np.where(flip, (labels + shift) % num_classes, labels).astype(labels.dtype, copy=False)


def dataset_labels(dataset: Any) -> np.ndarray:
    """The labels of a map-style dataset whose items end with the label (TensorDataset: its last tensor)."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        return tensors[-1].detach().cpu().numpy()
    return np.asarray([int(dataset[i][-1]) for i in range(len(dataset))])


class RelabeledDataset:
    """A map-style dataset whose items are the base items with the last field (the label) replaced."""

    def __init__(self, base: Any, labels: Any) -> None:
        if len(base) != len(labels):
            raise ValueError(f"{len(labels)} labels for a dataset of {len(base)} items")
        self.base, self.labels = base, labels

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return (*tuple(self.base[index])[:-1], self.labels[index])


def relabeled(dataset: Any, labels: np.ndarray) -> Any:
    """The dataset with `labels` in place of its own (a TensorDataset stays one, so its batches can be gathered
    on the device)."""
    label_tensor = torch.as_tensor(labels)
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        out = TensorDataset(*tensors[:-1], label_tensor.to(tensors[-1].dtype))
        out.trim_by = getattr(dataset, "trim_by", None)  # type: ignore[attr-defined]
        return out
    return RelabeledDataset(dataset, label_tensor)


# ---- the paper's claimed central cost of the labels ------------------------------------------------


def _composed_delta(epsilon: float, steps: int, p_up: tuple[float, float], loss: tuple[float, float]) -> float:
    """E_upper[(1 - e^(eps - L))_+] over `steps` i.i.d. draws of a 3-outcome step (outcome 3 has loss 0).

    Outcome counts: m = M1 + M2 ~ Bin(T, p1 + p2), then M1 | m ~ Bin(m, p1 / (p1 + p2)); the total loss
    is L = M1 l1 + M2 l2. Binomial tails below `_TAIL` are skipped and their mass added to delta.
    """
    p1, p2 = p_up
    l1, l2 = loss
    p12 = p1 + p2
    if p12 >= 1.0 - 1e-12:  # K = 2: every step releases y or y'
        p12 = 1.0
        m_values = np.array([steps])
    else:
        lo, hi = stats.binom.ppf(_TAIL, steps, p12), stats.binom.isf(_TAIL, steps, p12)
        m_values = np.arange(int(lo), int(hi) + 1)
    weights = stats.binom.pmf(m_values, steps, p12) if p12 < 1.0 else np.ones(1)
    ratio = p1 / (p1 + p2)
    j_lo = int(max(stats.binom.ppf(_TAIL, m_values[0], ratio), 0))
    j_hi = int(stats.binom.isf(_TAIL, m_values[-1], ratio))
    j = np.arange(j_lo, j_hi + 1)[None, :]
    m = m_values[:, None]
    pj = np.where(j <= m, stats.binom.pmf(j, m, ratio), 0.0)  # (len(m), len(j)) grid, one scipy call
    big_l = j * l1 + (m - j) * l2
    total = float(weights @ np.sum(pj * -np.expm1(np.minimum(epsilon - big_l, 0.0)), axis=1))
    dropped = float(1.0 - weights @ pj.sum(axis=1))  # tails outside both truncations
    return total + max(dropped, 0.0)


def shuffled_rr_delta(epsilon: float, epsilon_labels: float, num_classes: int, dataset_size: int,
                      releases: int | None = None) -> float:
    """delta(eps) of `releases` (default N) steps of RR on a size-one subsample at rate q = 1/N.

    One step releases RR of one uniformly drawn example's label. Replacing the target's label y by y'
    (all others y' in the worst case) gives the pair (1 - q) Q + q P vs Q with P = RR(y), Q = RR(y'); both
    directions are evaluated and the larger delta is returned. Outcomes other than y, y' have loss 0.
    """
    n = int(dataset_size)
    steps = int(releases if releases is not None else n)
    q = 1.0 / n
    keep = rr_keep_probability(epsilon_labels, num_classes)
    a, b = keep, (1.0 - keep) / (num_classes - 1)
    mix = ((1 - q) * b + q * a, (1 - q) * a + q * b)  # P_mix on (y, y'); other outcomes b each
    remove = _composed_delta(epsilon, steps, mix, (math.log(mix[0] / b), math.log(mix[1] / a)))
    add = _composed_delta(epsilon, steps, (b, a), (math.log(b / mix[0]), math.log(a / mix[1])))
    return max(remove, add)


def shuffled_rr_epsilon(epsilon_labels: float, num_classes: int, dataset_size: int, delta: float,
                        releases: int | None = None) -> float:
    """The paper's central epsilon of the RR labels (Table 5: 'RR costs only 0.03' on SST-2), exactly.

    Smallest eps with `shuffled_rr_delta(eps) <= delta` (bisection; never below the root). With one
    example there is no subsampling: eps2 itself.
    """
    if dataset_size <= 1:
        return float(epsilon_labels)
    steps = int(releases if releases is not None else dataset_size)
    def gap(eps: float) -> float:
        return shuffled_rr_delta(eps, epsilon_labels, num_classes, dataset_size, steps) - delta

    if gap(0.0) <= 0:
        return 0.0
    hi = 1.0
    while gap(hi) > 0:
        hi *= 2
    eps = optimize.brentq(gap, 0.0, hi, xtol=1e-9, rtol=1e-9)
    while gap(eps) > 0:
        eps += 1e-9
    return float(eps)
