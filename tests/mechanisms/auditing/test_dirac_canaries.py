"""Dirac gradient canaries in a real (tiny) Opacus run, and the one-run estimate on known scores."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch import nn
from torch.utils.data import TensorDataset

from mechanisms.accounting import epsilon
from mechanisms.auditing import DiracCanaries
from mechanisms.catalog import dpsgd
from mechanisms.parts.clipping import FlatClipping, PerLayerClipping
from mechanisms.parts.noise_addition import GaussianNoise
from mechanisms.parts.plan import PrivacySpec
from tests.events import poisson_event

pytestmark = [pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
              pytest.mark.filterwarnings("ignore:Full backward hook")]


def make_run(*, sigma: float, batch: int, n: int = 256, seed: int = 0, clip=1.0):
    """A linear model 50 -> 10 (510 parameters) wrapped by privbench's DP-SGD (Opacus, Poisson)."""
    torch.manual_seed(seed)
    data = TensorDataset(torch.randn(n, 50), torch.randint(0, 10, (n,)))
    model = nn.Linear(50, 10)
    plan = dpsgd.mechanism.plan(PrivacySpec(epsilon=None, delta=1e-5, dataset_size=n, batch_size=batch, epochs=100,
                                  sigma=sigma))
    if isinstance(clip, list):  # per-layer bounds: the training path with a per-layer clipper
        plan = dataclasses.replace(plan, parts=dataclasses.replace(plan.parts, clipper=PerLayerClipping(tuple(clip))))
    elif clip != 1.0:
        plan = dataclasses.replace(plan, parts=dataclasses.replace(plan.parts, clipper=FlatClipping(clip),
                                                                   noise=GaussianNoise(clip)))
    model, optimizer, loader, criterion = dpsgd.mechanism.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), data, plan, criterion=nn.CrossEntropyLoss(),
        generator=torch.Generator().manual_seed(seed), noise_generator=torch.Generator().manual_seed(seed))
    return model, optimizer, loader, criterion, plan


def train(model, optimizer, loader, criterion, steps: int) -> None:
    done = 0
    while done < steps:
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
            done += 1
            if done == steps:
                return


def test_tiny_opacus_run_gives_a_sound_and_useful_one_run_bound():
    sigma, steps = 0.3, 8
    model, optimizer, loader, criterion, plan = make_run(sigma=sigma, batch=256)  # sample rate 1
    canaries = DiracCanaries.attach_to(optimizer, 300, sample_rate=plan.sample_rate, seed=0)
    train(model, optimizer, loader, criterion, steps)
    est = canaries.estimate(1e-5)
    assert est.steps == steps == canaries.steps and est.canaries == 300
    inside, outside = canaries.scores[canaries.included], canaries.scores[~canaries.included]
    assert inside.mean() == pytest.approx(steps, abs=0.3)  # C per step, in units of C
    assert outside.mean() == pytest.approx(0.0, abs=0.3)
    assert outside.std() == pytest.approx(sigma * np.sqrt(steps), rel=0.2)  # residual = pure noise
    certified = epsilon(poisson_event(sigma, plan.sample_rate, steps), 1e-5)
    assert 1.0 < est.epsilon <= certified
    assert 0 <= est.overhead_s < 5
    json.dumps(est.as_record())


def test_canaries_join_steps_at_the_sample_rate():
    model, optimizer, loader, criterion, plan = make_run(sigma=0.5, batch=64)  # q = 0.25
    canaries = DiracCanaries.attach_to(optimizer, 400, sample_rate=plan.sample_rate, seed=1)
    train(model, optimizer, loader, criterion, 24)
    inside = canaries.scores[canaries.included]
    assert inside.mean() == pytest.approx(0.25 * 24, rel=0.1)
    assert canaries.estimate(1e-5).epsilon <= epsilon(poisson_event(0.5, 0.25, 24), 1e-5)


@pytest.mark.parametrize("clip", [1.0, [1.0, 0.5]], ids=["flat", "per-layer"])
def test_injection_adds_exactly_c_at_included_coordinates_before_noise(clip):
    grads = []
    for attach in (False, True):
        model, optimizer, loader, criterion, _plan = make_run(sigma=1.0, batch=256, seed=3, clip=clip)
        canaries = (DiracCanaries.attach_to(optimizer, 100, sample_rate=1.0, seed=5, score="update")
                    if attach else None)
        train(model, optimizer, loader, criterion, 1)
        grads.append(torch.cat([p.grad.reshape(-1) for p in optimizer.params]).double().numpy())
    diff = (grads[1] - grads[0]) * optimizer.expected_batch_size  # undo Opacus' mean reduction
    # per-layer clipping: the canary has the sum's sensitivity, sqrt(1^2 + 0.5^2)
    norm = 1.0 if clip == 1.0 else float(np.hypot(*clip))
    assert canaries.clip == pytest.approx(norm)
    expected = np.zeros_like(diff)
    expected[canaries.coordinates[canaries.included]] = norm
    assert diff == pytest.approx(expected, abs=1e-5)
    # an "update" score is the privatised sum at the coordinate, in units of C
    released = grads[1][canaries.coordinates] * optimizer.expected_batch_size
    assert canaries.scores == pytest.approx(released / norm, abs=1e-5)


