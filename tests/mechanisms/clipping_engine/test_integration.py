"""`grad_sample_mode: bk` through every mechanism on DP-SGD's optimizer path: one step from the same weights,
batch and noise seed gives the same parameters as Opacus' modes (ghost for flat clipping, hooks for
per-layer), so the engine changes only how the clipped sum is computed: the noise, its scale and the
mechanisms' own noise steps (gredp's frequency-domain noise, shuffled-dpsgd's batch clip and permutation)
are untouched. Poisson sampling with empty batches runs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from bk_reference import no_dropout
from torch import nn
from torch.utils.data import TensorDataset

import mechanisms
from mechanisms.parts.plan import PrivacySpec
from workers import datasets, models


def _bundle(model: str, options: dict | None = None):
    splits = datasets.load("digits")
    torch.manual_seed(0)
    bundle = models.build(model, splits, options or {})
    no_dropout(bundle.module).train()
    idx = np.arange(32)
    data = (*bundle.encode(splits.train.subset(idx)), torch.from_numpy(splits.train.labels[idx]).long())
    return bundle.module, data


def _one_step(mechanism: str, module: nn.Module, data, mode: str, clipping: str, options: dict) -> list[torch.Tensor]:
    mech = mechanisms.get(mechanism)
    module = copy.deepcopy(module)
    params = [p for p in module.parameters() if p.requires_grad]
    opts = dict(options) | ({"clipping": "per-layer"} if clipping == "per_layer" else {})
    plan = mech.plan(PrivacySpec(epsilon=None, sigma=0.7, delta=1e-5, dataset_size=32, batch_size=32, epochs=1,
                                 sampler="fixed", clip=0.5, model_dim=sum(p.numel() for p in params),
                                 n_tensors=len(params), tensor_sizes=tuple(p.numel() for p in params), options=opts))
    opt = torch.optim.SGD(params, lr=1.0)
    module, opt, _, crit = mech.make_private(module, opt, TensorDataset(*data), plan, criterion=nn.CrossEntropyLoss(),
                                             generator=torch.Generator().manual_seed(3), grad_sample_mode=mode,
                                             noise_generator=torch.Generator().manual_seed(7))
    opt.zero_grad(set_to_none=True)
    crit(module(*data[:-1]), data[-1]).backward()
    torch.manual_seed(11)
    opt.step()
    return [p.detach().clone() for p in module.parameters()]


CASES = [("dpsgd", "flat", {}), ("dpsgd", "per_layer", {}), ("dpsgd-gdp", "flat", {}),
         ("gredp", "flat", {}), ("gredp", "per_layer", {}),
         ("shuffled-dpsgd", "flat", {"permutation_seed": 3, "batch_clip_ratio": 0.5})]


@pytest.mark.parametrize(("mechanism", "clipping", "options"), CASES)
def test_bk_step_equals_opacus_step(mechanism, clipping, options):
    model = "vit-tiny" if mechanism == "shuffled-dpsgd" else "mlp"
    module, data = _bundle(model, {"layers": 1} if model == "vit-tiny" else {"hidden": 32})
    reference = "hooks" if clipping == "per_layer" else "ghost"
    before = [p.detach().clone() for p in module.parameters()]
    want = _one_step(mechanism, module, data, reference, clipping, options)
    got = _one_step(mechanism, module, data, "bk", clipping, options)
    moved = sum((w - b).norm().item() for w, b in zip(want, before, strict=True))
    assert moved > 0
    for w, g in zip(want, got, strict=True):
        assert torch.allclose(w, g, rtol=1e-5, atol=1e-6)


def test_poisson_sampling_with_empty_batches():
    module, data = _bundle("mlp", {"hidden": 16})
    mech = mechanisms.get("dpsgd")
    plan = mech.plan(PrivacySpec(epsilon=None, sigma=1.0, delta=1e-5, dataset_size=32, batch_size=1, epochs=1))
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    module, opt, loader, crit = mech.make_private(module, opt, TensorDataset(*data), plan,
                                                  criterion=nn.CrossEntropyLoss(), generator=torch.Generator(),
                                                  grad_sample_mode="bk")
    sizes = []
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        crit(module(x), y).backward()
        opt.step()
        sizes.append(len(y))
    assert 0 in sizes and max(sizes) >= 1  # q = 1/32 over 32 draws: empty batches occur
    assert all(torch.isfinite(p).all() for p in module.parameters())
