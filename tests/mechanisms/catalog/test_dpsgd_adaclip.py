"""Adaptive clipping (`dpsgd-adaclip`): Opacus' clip trajectory, dp-accounting's epsilon, state from releases only."""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import pytest
import torch
from opacus.grad_sample import GradSampleModule
from opacus.optimizers import AdaClipDPOptimizer
from torch import nn
from torch.utils.data import TensorDataset

import mechanisms
from mechanisms.catalog.dpsgd_adaclip import combined_multiplier
from mechanisms.parts.plan import PrivacySpec
from mechanisms.parts.releases import Released

N, B, D = 96, 32, 6
OPTIONS = {"target_quantile": 0.3, "clip_lr": 0.5, "count_std": 2.0, "min_clip": 0.01, "max_clip": 50.0}


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g) * torch.linspace(0.2, 3.0, N).unsqueeze(1)  # a spread of gradient norms
    return TensorDataset(x, torch.randint(0, 3, (N,), generator=g))


def model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def plan_at(sigma: float, clip: float = 1.0, epochs: int = 4):
    """The mechanism's plan on fixed-size batches of exactly B (so the realised batch is the expected one)."""
    spec = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=N, batch_size=B, epochs=epochs, clip=clip,
                       sampler="shuffle", sigma=1.0, options=OPTIONS)
    return dataclasses.replace(mechanisms.get("dpsgd-adaclip").plan(spec), sigma=sigma)


def ours(mode: str, seed: int = 7) -> tuple[list[float], list[torch.Tensor], nn.Module]:
    """privbench's trainer objects: the clip before each step and each step's released centred count."""
    module, ds = model(), data()
    ds = TensorDataset(ds.tensors[0].double(), ds.tensors[1])
    plan = plan_at(0.0)
    private = mechanisms.get("dpsgd-adaclip").make_private(
        module, torch.optim.SGD(module.parameters(), lr=0.1), ds, plan, criterion=nn.CrossEntropyLoss(),
        generator=torch.Generator().manual_seed(3), grad_sample_mode=mode,
        noise_generator=torch.Generator().manual_seed(seed))
    clips, counts, batches = [], [], []
    for _ in range(plan.steps // len(private.loader)):
        for x, y in private.loader:
            batches.append((x, y))
            clips.append(float(private.optimizer.mechanism_state["clip"]))
            private.optimizer.zero_grad(set_to_none=True)
            private.criterion(private.module(x), y).backward()
            private.optimizer.step()
            counts.append(private.optimizer.last_released["unclipped"].clone())
    ours.batches = batches
    return clips, counts, module


def opacus(batches, seed: int = 7) -> list[float]:
    module = GradSampleModule(model())
    optimizer = AdaClipDPOptimizer(
        torch.optim.SGD(module.parameters(), lr=0.1), noise_multiplier=0.0,
        target_unclipped_quantile=OPTIONS["target_quantile"], clipbound_learning_rate=OPTIONS["clip_lr"],
        max_clipbound=OPTIONS["max_clip"], min_clipbound=OPTIONS["min_clip"], unclipped_num_std=OPTIONS["count_std"],
        max_grad_norm=1.0, expected_batch_size=B, generator=torch.Generator().manual_seed(seed))
    clips = []
    for x, y in batches:
        clips.append(float(optimizer.max_grad_norm))
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(module(x), y).backward()
        optimizer.step()
    return clips


@pytest.mark.parametrize("mode", ["bk", "hooks"])
def test_clip_trajectory_equals_opacus_adaclip_given_the_same_noise_draws(mode):
    """No gradient noise (both draw nothing for it), so each step's only draw is the count's, from generators
    seeded alike: the bounds must agree step for step, and they must move."""
    clips, _, _ = ours(mode)
    reference = opacus(ours.batches)
    assert clips == pytest.approx(reference, rel=1e-6)  # the bound is a float32 device scalar in both
    assert max(clips) / min(clips) > 1.3  # the bound adapts: the test would not see a frozen one


def test_state_is_updated_from_the_releases_only():
    """Replaying the update hook on the recorded releases alone, with no batch, gives the run's trajectory."""
    clips, counts, _ = ours("bk", seed=11)
    mech, plan = mechanisms.get("dpsgd-adaclip"), plan_at(0.0)
    options = mech.options(OPTIONS)
    state = {"clip": torch.tensor(1.0)}
    replayed = []
    for count in counts:
        replayed.append(float(state["clip"]))
        new = mech.update_state(state, Released((), {"unclipped": count}), plan, options)
        state["clip"] = state["clip"].copy_(new["clip"])  # the trainer keeps the state tensors, as here
    assert replayed == clips


@pytest.mark.parametrize("target", [1.0, 4.0])
def test_certified_epsilon_is_dp_accounting_on_the_composed_releases(target):
    """The combined multiplier of Theorem 1, then dp-accounting's own PLD on the run: within 1e-3 relative,
    and the target is met."""
    spec = PrivacySpec(epsilon=target, delta=1e-5, dataset_size=60_000, batch_size=512, epochs=5,
                       calibration="certified")
    plan = mechanisms.get("dpsgd-adaclip").plan(spec)
    z = combined_multiplier(plan.sigma, 512 / 20)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(512 / 60_000, dp_accounting.GaussianDpEvent(z)), plan.steps)
    reference = dp_accounting.pld.PLDAccountant().compose(event).get_epsilon(1e-5)
    assert plan.epsilon_certified == pytest.approx(reference, rel=1e-3)
    assert plan.epsilon_certified <= target * 1.001
    assert plan.epsilon_claimed == plan.epsilon_certified
    assert plan.release_multipliers == {"gradient": plan.sigma, "unclipped": pytest.approx(2 * 512 / 20)}
    assert math.isclose(plan.effective_event.event.event.noise_multiplier, z, rel_tol=1e-12)
