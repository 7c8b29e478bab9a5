"""Padded batches (`pad_to`, static shapes for a compiled step): rows of weight 0 contribute nothing to the
step's gradient sum, its per-example norms or its released count."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import mechanisms
from mechanisms.parts.batch_selection import StepIndices
from mechanisms.parts.plan import PrivacySpec
from workers.acceleration import StepPrecision
from workers.train import Setup, train_step

N, B, D = 120, 24, 5
OPTIONS = {"target_quantile": 0.5, "clip_lr": 0.2, "count_std": 1.0}


def test_step_indices_pad_with_weight_zero_rows():
    step = StepIndices.of(torch.tensor([4, 9, 2]), 3, pad_to=8)
    assert step.index.tolist() == [4, 9, 2, 0, 0, 0, 0, 0]
    assert step.weights.tolist() == [1.0, 1.0, 1.0, 0, 0, 0, 0, 0]
    assert len(StepIndices.of(torch.tensor([], dtype=torch.long), 0, pad_to=8).index) == 8  # an empty draw has a shape
    assert StepIndices.of(torch.arange(9), 9, pad_to=8).index.shape == (16,)


def run(pad_to: int | None) -> list[tuple[list[torch.Tensor], torch.Tensor, float, int, int]]:
    """Three Poisson steps of adaptive clipping (a count release and a state) through the trainer's step."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g) * torch.linspace(0.1, 3.0, N).unsqueeze(1)
    data = TensorDataset(x.double(), torch.randint(0, 3, (N,), generator=g))
    torch.manual_seed(1)
    module = nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    mech = mechanisms.get("dpsgd-adaclip")
    plan = mech.plan(PrivacySpec(epsilon=None, sigma=1.0, delta=1e-5, dataset_size=N, batch_size=B, epochs=1,
                                 clip=1.0, sampler="poisson", options=OPTIONS))
    training = mech.make_private(module, torch.optim.SGD(module.parameters(), lr=0.1), data, plan,
                                 criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(2),
                                 grad_sample_mode="bk", noise_generator=torch.Generator().manual_seed(3),
                                 pad_to=pad_to)
    s = Setup(training, StepPrecision("fp32", torch.device("cpu"), private=True, grad_sample_mode="bk"), module, {}, {})
    out = []
    for batch in list(training.loader)[:3]:
        train_step(s, batch)
        opt = training.optimizer
        norms = opt.example_norms()[: batch.size]
        out.append(([p.grad.clone() for p in module.parameters()], norms.clone(),
                     float(opt.last_released["unclipped"]), len(batch[-1]), batch.size))
    return out


@pytest.mark.parametrize("pad_to", [32, 64])
def test_padding_rows_contribute_nothing(pad_to):
    plain, padded = run(None), run(pad_to)
    for (grads, norms, count, rows, size), (pgrads, pnorms, pcount, prows, psize) in zip(plain, padded, strict=True):
        assert rows == size == psize and prows % pad_to == 0 and prows > psize  # padding was there
        for g, pg in zip(grads, pgrads, strict=True):
            torch.testing.assert_close(pg, g, rtol=1e-10, atol=1e-12)  # same noise: same generator, same shapes
        torch.testing.assert_close(pnorms, norms, rtol=1e-10, atol=1e-12)
        assert pcount == pytest.approx(count, abs=1e-9)  # padding rows (norm 0 <= clip) are not counted
