"""The integrity checks, each exercised directly on a one-layer model (cheap: the default suite), with the real
private step (`Mechanism.make_private`, the book-keeping engine, privbench's parts):

- every broken mechanism of tests/plugins/broken_mechs/broken_hooks.py fails exactly the check meant to catch
  it, with a reason in words;
- correct mechanisms (DP-SGD, adaptive clipping, the docs' adaptive-clipping plugin) raise no alarm over 20
  seeds, with SGD + momentum + weight decay, and over a few seeds with Adam and AdamW;
- the docs' adaptive-clipping example runs as printed and is the plugin the sweep runs;
- the replay runs in a process of its own.

The sweep that runs them all on digits / mlp through `plugins:` is tests/mechanisms/test_broken_suite.py (slow).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import mechanisms
from mechanisms.framework import integrity
from mechanisms.framework.mechanism import plan_for
from mechanisms.parts.plan import PrivacySpec

PLUGINS = Path(__file__).parents[1] / "plugins" / "broken_mechs"
DOC = Path(__file__).parents[2] / "docs" / "plugins.md"
CAUGHT_BY = {
    "broken-reused-noise": "noise_stream", "broken-hidden-state": "state_replay",
    "broken-bound-after-plan": "plan_parameters", "broken-scaled-sum": "observers",
    "broken-state-bound": "clip_range", "broken-model-update": "model_update",
    "broken-correlated-noise": "model_update",
}
CORRECT = ("dpsgd", "dpsgd-adaclip", "docs-adaclip")


@pytest.fixture(scope="module", autouse=True)
def plugins():
    import sys

    from workers import plugins as loader

    sys.path.insert(0, str(PLUGINS))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a linear layer: threads only contend
    try:
        loader.load(["broken_hooks", "docs_adaclip"])
        yield
    finally:
        torch.set_num_threads(threads)
        sys.path.remove(str(PLUGINS))


def optimizer_for(name: str, module: nn.Module) -> torch.optim.Optimizer:
    params = list(module.parameters())
    if name == "adam":
        return torch.optim.Adam(params, lr=0.05, weight_decay=1e-3)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=0.05, weight_decay=1e-2)
    return torch.optim.SGD(params, lr=0.5, momentum=0.9, weight_decay=1e-4)


@functools.cache
def planned(name: str, epochs: int) -> object:
    """The plan at sigma 1 (no calibration: the checks do not depend on the noise level)."""
    spec = PrivacySpec(epsilon=None, sigma=1.0, delta=1e-5, dataset_size=256, batch_size=32, epochs=epochs,
                       clip=1.0, model_dim=18, n_tensors=2, tensor_sizes=(16, 2))
    return plan_for(mechanisms.get(name), spec)


def guarded_run(name: str, seed: int = 0, optimizer: str = "sgd", epochs: int = 2) -> list[integrity.Finding]:
    """One private training of a linear layer on 256 Gaussian examples (8 steps of 32 per epoch), every check's
    finding."""
    from workers.train import step_loss

    mechanism = mechanisms.get(name)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 8, generator=generator)
    data = TensorDataset(x, (x[:, 0] > 0).long())
    torch.manual_seed(seed)
    module = nn.Linear(8, 2)
    plan = planned(name, epochs)
    training = mechanism.make_private(module, optimizer_for(optimizer, module), data, plan,
                                      criterion=nn.CrossEntropyLoss(), generator=generator, grad_sample_mode="bk",
                                      noise_generator=torch.Generator().manual_seed(seed + 1))
    findings = [integrity.step_findings(training)]
    opt = training.optimizer
    for _ in range(epochs):
        for batch in training.loader:
            *xs, y = batch
            opt.example_weights = batch.weights
            opt.zero_grad(set_to_none=True)
            step_loss(training.criterion, training.module(*xs), y, batch).backward()
            opt.step()
    findings += opt.guard.findings()
    if opt.guard.trace is not None:
        findings.append(integrity.replay_state(mechanism, plan, opt.guard.trace.to_dict()))
    return findings


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_each_broken_hook_fails_the_check_meant_for_it(name):
    findings = guarded_run(name)
    failed = {f.check for f in findings if not f.passed}
    assert CAUGHT_BY[name] in failed, findings
    reason = integrity.certify(findings)
    assert reason and len(reason) > 40, reason  # in words


def test_no_false_alarm_over_20_seeds():
    """Correct mechanisms pass every check (SGD with momentum and weight decay), 20 seeds each."""
    alarms = {(name, seed): integrity.certify(guarded_run(name, seed, epochs=1))
              for name in CORRECT for seed in range(20)}
    assert {k: v for k, v in alarms.items() if v} == {}


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_the_model_shadow_follows_adam_and_adamw(optimizer):
    for name in ("dpsgd", "dpsgd-adaclip"):
        for seed in range(3):
            assert integrity.certify(guarded_run(name, seed, optimizer)) is None, (name, seed)


def test_the_shadow_and_the_stream_catch_a_change_made_between_steps():
    """Direct tampering, not through a plugin: a parameter nudged, then the generator reseeded."""
    mechanism = mechanisms.get("dpsgd")
    x = torch.randn(64, 4)
    module = nn.Linear(4, 2)
    spec = PrivacySpec(epsilon=None, sigma=1.0, delta=1e-5, dataset_size=64, batch_size=16, epochs=1, clip=1.0)
    plan = plan_for(mechanism, spec)
    noise = torch.Generator().manual_seed(3)
    training = mechanism.make_private(module, torch.optim.SGD(module.parameters(), lr=0.1), TensorDataset(
        x, (x[:, 0] > 0).long()), plan, criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0),
        grad_sample_mode="bk", noise_generator=noise)
    opt = training.optimizer
    for i, (xb, yb) in enumerate(training.loader):
        opt.zero_grad(set_to_none=True)
        training.criterion(training.module(xb), yb).backward()
        opt.step()
        if i == 0:
            with torch.no_grad():
                module.weight.add_(1e-3)
        if i == 1:
            noise.manual_seed(3)
    failed = {f.check: f.reason for f in opt.guard.findings() if not f.passed}
    assert set(failed) == {"model_update", "noise_stream"}, failed


def test_the_docs_adaptive_clipping_example_runs_as_printed():
    """The block in docs/plugins.md is the plugin module the sweep runs, and executing it gives a mechanism whose
    plan certifies what the built-in certifies."""
    section = DOC.read_text()[DOC.read_text().index("### Adaptive clipping, through the contract"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert code == (PLUGINS / "docs_adaclip.py").read_text()
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - the documented code, verbatim
    spec = PrivacySpec(epsilon=2.0, delta=1e-5, dataset_size=1438, batch_size=64, epochs=2)
    ours, builtin = plan_for(namespace["mechanism"], spec), plan_for(mechanisms.get("dpsgd-adaclip"), spec)
    assert ours.epsilon_certified == pytest.approx(builtin.epsilon_certified, rel=1e-9)
    assert ours.sigma == pytest.approx(builtin.sigma, rel=1e-9)


@pytest.mark.slow
def test_the_replay_runs_in_its_own_process():
    """The analysis' replay (`workers.replay`) in a fresh process: the hidden-state plugin does not replay, the
    correct adaptive clipping does (slow: two fresh Python processes; the in-process replay is tested above)."""
    from workers.config import TrialConfig
    from workers.replay import replay_apart

    for name, passed in (("broken-hidden-state", False), ("dpsgd-adaclip", True)):
        mechanism = mechanisms.get(name)
        plan = planned(name, 1)
        module = nn.Linear(8, 2)
        x = torch.randn(256, 8)
        training = mechanism.make_private(module, torch.optim.SGD(module.parameters(), lr=0.5),
                                          TensorDataset(x, (x[:, 0] > 0).long()), plan,
                                          criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0),
                                          grad_sample_mode="bk", noise_generator=torch.Generator().manual_seed(1))
        for xb, yb in training.loader:
            training.optimizer.zero_grad(set_to_none=True)
            training.criterion(training.module(xb), yb).backward()
            training.optimizer.step()
        config = TrialConfig(dataset="digits", model="mlp", mechanism=name, epsilon=2.0,
                             plugins=("broken_hooks",)).to_dict()
        finding = replay_apart(config, plan, training.optimizer.guard.trace.to_dict())
        assert finding.passed is passed, finding
