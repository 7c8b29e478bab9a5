"""Rows stay independent through the model and the loss, and all model state is covered (issue 47, items 2 and 3):

- the validator refuses known mixers (BatchNorm in train mode, running statistics) in one line naming the module
  and the fix, and `fix` swaps them as Opacus does;
- the row probe catches what no rule names (BatchNorm on the input, a loss normalised over the batch, a module
  without parameters that centres the batch), naming the first module where the rows mix, and raises no alarm on
  LayerNorm, GroupNorm, dropout and every built-in model;
- the training probe runs on its drawn steps with the model's state then, and is read after training;
- the model-state watch (`integrity.StateWatch`, inside the step's guard) catches buffers and frozen parameters
  that change during training, and passes a model whose state stays put.

The trials that run them end to end are tests/workers/test_row_checks_trial.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import mechanisms
from mechanisms.framework import integrity
from mechanisms.framework.integrity import model_checks
from mechanisms.framework.integrity.verdict import plan_for
from mechanisms.parts.plan import PrivacySpec


class Center(nn.Module):
    """No parameters, mixes rows: each example minus the batch's mean."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(0)


class BatchSoftmax(nn.Module):
    """An MLP whose forward ends in log_softmax over the batch: the loss is normalised over the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.net(x), dim=0)


class FrozenBatchNorm(nn.Sequential):
    """BatchNorm kept in eval mode whatever the trainer asks: its running statistics are constants."""

    def train(self, mode: bool = True) -> FrozenBatchNorm:
        super().train(mode)
        self[0].eval()
        return self


class RunningMean(nn.Module):
    """A custom layer that keeps a running mean of its inputs (no rule for its type, a `running_` buffer)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.running_mean.mul_(0.9).add_(x.mean(0), alpha=0.1)
        return x


class CentreBetween(nn.Module):
    """Mixes rows in its own forward, between two of its submodules."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(16, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        return self.second(h - h.mean(0))


class _MixGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad - grad.mean(0)


class BackwardMixer(nn.Module):
    """The identity forward; its backward subtracts the batch's mean gradient (the outputs never mix)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _MixGradients.apply(x)


def head() -> list[nn.Module]:
    return [nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3)]


MIXERS = {  # model -> where the probe must say the rows mix
    "batchnorm-on-input": (lambda: nn.Sequential(nn.BatchNorm1d(16, affine=False), *head()), "`0` (BatchNorm1d)"),
    "log-softmax-over-batch": (BatchSoftmax, "model's own forward (BatchSoftmax.forward"),
    "centre-the-batch": (lambda: nn.Sequential(nn.Linear(16, 8), Center(), nn.Tanh(), nn.Linear(8, 3)),
                         "`1` (Center)"),
    "centre-between-modules": (CentreBetween, "outside any module, before the module `second` (Linear)"),
    "mix-in-backward": (lambda: nn.Sequential(nn.Linear(16, 8), BackwardMixer(), nn.Tanh(), nn.Linear(8, 3)),
                        "in the backward pass"),
}
CORRECT = {
    "layernorm-dropout": lambda: nn.Sequential(nn.Linear(16, 8), nn.LayerNorm(8), nn.Dropout(0.5), nn.Tanh(),
                                               nn.Linear(8, 3)),
    "groupnorm-dropout": lambda: nn.Sequential(nn.Linear(16, 8), nn.GroupNorm(2, 8), nn.Dropout(0.3),
                                               nn.Linear(8, 3)),
    "frozen-batchnorm": lambda: FrozenBatchNorm(nn.BatchNorm1d(16), *head()),
}


def batch(rows: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 16, generator=generator), torch.randint(0, 3, (rows,), generator=generator)


# ---- the validator ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layer", [nn.BatchNorm1d(16), nn.BatchNorm1d(16, affine=False), nn.SyncBatchNorm(16),
                                   nn.InstanceNorm1d(16, track_running_stats=True), RunningMean(16)],
                         ids=lambda m: type(m).__name__)
def test_the_validator_refuses_a_known_mixer_in_one_line_naming_the_module_and_the_fix(layer):
    model = nn.Sequential(nn.Linear(16, 16), layer, *head())
    with pytest.raises(model_checks.ModelRefused) as caught:
        model_checks.refuse(model)
    message = str(caught.value)
    assert "\n" not in message and f"`1` ({type(layer).__name__})" in message
    assert ("GroupNorm or LayerNorm" in message if "Batch" in type(layer).__name__ else
            "track_running_stats=False" in message or "Statistic" in message), message


