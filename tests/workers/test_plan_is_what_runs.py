"""The accounted process is the executed one: every Poisson mechanism runs exactly `privacy.steps` updates,
and its certified epsilon is at least dp-accounting's PLD (1e-4) of Poisson sampling at q = B/N over the
steps that ran."""

from __future__ import annotations

import dataclasses
import warnings

import dp_accounting
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import TensorDataset

import mechanisms
from mechanisms.framework import private_training
from mechanisms.parts.plan import PrivacySpec
from orchestrator.grid import parse
from workers.config import Resources
from workers.trial import run_trial

ISSUE_GRID = """
name: plan-check
seeds: [0]
delta: 1e-5
grid: {dataset: [digits], model: [mlp], mechanism: [dpsgd, dpsgd-gdp, gredp], epsilon: [4]}
train: {epochs: 3, batch_size: 600, lr: 0.2}
audit: {mode: "off"}
"""


def reference_epsilon(multiplier: float, q: float, steps: int, delta: float) -> float:
    """dp-accounting's PLD at its default 1e-4 discretisation, independent of privbench's accountants."""
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(multiplier)), steps)
    return dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(delta)


@pytest.mark.parametrize("config", parse(ISSUE_GRID).trials, ids=lambda c: c.mechanism)
def test_the_issue_grid_runs_the_steps_it_accounts(config):
    warnings.filterwarnings("ignore")
    record = run_trial(dataclasses.replace(config, resources=Resources(cpus=1, gpus=0)))
    assert record["status"] == "finished", record.get("traceback")
    privacy, metrics = record["privacy"], record["metrics"]
    assert metrics["steps_run"] == privacy["steps"] == 3 * round(1438 / 600)  # 6, not Opacus' 9
    n = int(metrics["n_train"])
    assert privacy["sample_rate"] == pytest.approx(600 / n)
    multiplier = float(privacy["effective_event"].split("noise_multiplier=")[1].split(")")[0])
    truth = reference_epsilon(multiplier, 600 / n, int(metrics["steps_run"]), privacy["delta"])
    assert privacy["epsilon_certified"] >= truth * (1 - 1e-6)
    assert privacy["epsilon_certified"] == pytest.approx(truth, rel=2e-3)


@settings(max_examples=10, deadline=None)  # each calibrates and trains; the issue grid is above
@given(n=st.integers(20, 400), frac=st.floats(0.05, 0.95), epochs=st.integers(1, 3),
       mechanism=st.sampled_from(["dpsgd", "dpsgd-gdp", "gredp", "shuffled-dpsgd"]))
def test_any_geometry_runs_the_planned_steps_and_stays_under_the_certificate(n, frac, epochs, mechanism):
    """Through the real optimizer and loader. Shuffled DP-SGD runs its plan's parts (batch clip to 0.3 C)
    without its permutation, which is post-processing and needs transformer blocks an MLP lacks."""
    b = max(1, round(frac * n))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    options = {"batch_clip_ratio": 0.3} if mechanism == "shuffled-dpsgd" else {}
    spec = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=n, batch_size=b, epochs=epochs, sigma=1.2,
                       options=options, model_dim=35, n_tensors=4, tensor_sizes=(20, 4, 12, 3))
    mech = mechanisms.get(mechanism)
    plan = mech.plan(spec)
    data = TensorDataset(torch.randn(n, 5), torch.randint(0, 3, (n,)))
    wrap = private_training.make_private if mechanism == "shuffled-dpsgd" else mech.make_private
    private = wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), data, plan,
                   criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(1))
    for _ in range(epochs):
        for x, y in private.loader:
            private.optimizer.zero_grad()
            private.criterion(private.module(x), y).backward()
            private.optimizer.step()
    assert private.optimizer.steps_taken == plan.steps == epochs * max(1, round(n / b))
    truth = reference_epsilon(plan.parts.noise_multiplier(1.2), b / n, private.optimizer.steps_taken, 1e-5)
    assert plan.epsilon_certified >= truth * (1 - 1e-6)
