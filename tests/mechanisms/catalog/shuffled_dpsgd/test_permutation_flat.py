"""mechanisms/catalog/shuffled_dpsgd/permutation_flat.py: the flat form of the coupled permutation that
`privatize_step` applies to released rows. A block permutation keeps the function of a transformer block written
in numpy from the flat weights alone (the reference); a full permutation is drawn per row and breaks it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.catalog.shuffled_dpsgd.permutation_flat import FlatBlock, permute_rows


def _flat_block_forward(flat: np.ndarray, block: FlatBlock, x: np.ndarray) -> np.ndarray:
    """A numpy transformer block (attention, then a tanh MLP) whose weights are read from `flat`."""
    d, f, h, dh = block.hidden, block.ffn, block.heads, block.head_dim
    sizes = [d * d, d, d * d, d, d * d, d, d * d, d, f * d, f, d * f, d]
    wq, bq, wk, bk, wv, bv, wo, bo, w1, b1, w2, b2 = np.split(flat, np.cumsum(sizes)[:-1])
    wq, wk, wv, wo = (w.reshape(d, d) for w in (wq, wk, wv, wo))
    w1, w2 = w1.reshape(f, d), w2.reshape(d, f)
    q, k, v = x @ wq.T + bq, x @ wk.T + bk, x @ wv.T + bv
    heads = []
    for i in range(h):
        s = slice(i * dh, (i + 1) * dh)
        scores = q[:, s] @ k[:, s].T / math.sqrt(dh)
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        heads.append(weights / weights.sum(axis=1, keepdims=True) @ v[:, s])
    y = np.concatenate(heads, axis=1) @ wo.T + bo
    return np.tanh(y @ w1.T + b1) @ w2.T + b2


@settings(max_examples=20, deadline=None)
@given(heads=st.integers(1, 3), head_dim=st.integers(1, 4), ffn=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_flat_block_permutation_keeps_the_numpy_block_function(heads, head_dim, ffn, seed):
    block = FlatBlock(heads, head_dim, ffn)
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((3, block.size))
    x = rng.standard_normal((5, block.hidden))
    idx = block.index(rng, 3)
    assert np.array_equal(np.sort(idx, axis=1), np.tile(np.arange(block.size), (3, 1)))
    permuted = permute_rows(rows, rng, "blocks", block)
    for before, after in zip(rows, permuted, strict=True):
        assert np.allclose(_flat_block_forward(before, block, x), _flat_block_forward(after, block, x), atol=1e-10)


def test_flat_full_permutation_is_per_row_and_breaks_the_block_function():
    block = FlatBlock(2, 3, 5)
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((4, block.size + 7))
    full = permute_rows(rows, rng, "full")
    assert np.array_equal(np.sort(full, axis=1), np.sort(rows, axis=1))
    assert not np.array_equal(full[0] - rows[0], full[1] - rows[1])  # independent draws per row
    x = rng.standard_normal((5, block.hidden))
    assert not np.allclose(_flat_block_forward(full[0, :block.size], block, x),
                           _flat_block_forward(rows[0, :block.size], block, x))
    blocks = permute_rows(rows, rng, "blocks", block)
    assert np.array_equal(blocks[:, block.size:], rows[:, block.size:])  # the tail stands for embeddings etc.
    assert np.array_equal(permute_rows(rows, rng, "none"), rows)
    with pytest.raises(ValueError, match="no whole block"):
        permute_rows(rows[:, :10], rng, "blocks", block)
    with pytest.raises(ValueError, match="flat_permutation"):
        permute_rows(rows, rng, "rows")

