"""The sampler a trial records is the one its batches really come from."""

import torch
from torch.utils.data import TensorDataset

from workers.train import FixedSizeBatches, batch_loader


def test_fixed_size_batches_are_exact_and_without_replacement():
    batches = list(FixedSizeBatches(100, 16, torch.Generator().manual_seed(0)))
    assert len(batches) == 6 and all(len(b) == 16 and len(set(b)) == 16 for b in batches)
    assert batches[0] != batches[1]


def test_shuffle_covers_each_example_once_per_epoch():
    data = TensorDataset(torch.arange(100))
    seen = [int(x) for (xs,) in batch_loader(data, 16, "shuffle", torch.Generator().manual_seed(0)) for x in xs]
    assert sorted(seen) == list(range(100))