def test_the_validator_accepts_layernorm_groupnorm_and_frozen_statistics():
    for make in CORRECT.values():
        assert model_checks.validate(make()) == []
    eval_bn = nn.Sequential(nn.BatchNorm1d(16), *head())
    assert model_checks.validate(eval_bn)  # train() at training time puts it back in train mode
    assert eval_bn[0].training  # and the validator left the modes as they were


def test_fix_swaps_batchnorm_for_groupnorm_and_drops_running_statistics_as_opacus_does():
    model = nn.Sequential(nn.Conv2d(3, 48, 3), nn.BatchNorm2d(48), nn.InstanceNorm2d(48, track_running_stats=True),
                          nn.Flatten(), nn.LazyLinear(3))
    fixed = model_checks.fix(model)
    assert isinstance(fixed[1], nn.GroupNorm) and fixed[1].num_groups == 16 and fixed[1].affine
    assert not fixed[2].track_running_stats and fixed[2].running_mean is None
    assert isinstance(model[1], nn.BatchNorm2d)  # a copy: the model itself is untouched
    assert model_checks.validate(fixed) == []
    assert isinstance(model_checks.fix(nn.BatchNorm1d(8)), nn.GroupNorm)  # the model itself replaced
    x, y = torch.randn(8, 3, 6, 6), torch.randint(0, 3, (8,))
    assert model_checks.probe_finding(model_checks.row_dependence(fixed, [x], y)).passed


# ---- the probe ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_the_probe_catches_a_mixer_and_names_the_first_module_where_rows_mix(name):
    make, where = MIXERS[name]
    x, y = batch()
    finding = model_checks.probe_finding(model_checks.row_dependence(make(), [x], y, changed=5))
    assert finding.check == "row_independence" and not finding.passed
    assert where in finding.reason and "before training" in finding.reason, finding.reason


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_the_probe_raises_no_alarm_on_independent_rows(name):
    for seed in range(5):
        x, y = batch(seed=seed)
        result = model_checks.row_dependence(CORRECT[name](), [x], y, changed=seed, seed=seed)
        assert model_checks.probe_finding(result).passed, (name, seed)


def test_the_probe_leaves_the_generators_and_the_model_as_they_were():
    model = CORRECT["layernorm-dropout"]()
    model.eval()
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    model_checks.row_dependence(model, *map(lambda t: [t] if t.dim() > 1 else t, batch()))
    assert torch.equal(torch.rand(3), expected) and not model.training
    assert all(not m._forward_hooks for m in model.modules())


BUILT_IN = {"mlp": "digits", "linear": "digits", "cnn-small": "digits", "cnn-tanh": "synthetic",
            "vit-tiny": "digits", "scatternet-linear": "synthetic", "scatternet-cnn": "synthetic",
            "bert-tiny": "synthetic-text", "gpt2-tiny": "synthetic-text"}


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_every_built_in_model_passes_the_validator_and_the_probe(name, tmp_path, monkeypatch):
    from workers import datasets, models
    from workers.train import probe_batch, tensor_dataset

    monkeypatch.setenv("PRIVBENCH_CACHE_DIR", str(tmp_path))
    dataset = BUILT_IN[name]
    options = {"digits": None, "synthetic": {"side": 28, "n_train": 24, "n_test": 8, "num_classes": 10},
               "synthetic-text": {"n_train": 24, "n_test": 8, "num_classes": 3}}[dataset]
    splits = datasets.load(dataset, options)
    torch.manual_seed(0)
    bundle = models.build(name, splits, {})
    assert model_checks.validate(bundle.module) == []
    watch = model_checks.RowWatch(bundle.module, 10)
    finding = watch.before_training(*probe_batch(tensor_dataset(bundle, splits.train), 16, 0, torch.device("cpu")))
    assert finding.passed, finding.reason


