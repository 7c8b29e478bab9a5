"""Rows grouped before clipping (declared privacy units, augmentation with multiplicity), against references
written independently: per-unit gradients by a plain loop over units with autograd, and the unit-level
sensitivity measured on neighbouring datasets. How `make_private`'s loader draws units and augments, and training
with it, are tested with it (tests/mechanisms/framework/test_private_training.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import mechanisms
from mechanisms.framework.private_training import Grouping, make_private
from mechanisms.parts.grouping import RowGroups, Units, augment_crop_flip, group_rows
from mechanisms.parts.plan import PrivacySpec

CLIP = 1.0


def test_units_map_each_drawn_unit_to_all_its_rows():
    ids = np.array(["b", "a", "b", "c", "a", "a"])
    units = Units.of(ids)
    assert units.count == 3 and units.largest == 3
    rows, group, slot = units.expand(np.array([2, 0]))  # units c, then a (ids in sorted order: a, b, c)
    assert rows.tolist() == [3, 1, 4, 5] and group.tolist() == [0, 1, 1, 1] and slot.tolist() == [0, 0, 1, 2]
    for u in range(units.count):  # every row of a unit, and only those, by a loop over the rows
        expected = [r for r in range(len(ids)) if ids[r] == sorted(set(ids))[u]]
        assert units.expand(np.array([u]))[0].tolist() == expected


def test_units_need_one_id_per_row():
    with pytest.raises(ValueError, match="one id per training row"):
        Units.of(np.zeros((3, 2)))


def test_group_rows_is_the_scaled_sum_of_each_groups_rows():
    per_row = torch.randn(7, 3, 2, dtype=torch.float64)
    index = torch.tensor([2, 0, 2, 1, 0, 2, 1])
    out = group_rows(per_row, RowGroups(index, 4, 0.5))
    for g in range(4):
        assert torch.equal(out[g], 0.5 * per_row[index == g].sum(0))  # group 3 has no rows: zeros


def test_crop_and_flip_is_per_image_and_keeps_shapes():
    images = torch.rand(50, 3, 8, 8)
    out = augment_crop_flip(images, torch.Generator().manual_seed(0), padding=1)
    assert out.shape == images.shape
    for i in range(50):  # each output is a crop of its own padded image, or of its mirror image
        padded = nn.functional.pad(images[i], (1, 1, 1, 1))
        crops = [torch.flip(c, [-1]) if f else c for f in (False, True)
                 for dy in range(3) for dx in range(3) for c in [padded[:, dy:dy + 8, dx:dx + 8]]]
        assert any(torch.equal(out[i], c) for c in crops)
    with pytest.raises(ValueError, match=r"image inputs \(N, C, H, W\)"):
        augment_crop_flip(torch.rand(4, 64), torch.Generator(), padding=1)


# ---- the private step -------------------------------------------------------------------------------------
class SumsBeforeNoise:
    """Reads the clipped sum the noise is added to (a release observer sees `p.summed_grad`)."""

    def before_noise(self, optimizer):
        self.sums = [p.summed_grad.detach().clone() for p in optimizer.params]

    def after_noise(self, optimizer):
        pass


def private_step(module, x, y, groups, mode="hooks", *, n_rows_planned=64):
    """One private step of `module` on rows (x, y) grouped by `groups` (Opacus' hooks or the book-keeping
    engine): the clipped sum before the noise."""
    spec = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=n_rows_planned, batch_size=8, epochs=1, sigma=1.0,
                       clip=CLIP)
    plan = mechanisms.get("dpsgd").plan(spec)
    data = TensorDataset(torch.randn(n_rows_planned, x.shape[1]), torch.zeros(n_rows_planned, dtype=torch.long))
    training = make_private(module, torch.optim.SGD(module.parameters(), lr=0.0), data, plan,
                            criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0),
                            grad_sample_mode=mode, guard=False)
    observer = SumsBeforeNoise()
    training.optimizer.observe_releases(observer)
    training.optimizer.row_groups = groups
    training.optimizer.zero_grad()
    training.criterion(training.module(x), y).backward()
    training.optimizer.step()
    return torch.cat([s.reshape(-1) for s in observer.sums])


def model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))


def reference_clipped_sum(module, x, y, unit, scale=1.0):
    """sum over units of clip(scale * sum of the unit's per-row gradients, CLIP), one autograd call per row."""
    total = None
    for u in np.unique(unit):
        grads = []
        for r in np.flatnonzero(unit == u):
            module.zero_grad()
            nn.functional.cross_entropy(module(x[r:r + 1]), y[r:r + 1]).backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in module.parameters()]))
        g = scale * torch.stack(grads).sum(0)
        clipped = g * min(1.0, CLIP / (float(g.norm()) + 1e-6))
        assert clipped.norm() <= CLIP * (1 + 1e-6)  # the unit's clipped contribution
        total = clipped if total is None else total + clipped
    return total


