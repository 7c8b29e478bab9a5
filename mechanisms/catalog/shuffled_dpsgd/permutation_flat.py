"""The shuffle as it acts on flat gradient vectors: what the auditor's `privatize_step` releases.

An audit draws many independent one-step releases, each a row of a NumPy array, so the permutation
is applied per row, vectorised over rows (torch's per-tensor `permute_` would be one Python call per
row). Three groups, from the analysis' idealisation down to the real mechanism:

- `full`: a uniform permutation of all d coordinates (the symmetric group S_d). Theorem 6 reasons
  about this idealisation (every coordinate can land anywhere: "shuffle ratio 100%"), and the
  adaptive audit of docs/mechanisms.md runs against it.
- `blocks`: the real group. The row is read as consecutive synthetic transformer blocks (nn.Linear
  layout: q, k, v, o, fc1, fc2 weights and biases, see `FlatBlock`), each permuted as
  `permutation.permute_` permutes an HF block; coordinates after the last whole block stand for
  embeddings, LayerNorms and heads and are not moved.
- `none`: no permutation (the unshuffled mechanism).
"""

from __future__ import annotations

import dataclasses

import numpy as np

FLAT_PERMUTATIONS = ("full", "blocks", "none")


def _row_perms(rng: np.random.Generator, rows: int, groups: int, size: int) -> np.ndarray:
    """(rows, groups, size) independent uniform permutations of range(size)."""
    return np.argsort(rng.random((rows, groups, size)), axis=-1)


@dataclasses.dataclass(frozen=True)
class FlatBlock:
    """One synthetic block: hidden size `heads * head_dim`, MLP width `ffn`, laid out flat in this order:
    q.w [D, D], q.b [D], k.w, k.b, v.w, v.b, o.w [D, D], o.b [D], fc1.w [F, D], fc1.b [F], fc2.w [D, F], fc2.b [D].
    """

    heads: int = 2
    head_dim: int = 4
    ffn: int = 16

    def __post_init__(self) -> None:
        if min(self.heads, self.head_dim, self.ffn) < 1:
            raise ValueError(f"heads, head_dim and ffn must be >= 1, got {self}")

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    @property
    def size(self) -> int:
        d, f = self.hidden, self.ffn
        return 4 * (d * d + d) + (f * d + f) + (d * f + d)

    def index(self, rng: np.random.Generator, rows: int) -> np.ndarray:
        """(rows, size) gather indices: released[:, j] = row[:, index[:, j]], one fresh draw per row."""
        h, dh, d, f = self.heads, self.head_dim, self.hidden, self.ffn
        head_offsets = np.arange(h)[None, :, None] * dh
        qk = (_row_perms(rng, rows, h, dh) + head_offsets).reshape(rows, d)
        v = (_row_perms(rng, rows, 1, dh) + head_offsets).reshape(rows, d)  # P_2, shared by the heads
        mlp = _row_perms(rng, rows, 1, f).reshape(rows, f)
        parts, offset = [], 0

        def rows_of(perm: np.ndarray, width: int) -> None:  # weight [n, width], rows permuted, then its bias
            nonlocal offset
            n = perm.shape[1]
            parts.append((offset + perm[:, :, None] * width + np.arange(width)[None, None, :]).reshape(rows, -1))
            parts.append(offset + n * width + perm)
            offset += n * width + n

        def cols_of(perm: np.ndarray, height: int) -> None:  # weight [height, n], columns permuted; bias fixed
            nonlocal offset
            n = perm.shape[1]
            parts.append((offset + np.arange(height)[None, :, None] * n + perm[:, None, :]).reshape(rows, -1))
            parts.append(np.broadcast_to(offset + height * n + np.arange(height), (rows, height)))
            offset += height * n + height

        rows_of(qk, d)
        rows_of(qk, d)
        rows_of(v, d)
        cols_of(v, d)
        rows_of(mlp, d)
        cols_of(mlp, d)
        return np.concatenate(parts, axis=1)


def permute_rows(released: np.ndarray, rng: np.random.Generator, kind: str = "full",
                 block: FlatBlock | None = None) -> np.ndarray:
    """Apply an independent draw of the `kind` group to every row of a (rows, d) array."""
    if kind not in FLAT_PERMUTATIONS:
        raise ValueError(f"flat_permutation must be one of {FLAT_PERMUTATIONS}, got {kind!r}")
    released = np.asarray(released)
    if kind == "none":
        return released
    if kind == "full":
        return rng.permuted(released, axis=1)
    block = block or FlatBlock()
    rows, d = released.shape
    n_blocks = d // block.size
    if n_blocks == 0:
        raise ValueError(f"a row of {d} values holds no whole block of {block.size} ({block}); "
                         "raise the dimension or shrink the block")
    out = released.copy()
    for b in range(n_blocks):
        lo = b * block.size
        idx = block.index(rng, rows)
        out[:, lo:lo + block.size] = np.take_along_axis(released[:, lo:lo + block.size], idx, axis=1)
    return out
