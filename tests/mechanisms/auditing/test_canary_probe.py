"""The one-run canaries measure what ran: they enter before clipping, are clipped by the engine at the bound it
holds, are read before any observer, and are measured in the plan's units (not the optimizer's)."""

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from mechanisms.auditing import DiracCanaries
from mechanisms.catalog import dpsgd, dpsgd_adaclip
from mechanisms.parts.plan import PrivacySpec
from workers.audit import plan_units

pytestmark = [pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
              pytest.mark.filterwarnings("ignore:Full backward hook")]

STEPS = 6


def run(mode: str = "hooks", *, tamper=None, observer=None, sigma: float = 0.2, mechanism=dpsgd.mechanism,
        options=None, steps: int = STEPS):
    """A linear model 20 -> 5 (105 parameters) under `mechanism`'s plan at sample rate 1, 60 canaries (their
    unit from the plan, as a trial sets it); `tamper(optimizer)` before the first step, `observer` registered
    after the canaries. Returns (in-scores mean per step, out-scores, canaries)."""
    torch.manual_seed(0)
    n = 64
    data = TensorDataset(torch.randn(n, 20), torch.randint(0, 5, (n,)))
    model = nn.Linear(20, 5)
    plan = mechanism.plan(PrivacySpec(epsilon=None, delta=1e-5, dataset_size=n, batch_size=n, epochs=steps,
                                      sigma=sigma, options=options or {}))
    model, optimizer, loader, criterion = mechanism.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), data, plan, criterion=nn.CrossEntropyLoss(),
        generator=torch.Generator().manual_seed(0), noise_generator=torch.Generator().manual_seed(1),
        grad_sample_mode=mode)
    unit, unit_range, correlation = plan_units(plan)
    canaries = DiracCanaries.attach_to(optimizer, 60, sample_rate=1.0, seed=2, unit=unit, unit_range=unit_range,
                                       planned_steps=plan.steps, correlation=correlation)
    if tamper is not None:
        tamper(optimizer)
    if observer is not None:
        optimizer.observe_releases(observer)
    for _ in range(steps):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    scores = canaries.scores
    return scores[canaries.included].mean() / steps, scores[~canaries.included], canaries


@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_a_correct_engine_pushes_one_plan_unit(mode):
    push, outside, canaries = run(mode)
    assert push == pytest.approx(1.0, abs=0.15)
    assert abs(outside.mean()) < 0.15 * STEPS
    assert canaries.observations().noise_summary.steps == STEPS


def _double_bound(optimizer):
    engine = getattr(optimizer, "engine", None)
    if engine is not None:
        engine.max_grad_norm = 2.0 * engine.max_grad_norm
    else:
        optimizer.max_grad_norm = 2.0 * optimizer.max_grad_norm


@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_an_engine_clipping_at_2c_after_planning_pushes_two_plan_units(mode):
    push, _, canaries = run(mode, tamper=_double_bound)
    assert push == pytest.approx(2.0, abs=0.15)  # the optimizer's declared bound still says C
    assert canaries.clip == pytest.approx(1.0)


class Doubler:
    """A release observer scaling the clipped sum by 2 before the noise."""

    def before_noise(self, optimizer):
        for p in optimizer.params:
            p.summed_grad = 2 * p.summed_grad

    def after_noise(self, optimizer):
        pass


class Eraser:
    """A release observer that rewrites the release after the noise (zeroes it)."""

    def before_noise(self, optimizer):
        pass

    def after_noise(self, optimizer):
        for p in optimizer.params:
            p.grad = torch.zeros_like(p.grad)


def test_a_sum_doubled_before_the_noise_pushes_two_plan_units():
    push, outside, _ = run(observer=Doubler())
    # the residual also holds the data's sum once more (read before the doubling): in and out alike
    assert push - outside.mean() / STEPS == pytest.approx(2.0, abs=0.3)


def test_the_canaries_read_the_release_before_any_observer():
    push, _, _ = run(observer=Eraser())
    assert push == pytest.approx(1.0, abs=0.15)


def test_the_probe_runs_before_the_observers_and_only_one_attaches():
    order = []

    class Spy:
        def before_noise(self, optimizer):
            order.append("observer")

        def after_noise(self, optimizer):
            pass

    _, _, canaries = run(observer=Spy(), steps=1)
    original = canaries._inject

    def inject(optimizer):
        order.append("probe")
        original(optimizer)

    canaries._inject = inject
    optimizer = canaries._optimizer
    with pytest.raises(RuntimeError, match="already carries"):
        DiracCanaries.attach_to(optimizer, 10, sample_rate=1.0)
    for p in optimizer.params:  # one more step by hand: the probe first
        p.summed_grad = torch.zeros_like(p)
    optimizer.add_noise()
    assert order[-2:] == ["probe", "observer"]


def test_adaptive_clipping_is_measured_in_the_bound_in_force_clamped_to_its_declared_range():
    options = {"min_clip": 0.5, "max_clip": 2.0}
    plan = dpsgd_adaclip.mechanism.plan(PrivacySpec(epsilon=None, delta=1e-5, dataset_size=64, batch_size=64,
                                                    epochs=2, sigma=1.0, options=options))
    unit, unit_range, _ = plan_units(plan)
    assert unit_range == (0.5, 2.0) and unit == pytest.approx(plan.parts.clipper.bound)
    push, _, _ = run(mechanism=dpsgd_adaclip.mechanism, options=options)  # the state moves the bound each step
    assert push == pytest.approx(1.0, abs=0.2)

    def beyond(optimizer):  # the state's bound set to 4 on a clipper declared on [0.5, 2]
        optimizer.mechanism_state["clip"].fill_(4.0)

    push, _, _ = run(mechanism=dpsgd_adaclip.mechanism, options=options, tamper=beyond, steps=1)
    assert push > 1.5  # the canaries were pushed by 4 and read in units of at most 2


def test_noise_summaries_survive_the_observations_round_trip():
    _, _, canaries = run()
    obs = canaries.observations()
    again = type(obs).from_dict(obs.to_dict())
    assert again.noise_summary.to_dict() == obs.noise_summary.to_dict()
    assert np.array_equal(again.included, obs.included)


def test_the_noise_is_read_once_per_coordinate():
    """Canaries sharing a coordinate see the same noise: the noise checks and the noise measurement take one
    excluded canary per coordinate, so one draw is never counted twice."""
    canaries = DiracCanaries(10, 40, clip=1.0, sample_rate=1.0, seed=4)
    coords = canaries.coordinates[canaries.noise_columns]
    assert len(set(coords.tolist())) == coords.size == len(set(canaries.coordinates[~canaries.included].tolist()))
    assert not canaries.included[canaries.noise_columns].any()