@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_a_units_rows_are_clipped_together_as_the_loop_over_units_does(mode):
    torch.manual_seed(1)
    x, y = 3 * torch.randn(12, 5), torch.randint(0, 3, (12,))
    unit = np.array([3, 0, 0, 1, 2, 2, 3, 0, 3, 3, 4, 5])  # a unit's rows need not be next to each other
    got = private_step(model(), x, y, RowGroups.of(unit, 6), mode)
    want = reference_clipped_sum(model(), x, y, unit)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class Layers(nn.Module):
    """Every layer family the book-keeping engine clips with positions (T > 1): a convolution, a layer norm, an
    embedding and a linear layer over positions."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(1, 2, 3, padding=1), nn.LayerNorm(2)
        self.embed, self.head = nn.Embedding(7, 2), nn.Linear(2, 3)

    def forward(self, x):
        h = self.conv(x[:, :, :, :4]).flatten(2).transpose(1, 2)  # (B, 16, 2)
        ids = (x[:, 0, 0, 4:] > 0).long() + (x[:, 0, 1, 4:] > 0).long() * 2  # (B, 4) ids in [0, 4)
        return self.head(self.norm(h).mean(1) + self.embed(ids).mean(1))


def test_the_engine_clips_a_units_rows_together_in_every_layer_family():
    """bk (units laid out as one example's positions) against Opacus' hooks (per-row gradients summed per unit)
    and the loop over units, on convolution, layer norm, embedding and linear layers. In float64, where the three
    agree to 1e-15 (in float32 their different orders of summation part them by up to 1e-4 relative)."""
    torch.manual_seed(5)
    x, y = torch.randn(10, 1, 4, 8, dtype=torch.float64), torch.randint(0, 3, (10,))
    unit = np.array([1, 0, 1, 2, 1, 0, 3, 3, 4, 1])

    def layers():
        torch.manual_seed(0)
        return Layers().double()

    sums = {mode: private_step(layers(), x, y, RowGroups.of(unit, 5, 0.5), mode) for mode in ("bk", "hooks")}
    want = reference_clipped_sum(layers(), x, y, unit, scale=0.5)
    for got in sums.values():
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)


def test_removing_one_unit_moves_the_clipped_sum_by_at_most_the_bound():
    """The unit-level sensitivity, measured: D and D' without unit 0, whose 6 rows all push one way. Clipped
    per row, removing them would move the sum by about 6 C; grouped, by at most C."""
    torch.manual_seed(2)
    x = torch.cat([torch.full((6, 5), 4.0), torch.randn(6, 5)])
    y = torch.cat([torch.zeros(6, dtype=torch.long), torch.randint(0, 3, (6,))])
    unit = np.array([0] * 6 + [1, 1, 2, 3, 4, 5])
    keep = unit != 0
    grouped, rest = RowGroups.of(unit, 6), RowGroups.of(unit[keep] - 1, 5)
    for mode in ("hooks", "bk"):
        moved = private_step(model(), x, y, grouped, mode) - private_step(model(), x[keep], y[keep], rest, mode)
        assert float(moved.norm()) <= CLIP * (1 + 1e-5)
    per_row = private_step(model(), x, y, None) - private_step(model(), x[keep], y[keep], None)
    assert float(per_row.norm()) > 5 * CLIP  # what grouping prevents: one person, six clipped rows


@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_augmult_averages_the_k_copies_before_clipping(mode):
    """One step of the resident loader with augmult 3: its groups are each record's 3 augmented copies at 1/3,
    and the clipped sum is the loop's over records of clip(mean of the 3 copies' gradients)."""
    torch.manual_seed(3)
    images, labels = torch.rand(40, 1, 4, 4) * 3, torch.randint(0, 3, (40,))
    data = TensorDataset(images, labels)
    data.augmult = 3
    spec = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=40, batch_size=8, epochs=1, sigma=1.0, clip=CLIP)
    plan = mechanisms.get("dpsgd").plan(spec)

    def module():
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(16, 3))

    training = make_private(module(), torch.optim.SGD(module().parameters(), lr=0.0), data, plan,
                            criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0),
                            grad_sample_mode=mode, guard=False)
    assert training.loader.grouping == Grouping(None, 3)
    x, y = batch = next(iter(training.loader))
    groups = batch.groups
    assert groups.scale == pytest.approx(1 / 3) and len(x) == 3 * groups.count
    assert torch.equal(groups.index, torch.arange(groups.count).repeat_interleave(3))
    assert torch.equal(groups.slot, torch.arange(3).repeat(groups.count)) and groups.width == 3
    got = private_step(module(), x, y, groups, mode)
    want = reference_clipped_sum(module(), x, y, groups.index.numpy(), scale=1 / 3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
