"""Run in a fresh interpreter by test_measure.py: the peak extra memory of book-keeping DP steps on an MLP,
measured after the workloads named on the command line ("big": a 256 MB temporary, "step": the steps)."""

from __future__ import annotations

import json
import sys

import torch
from torch import nn

from mechanisms.clipping_engine import BookkeepingEngine, BookkeepingLoss
from workers.measure import PeakMemory


def steps() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    loss = BookkeepingLoss(BookkeepingEngine(model, 1.0), nn.CrossEntropyLoss())
    x, y = torch.randn(512, 784), torch.randint(0, 10, (512,))
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        loss(model(x), y).backward()


def big() -> None:
    x = torch.ones(64 * 2**20)
    (x * 2).sum()


if __name__ == "__main__":
    torch.set_num_threads(1)
    out = []
    for name in sys.argv[1:]:
        with PeakMemory() as mem:
            {"big": big, "step": steps}[name]()
        out.append(mem.extra_mb)
    print(json.dumps(out))