def test_scores_do_not_depend_on_how_many_steps_wait_on_the_device(monkeypatch):
    """Steps are scored in blocks (one copy to the host per block): a block of one step at a time, the old
    per-step scoring, and blocks of 4 over 10 steps (a partial block left at the end) see the same run."""
    from mechanisms.auditing import dirac_canaries

    seen = []
    for values in (2 * 120, 8 * 120):  # 120 canaries: blocks of 1 and of 4 steps
        monkeypatch.setattr(dirac_canaries, "PENDING_VALUES", values)
        model, optimizer, loader, criterion, plan = make_run(sigma=0.7, batch=64, seed=2)
        canaries = DiracCanaries.attach_to(optimizer, 120, sample_rate=plan.sample_rate, seed=3)
        train(model, optimizer, loader, criterion, 10)
        rows = values // 240
        assert len(canaries._pending) == rows and canaries._rows == 10 % rows  # the last block waits on the device
        assert canaries.steps == 10 and canaries._rows == 0
        seen.append(canaries.observations())
    one, four = seen
    np.testing.assert_allclose(four.scores, one.scores, rtol=0, atol=1e-12)
    np.testing.assert_allclose(four.lr_scores, one.lr_scores, rtol=0, atol=1e-12)
    np.testing.assert_allclose(four.noise_moments, one.noise_moments, rtol=1e-12)
    assert one.noise_moments[0] == 10 * (~one.included).sum() and one.scores.std() > 0.5


def test_wraps_a_replaced_noise_step_and_detach_restores_it():
    model, optimizer, loader, criterion, _ = make_run(sigma=1.0, batch=256)
    calls = []
    own = optimizer.add_noise

    def mechanism_noise() -> None:  # e.g. gredp's frequency-domain noise, set on the instance
        calls.append(1)
        own()

    optimizer.add_noise = mechanism_noise
    canaries = DiracCanaries.attach_to(optimizer, 10, sample_rate=1.0)
    with pytest.raises(RuntimeError):
        DiracCanaries.attach_to(optimizer, 10, sample_rate=1.0)
    train(model, optimizer, loader, criterion, 2)
    assert calls == [1, 1] and canaries.steps == 2
    canaries.detach()
    assert optimizer.add_noise is mechanism_noise
    train(model, optimizer, loader, criterion, 1)
    assert canaries.steps == 2 and calls == [1, 1, 1]


def test_known_answer_on_synthetic_gaussian_scores():
    """jax_privacy's case: 10,000 in at N(1, 1) and 10,000 out at N(0, 1), quantile for quantile."""
    n = 10_000
    grid = norm.ppf(np.linspace(0, 1, n, endpoint=False) + 1 / (2 * n))
    canaries = DiracCanaries(2 * n, 2 * n, clip=1.0, sample_rate=1.0)
    canaries.included = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    canaries.scores = np.r_[grid + 1.0, grid]
    canaries.statistic = "sum"
    assert canaries.auditor().epsilon_one_run(0.05, 1e-6) == pytest.approx(1.13346, rel=1e-5)
    est = canaries.estimate(1e-6)  # the larger of Steinke and f-DP (approx-dp family), each at 0.025
    assert est.epsilon_steinke == pytest.approx(canaries.auditor().epsilon_one_run(0.025, 1e-6))
    assert est.epsilon_fdp == pytest.approx(canaries.auditor().epsilon_one_run_fdp(0.025, 1e-6, family="approx-dp"))
    assert est.epsilon == max(est.epsilon_steinke, est.epsilon_fdp) and 1.13346 < est.epsilon < 2.164749
    assert est.epsilon_fdp_gdp == pytest.approx(2.164749, rel=1e-5)
    canaries.included[:] = True  # one side empty: "all in" with every guess right
    assert canaries.estimate(1e-6).epsilon > 0


def test_invalid_configurations_raise():
    with pytest.raises(ValueError):
        DiracCanaries(10, 0, clip=1.0, sample_rate=1.0)
    with pytest.raises(ValueError):
        DiracCanaries(10, 5, clip=1.0, sample_rate=1.0, statistic="max")
    with pytest.raises(ValueError):
        DiracCanaries(10, 5, clip=1.0, sample_rate=0.0)
    with pytest.raises(ValueError):
        DiracCanaries(10, 5, clip=1.0, sample_rate=1.0, score="loss")
    _, optimizer, *_ = make_run(sigma=1.0, batch=256)
    with pytest.raises(ValueError, match="parameters"):
        DiracCanaries(11, 5, clip=1.0, sample_rate=1.0).attach(optimizer)