def test_the_training_probe_runs_on_its_drawn_steps_with_the_models_state_then():
    """A layer that mixes rows only once a buffer is set (after the probe before training) is caught at the drawn
    step, from the model's state copied into the twin, and read once after training."""

    class Switch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("on", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x - self.on * x.mean(0)

    model = nn.Sequential(nn.Linear(16, 8), Switch(), nn.Tanh(), nn.Linear(8, 3))
    x, y = batch(33)
    watch = model_checks.RowWatch(model, 6, probes=2, seed=1)
    assert watch.before_training([x[:32]], y[:32], [x[32]], y[32]).passed
    model[1].on.fill_(1.0)
    for step in range(1, 7):
        watch.step(step, [x], y, rows=len(y))
    assert len(watch.results) == 2 and len(watch.at) == 2
    (finding,) = watch.findings()
    assert not finding.passed and "`1` (Switch)" in finding.reason
    assert all(f"at step {s}" in finding.reason for s in watch.at)
    assert model_checks.probe_count(44) == 1 and model_checks.probe_count(1000) == model_checks.PROBE_STEPS


def test_a_training_probe_reads_nothing_on_the_host(monkeypatch):
    """benchmarks/step_profile.py's counter: a probed step adds no host synchronisation (its result is read after
    training, with the others, by `findings`)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[4] / "benchmarks"))
    import step_profile

    watch = model_checks.RowWatch(CORRECT["layernorm-dropout"](), 1, probes=1)
    x, y = batch(33)
    counter = step_profile.StepCounter()
    with counter:
        watch.step(1, [x], y, rows=len(y))
    assert counter.syncs == [] and len(watch.results) == 1
    assert watch.findings()[0].passed


# ---- the model-state watch -----------------------------------------------------------------------------------
def train_privately(module: nn.Module, between_steps=None, steps_seed: int = 0) -> list[integrity.Finding]:
    """DP-SGD on the book-keeping engine (privbench's private step, its guard on) over 4 x 16 Gaussian examples;
    `between_steps(module, i)` runs after each update."""
    mechanism = mechanisms.get("dpsgd")
    generator = torch.Generator().manual_seed(steps_seed)
    x = torch.randn(64, 16, generator=generator)
    spec = PrivacySpec(epsilon=None, sigma=1.0, delta=1e-5, dataset_size=64, batch_size=16, epochs=1, clip=1.0)
    training = mechanism.make_private(module, torch.optim.SGD([p for p in module.parameters() if p.requires_grad],
                                                              lr=0.1, momentum=0.9),
                                      TensorDataset(x, (x[:, 0] > 0).long()), plan_for(mechanism, spec),
                                      criterion=nn.CrossEntropyLoss(), generator=generator, grad_sample_mode="bk",
                                      noise_generator=torch.Generator().manual_seed(1))
    opt = training.optimizer
    for i, (xb, yb) in enumerate(training.loader):
        opt.zero_grad(set_to_none=True)
        training.criterion(training.module(xb), yb).backward()
        opt.step()
        if between_steps is not None:
            between_steps(module, i)
    return opt.guard.findings()


def failed(findings: list[integrity.Finding]) -> dict[str, str]:
    return {f.check: f.reason for f in findings if not f.passed}


@pytest.mark.parametrize("layer", [RunningMean(16), nn.BatchNorm1d(16, affine=False)], ids=lambda m: type(m).__name__)
def test_running_statistics_that_move_in_training_fail_the_model_state_check(layer):
    """The guard alone (the validator would refuse both before training): the running mean released nothing."""
    model = nn.Sequential(nn.Linear(16, 16), layer, nn.Tanh(), nn.Linear(16, 2))
    problems = failed(train_privately(model))
    assert set(problems) == {"model_state"}, problems
    assert problems["model_state"].startswith("the model's buffer `1.running_mean`"), problems
    assert "changed during training, and no release covers it" in problems["model_state"]


def test_a_frozen_parameter_or_a_buffer_changed_between_steps_or_replaced_is_caught():
    def nudge(module: nn.Module, i: int) -> None:
        if i == 1:
            with torch.no_grad():
                module[0].weight[3, 5] += 1e-3  # one value of a frozen parameter, likely off the watched coordinates

    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))
    model[0].requires_grad_(False)
    assert "frozen parameter `0.weight`" in failed(train_privately(model, nudge))["model_state"]

    standardise = RunningMean(16)
    model = nn.Sequential(standardise, nn.Linear(16, 2))
    standardise.eval()  # frozen: only a new tensor assigned to the buffer can change it

    def replace(module: nn.Module, i: int) -> None:
        if i == 2:
            module[0].running_mean = torch.ones(16)

    assert "buffer `0.running_mean`" in failed(train_privately(model, replace))["model_state"]


def test_state_that_stays_put_passes_frozen_parameters_and_released_buffers_included():
    for seed in range(3):
        model = nn.Sequential(RunningMean(16).eval(), nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 2))
        model[1].requires_grad_(False)
        model[0].running_mean.fill_(0.5)  # set before training, as a private release would
        findings = train_privately(model, steps_seed=seed)
        assert failed(findings) == {} and "model_state" in {f.check for f in findings}
