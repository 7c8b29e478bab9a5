"""mechanisms/framework/integrity/verdict.py: a plugin that overrides a method privbench runs itself is planned
`uncertified` (privbench's own mechanisms are not), a private step patched on its instance is caught before it
runs, and `verify` counts each finding once."""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.data import TensorDataset

from mechanisms.catalog.dpsgd import DpSgd
from mechanisms.framework.integrity.findings import Finding
from mechanisms.framework.integrity.verdict import contract_findings, plan_for, runs_own_step, step_findings, verify
from mechanisms.parts.plan import PrivacySpec

SPEC = PrivacySpec(epsilon=None, sigma=1.0, delta=1e-5, dataset_size=64, batch_size=16, epochs=1, clip=1.0)


class OwnStep(DpSgd):
    """A plugin's DP-SGD that trains with its own `make_private` (here: privbench's, called through)."""

    ID = "test-own-step"

    def make_private(self, *args, **kwargs):
        return super().make_private(*args, **kwargs)


@functools.cache
def planned(cls: type[DpSgd]) -> object:
    """Each mechanism's plan once (three accountants: about 0.6 CPU s)."""
    return plan_for(cls(), SPEC)


def test_an_override_of_a_template_method_is_uncertified_and_privbenchs_own_is_not():
    builtin, plugin = DpSgd(), OwnStep()
    assert contract_findings(builtin) == [Finding("contract", True)] and runs_own_step(builtin)
    (finding,) = contract_findings(plugin)
    assert not finding.passed and "OwnStep overrides Mechanism.make_private" in finding.reason
    assert not runs_own_step(plugin)
    certified, refused = planned(DpSgd), planned(OwnStep)
    assert certified.epsilon_certified is not None and certified.epsilon_certified > 0
    assert refused.epsilon_certified is None and "make_private" in refused.uncertified_reason
    assert refused.sigma == certified.sigma  # what runs is planned alike; only the certificate is withheld


def train_one_step_later(mechanism: DpSgd) -> object:
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    module = nn.Linear(4, 2)
    return mechanism.make_private(module, torch.optim.SGD(module.parameters(), lr=0.1),
                                  TensorDataset(x, (x[:, 0] > 0).long()), planned(type(mechanism)),
                                  criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0),
                                  grad_sample_mode="bk", noise_generator=torch.Generator().manual_seed(1))


def test_a_step_patched_on_its_instance_is_caught_before_it_runs():
    training = train_one_step_later(DpSgd())
    assert step_findings(training) == Finding("step_code", True)
    training.optimizer.add_noise = lambda *args, **kwargs: None  # the noise skipped, from this file
    finding = step_findings(training, when="before the first step")
    assert not finding.passed and finding.reason.startswith("before the first step: ")
    assert f"add_noise was replaced on the instance by code from {__file__}" in finding.reason


def test_verify_gathers_the_contract_and_each_recorded_finding_once():
    plugin = OwnStep()
    stream = Finding("noise_stream", False, "reseeded at step 2")
    found = verify(plugin, planned(OwnStep), [stream, Finding("hooks", True), stream],
                   replayed=Finding("state_replay", True))
    assert [f.check for f in found] == ["contract", "noise_stream", "hooks", "state_replay"]
    assert not found[0].passed and found[1] == stream
