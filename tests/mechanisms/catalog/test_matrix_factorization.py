"""mechanisms/catalog/matrix_factorization.py: the frame `dpftrl-tree` and `dp-bandmf` share, through the
mechanism contract: calibration to a target, the executed process (fixed-order batches, streamed correlated
noise, privbench's step), the one-step audit and its probe, and a researcher's own strategy (the documented
example)."""

from __future__ import annotations

import math

import dp_accounting
import pytest
import torch

import mechanisms
from mechanisms.framework.claims import claim_status
from mechanisms.framework.integrity.verdict import plan_for, step_findings
from mechanisms.parts.correlated_noise import CorrelatedNoise
from mechanisms.parts.plan import PrivacySpec
from tests.mechanisms.catalog.fixed_order_setting import DELTA, EPOCHS, spec


@pytest.mark.parametrize("mechanism_id", ["dpftrl-tree", "dp-bandmf"])
def test_calibrated_to_the_target_and_ok(mechanism_id):
    plan = plan_for(mechanisms.get(mechanism_id), spec(epsilon_target=2.0))
    assert plan.epsilon_claimed <= 2.0 + 1e-9 and plan.epsilon_claimed == pytest.approx(2.0, rel=2e-3)
    assert plan.epsilon_certified <= plan.epsilon_claimed
    assert plan.uncertified_reason is None
    assert claim_status(plan.epsilon_claimed, plan.epsilon_certified, None) == "ok"


@pytest.mark.parametrize("mechanism_id,options", [("dpftrl-tree", {}), ("dp-bandmf", {"bands": 2})])
def test_training_runs_the_fixed_order_and_the_streamed_noise(mechanism_id, options):
    """make_private runs the plan's parts: fixed-order batches (the same every epoch), the correlated noise's
    stream (one draw per update), exactly plan.steps updates, privbench's step."""
    n, batch, epochs = 200, 50, 2
    mechanism = mechanisms.get(mechanism_id)
    plan = mechanism.plan(PrivacySpec(epsilon=None, delta=DELTA, dataset_size=n, batch_size=batch, epochs=epochs,
                                      sigma=1.0, options=options))
    model = torch.nn.Linear(3, 2)
    data = torch.utils.data.TensorDataset(torch.randn(n, 3), torch.randint(0, 2, (n,)))
    private = mechanism.make_private(model, torch.optim.SGD(model.parameters(), lr=0.0), data, plan,
                                     criterion=torch.nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0),
                                     noise_generator=torch.Generator().manual_seed(1))
    assert isinstance(private.optimizer.noise, CorrelatedNoise) and private.optimizer.noise_stream is not None
    assert step_findings(private).passed, step_findings(private).reason
    batches = []
    for _ in range(epochs):
        for x, y in private.loader:
            batches.append(x.clone())
            private.optimizer.zero_grad()
            private.criterion(private.module(x), y).backward()
            private.optimizer.step()
    assert private.optimizer.steps_taken == plan.steps == 8
    assert all(torch.equal(a, b) for a, b in zip(batches[:4], batches[4:], strict=True))
    assert private.optimizer.noise_stream.strategy.steps_taken == plan.steps
    assert step_findings(private).passed, step_findings(private).reason
    findings = private.optimizer.guard.findings()  # the per-step checks pass: the stream is privbench's, fresh
    assert all(f.passed for f in findings), [f for f in findings if not f.passed]


def test_one_step_audit_of_a_correct_run_is_ok():
    """The one-step audit tests one participation's release (the first step of a fresh stream) against the claim:
    a correct mechanism is not violated, and its audited epsilon is above zero."""
    from mechanisms.auditing import audit_step, step_spec

    for mechanism_id in ("dp-bandmf", "dpftrl-tree"):
        audit = audit_step(mechanisms.get(mechanism_id), step_spec(1.0, 1e-5), samples=4000, dim=50, seed=0)
        assert not audit.violated
        assert audit.epsilon_audited > 0
        assert audit.claim_status == "ok"


def test_the_documented_own_correlated_mechanism_certifies():
    """docs/mechanisms.md "Writing your own": the example, verbatim, plans a certified run whose sensitivity is
    computed from its coefficients under the executed schema."""
    import re
    from pathlib import Path

    from mechanisms.framework import registry

    text = (Path(__file__).resolve().parents[3] / "docs" / "mechanisms.md").read_text()
    section = text[text.index("**Writing your own.**"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    try:
        exec(compile(code, "docs/mechanisms.md", "exec"), {})  # noqa: S102 - the documented code, verbatim
        plan = plan_for(mechanisms.get("geometric-bands"), spec(sigma=8.0))
        sens = 2 * math.sqrt(EPOCHS * (1 + 0.25 + 0.0625))  # 3 bands <= P: non-overlapping columns, x2 replace-one
        assert plan.uncertified_reason is None
        assert plan.effective_event == dp_accounting.GaussianDpEvent(pytest.approx(8.0 / sens))
    finally:
        if "geometric-bands" in mechanisms.names():
            registry.unregister("geometric-bands")


@pytest.mark.parametrize("mechanism_id", ["dp-bandmf", "dpftrl-tree"])
def test_the_step_probe_checks_the_whitened_noise_and_finds_nothing(mechanism_id):
    """The one-step audit's probe of the training code: canaries pushed one plan unit, the residuals whitened with
    the declared correlation and tested at the per-step sigma: a correct correlated mechanism has no finding."""
    from workers.audit import step_probe

    mechanism = mechanisms.get(mechanism_id)
    probe = step_probe(mechanism, mechanism.plan(spec(epsilon_target=8.0)), 0)
    assert "audit_step_probe_findings" not in probe and "audit_step_probe_skipped" not in probe
    assert probe["audit_step_probe_push"] == pytest.approx(1.0, abs=0.15)
    assert probe["audit_step_probe_p_value"] > 0.001
