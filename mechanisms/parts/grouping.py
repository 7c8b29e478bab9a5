"""Rows grouped before clipping: one privacy unit may own several rows of a step.

Two honest routes need it, and share this one implementation:

- **Declared privacy units** (user-level DP): a dataset gives each training row a unit id (`Split.units`).
  The sampler then draws units, not rows (its `dataset_size` is the number of units, so the plan's q and T
  are the units'), every row of a drawn unit joins the step, and the unit's rows are clipped together: the
  clipped quantity is the SUM of the unit's per-row gradients. One unit moves the step's clipped sum by at most
  the clip bound, whatever number of rows it owns, so the accountant's event (over units) is what runs.
- **Augmentation with multiplicity** (De et al. 2022, arXiv 2204.13650): each drawn record is augmented K times
  (`augment_crop_flip`), and the K per-row gradients are AVERAGED before clipping. The record's contribution
  stays within the bound and the accounting is unchanged (the K rows are one record's).

Both are a `RowGroups`: each row's group in the step, and the factor the group's rows are summed with (1 for a
unit, 1/K for K augmentations). The engines then clip groups exactly as they clip examples: the book-keeping
engine lays a group's rows out as one example's positions (`regroup`), Opacus' per-row gradients are summed per
group (`group_rows`). `Units` maps the sampler's unit indices to rows.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch loads when a step is drawn, not when a plan is made
    import torch


@dataclasses.dataclass(frozen=True)
class RowGroups:
    """One step's grouping: `index[r]` is row r's group in [0, count), a device tensor; `count` is a host integer
    (no synchronisation to read it); each group's gradient is `scale` times the sum of its rows' gradients.
    `slot[r]` is row r's place among its group's rows, below `width` (a host integer, at least the largest
    group): where the book-keeping engine puts it when it lays a group's rows out as one example's positions."""

    index: torch.Tensor
    count: int
    scale: float = 1.0
    slot: torch.Tensor | None = None
    width: int = 1

    @classmethod
    def of(cls, group: np.ndarray, count: int, scale: float = 1.0) -> RowGroups:
        """The grouping of rows whose groups are `group` (host integers in [0, count)), slots in row order."""
        import torch  # lazy: heavy (torch)

        group = np.asarray(group, dtype=np.int64)
        order = np.argsort(group, kind="stable")
        sizes = np.bincount(group, minlength=count)
        slot = np.empty_like(group)
        slot[order] = np.arange(len(group)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        return cls(torch.from_numpy(group), count, scale, torch.from_numpy(slot), max(1, int(sizes.max(initial=1))))


def regroup(x: torch.Tensor, groups: RowGroups, scaled: bool = False) -> torch.Tensor:
    """Rows (B, T, k) laid out as groups (count, width * T, k): a group's rows become the positions of one
    example (zeros where a group has fewer rows than `width`), times `scale` when `scaled`. A layer's per-example
    gradient sum_t g_t a_t^T over these positions is the group's, scale * sum over its rows: the engine's norms
    and clipped sums of an example then hold for the group, unchanged."""
    if groups.slot is None:
        raise ValueError("rows grouped for the book-keeping engine need each row's slot in its group")
    if x.shape[0] != groups.index.shape[0]:
        raise RuntimeError(f"book-keeping: a layer saw a leading dimension of {x.shape[0]}, the step has "
                           f"{groups.index.shape[0]} rows in {groups.count} groups")
    out = x.new_zeros((groups.count, groups.width, *x.shape[1:]))
    out[groups.index, groups.slot] = x * groups.scale if scaled and groups.scale != 1.0 else x
    return out.reshape(groups.count, groups.width * x.shape[1], *x.shape[2:])


def group_rows(per_row: torch.Tensor, groups: RowGroups) -> torch.Tensor:
    """Per-group values (count, ...) from per-row ones (rows, ...): scale * sum of the group's rows."""
    import torch  # lazy: heavy (torch)

    out = torch.zeros((groups.count, *per_row.shape[1:]), dtype=per_row.dtype, device=per_row.device)
    out.index_add_(0, groups.index.to(per_row.device), per_row)
    return out if groups.scale == 1.0 else out.mul_(groups.scale)


@dataclasses.dataclass(frozen=True, eq=False)
class Units:
    """The privacy units of a training set: `unit[r]` in [0, count) is row r's unit (the declared ids numbered in
    their sorted order), and each unit's rows, in row order, as one host array cut by `offsets`."""

    unit: np.ndarray
    rows: np.ndarray
    offsets: np.ndarray

    @classmethod
    def of(cls, ids: np.ndarray) -> Units:
        """Units from one id per row (any hashable numpy dtype: integers, strings)."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or len(ids) == 0:
            raise ValueError(f"units must give one id per training row, got an array of shape {ids.shape}")
        _, unit = np.unique(ids, return_inverse=True)
        unit = unit.reshape(-1).astype(np.int64)
        rows = np.argsort(unit, kind="stable")
        offsets = np.concatenate([[0], np.cumsum(np.bincount(unit))]).astype(np.int64)
        return cls(unit, rows, offsets)

    @property
    def count(self) -> int:
        return len(self.offsets) - 1

    @property
    def largest(self) -> int:
        """The most rows one unit owns."""
        return int(np.diff(self.offsets).max())

    def expand(self, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows of the units `chosen` (host indices), each row's group (the unit's position in `chosen`) and
        its place among the unit's rows."""
        starts, ends = self.offsets[chosen], self.offsets[chosen + 1]
        sizes = ends - starts
        group = np.repeat(np.arange(len(chosen), dtype=np.int64), sizes)
        within = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        return self.rows[np.repeat(starts, sizes) + within], group, within


def augment_crop_flip(images: torch.Tensor, generator: torch.Generator, padding: int) -> torch.Tensor:
    """Each image (N, C, H, W) randomly cropped back to H x W from its zero-padded copy (`padding` pixels on every
    side) and flipped left-right with probability 1/2, independently per image: De et al.'s augmentation, a
    per-record transform (one image's copies never read another image). Drawn on the images' device, no host
    synchronisation."""
    import torch  # lazy: heavy (torch)

    if images.dim() != 4:
        raise ValueError(f"augmentation with multiplicity needs image inputs (N, C, H, W), got shape "
                         f"{tuple(images.shape)}")
    n, _, h, w = images.shape
    device = images.device
    padded = torch.nn.functional.pad(images, (padding, padding, padding, padding))
    dy = torch.randint(0, 2 * padding + 1, (n, 1), generator=generator, device=device)
    dx = torch.randint(0, 2 * padding + 1, (n, 1), generator=generator, device=device)
    flip = torch.rand((n, 1), generator=generator, device=device) < 0.5
    cols = torch.arange(w, device=device).unsqueeze(0)
    cols = torch.where(flip, w - 1 - cols, cols) + dx  # (n, W): a flipped image reads its columns backwards
    rows = torch.arange(h, device=device).unsqueeze(0) + dy  # (n, H)
    picked = padded[torch.arange(n, device=device)[:, None, None], :, rows[:, :, None], cols[:, None, :]]
    return picked.permute(0, 3, 1, 2).contiguous()  # advanced indexing put the channels last


def crop_padding(height: int) -> int:
    """The crop's padding for images `height` pixels high: 4 for 32 (De et al.'s CIFAR-10 setting), 1 for 8."""
    return max(1, round(height / 8))


__all__ = ["RowGroups", "Units", "augment_crop_flip", "crop_padding", "group_rows", "regroup"]
