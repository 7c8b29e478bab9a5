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
from mechanisms.framework.integrity import guard, verdict
from mechanisms.framework.integrity.verdict import plan_for
from mechanisms.parts.plan import PrivacySpec

PLUGINS = Path(__file__).parents[3] / "plugins" / "broken_mechs"
DOC = Path(__file__).parents[4] / "docs" / "plugins.md"
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
    if name == "adam-amsgrad":
        return torch.optim.Adam(params, lr=0.05, amsgrad=True, maximize=True)
    if name == "sgd-plain":
        return torch.optim.SGD(params, lr=0.5)
    if name == "sgd-nesterov":
        return torch.optim.SGD(params, lr=0.5, momentum=0.9, nesterov=True, weight_decay=1e-3)
    if name == "sgd-groups":  # the weight and the bias in groups of their own (the shadow updates them apart)
        return torch.optim.SGD([{"params": [module.weight], "lr": 0.5, "dampening": 0.5},
                                {"params": [module.bias], "lr": 0.1, "maximize": True}], momentum=0.9)
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
    findings = [verdict.step_findings(training)]
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
        findings.append(verdict.replay_state(mechanism, plan, opt.guard.trace.to_dict()))
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


@pytest.mark.parametrize("optimizer", ["sgd-plain", "sgd-nesterov", "sgd-groups", "adam-amsgrad"])
def test_the_model_shadow_follows_every_optimizer_variant(optimizer):
    """Each branch of the shadow's update (no momentum, Nesterov with weight decay, dampening, maximize, parameter
    groups of their own, AMSGrad) recomputes what torch's optimizer did: no alarm."""
    for name in ("dpsgd", "dpsgd-adaclip"):
        assert integrity.certify(guarded_run(name, 0, optimizer, epochs=1)) is None, name


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


def test_the_shadow_counts_every_mismatched_step_across_its_blocks():
    """The shadow keeps each step's excess in blocks of SHADOW_BLOCK rows and counts a block when it fills: a
    nudge after every third update, over more steps than two blocks, is counted once per nudged step."""
    mechanism = mechanisms.get("dpsgd")
    steps = 2 * guard.SHADOW_BLOCK + 10
    x = torch.randn(steps * 4, 4, generator=torch.Generator().manual_seed(0))
    module = nn.Linear(4, 2)
    spec = PrivacySpec(epsilon=None, sigma=1.0, delta=1e-5, dataset_size=len(x), batch_size=4, epochs=1, clip=1.0)
    training = mechanism.make_private(module, torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.5),
                                      TensorDataset(x, (x[:, 0] > 0).long()), plan_for(mechanism, spec),
                                      criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0),
                                      grad_sample_mode="bk", noise_generator=torch.Generator().manual_seed(1))
    opt, nudged = training.optimizer, 0
    for xb, yb in training.loader:
        opt.zero_grad(set_to_none=True)
        training.criterion(training.module(xb), yb).backward()
        opt.step()
        if opt.steps_taken % 3 == 0 and opt.update_applied and opt.steps_taken < opt.planned_steps:  # seen next
            nudged += 1
            with torch.no_grad():
                module.bias.add_(1e-2)
    failed = {f.check: f.reason for f in opt.guard.findings() if not f.passed}
    assert opt.steps_taken > 2 * guard.SHADOW_BLOCK and nudged > 40
    assert set(failed) == {"model_update"} and f"in {nudged} step(s)" in failed["model_update"], failed


def test_the_shadows_coordinate_views_follow_any_layout():
    """The one-element views the shadow gathers with one `cat` sit at the flat (row-major) positions drawn, for a
    contiguous tensor and a transposed one alike, and follow in-place updates."""
    from mechanisms.framework.integrity.guard import _coordinate_views

    base = torch.arange(24.0).reshape(4, 6)
    for tensor in (base, base.t(), base[:, 1::2]):
        index = [0, 5, 7, tensor.numel() - 1]
        views = _coordinate_views(tensor, index)
        assert torch.cat(views).tolist() == tensor.reshape(-1)[index].tolist()
        tensor.mul_(2)
        assert torch.cat(views).tolist() == tensor.reshape(-1)[index].tolist()


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


def test_after_step_returns_nothing_and_sees_copies():
    """The old contract's `after_step` returned a callable run on the optimizer: now a returned value is a failed
    check, and what the hook does to its copies reaches nothing (the shadow and the stream stay clean)."""
    from mechanisms import Mechanism
    from mechanisms.framework import registry

    class OldContract(Mechanism):
        ID = "test-old-after-step"

        def after_step(self, released, state, plan, options):
            for g in released.gradient:
                g.mul_(100)  # its own copy: the model never sees this
            return lambda optimizer: None

    mechanisms.register(OldContract())
    try:
        failed = {f.check: f.reason for f in guarded_run("test-old-after-step", epochs=1) if not f.passed}
    finally:
        registry.unregister("test-old-after-step")
    assert set(failed) == {"hooks"} and "returns nothing" in failed["hooks"], failed


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")  # the row `cat` writes
def test_the_state_trace_keeps_every_step_and_stops_on_another_layout():
    """The trace's device rows (allocated TRACE_CHUNK at a time) give back each step's releases and the state
    after it, over more steps than one chunk; a step that releases another layout stops the trace, and the replay
    then fails with the reason instead of comparing a partial record."""
    from mechanisms.parts.releases import Released

    trace = integrity.StateTrace(n_params=4)
    state = {"clip": torch.tensor(1.0)}
    steps = guard.TRACE_CHUNK + 44
    for t in range(steps):
        state["clip"].copy_(torch.tensor(1.0 + t))  # in place, as the trainer updates the state
        trace.add(Released((), {"unclipped": torch.tensor([0.5 * t]), "other": torch.tensor(-t)}), state)
    record = trace.to_dict()
    assert record["steps"] == steps and record["broken"] is None
    assert integrity.decode(record["values"]["unclipped"])[:, 0].tolist() == [0.5 * t for t in range(steps)]
    assert integrity.decode(record["values"]["other"])[:, 0].tolist() == [-t for t in range(steps)]
    assert integrity.decode(record["states"]["clip"])[:, 0].tolist() == [1.0 + t for t in range(steps)]

    trace.add(Released((), {"unclipped": torch.tensor([1.0, 2.0]), "other": torch.tensor(0)}), state)
    record = trace.to_dict()
    assert record["steps"] == steps and "released" in record["broken"]
    finding = verdict.replay_state(mechanisms.get("dpsgd-adaclip"), planned("dpsgd-adaclip", 1), record)
    assert not finding.passed and f"step {steps + 1}" in finding.reason, finding
