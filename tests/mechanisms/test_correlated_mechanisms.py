"""`dpftrl-tree` and `dp-bandmf` through the mechanism contract: their certificate against dp-accounting's own tree
aggregation and the band paper's sensitivity, the verdict, the executed process (fixed-order batches, streamed
correlated noise, the step privbench's), and the one-step audit."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.rdp import rdp_privacy_accountant

import mechanisms
from mechanisms.accounting import epsilon
from mechanisms.framework.claims import claim_status
from mechanisms.framework.integrity.verdict import plan_for, step_findings
from mechanisms.parts.correlated_noise import CorrelatedNoise
from mechanisms.parts.plan import PrivacySpec
from tests.mechanisms.parts.test_correlated_noise import dense_tree

N, B, EPOCHS, DELTA = 1437, 64, 6, 1e-5  # digits' training split, P = round(N / B) = 22 steps per epoch
P = round(N / B)
REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE
REPLACE_SPECIAL = dp_accounting.NeighboringRelation.REPLACE_SPECIAL


def spec(epsilon_target=None, sigma=None, **options) -> PrivacySpec:
    return PrivacySpec(epsilon=epsilon_target, delta=DELTA, dataset_size=N, batch_size=B, epochs=EPOCHS, clip=1.0,
                       sigma=sigma, options=options)


def test_tree_certificate_equals_dp_accountings_tree_aggregation():
    """Certified RDP and the claim equal dp-accounting's own RDP of tree aggregation restarted every epoch (E trees,
    one participation each: `SingleEpochTreeAggregationDpEvent` under `REPLACE_SPECIAL`, a record replaced by a
    zero one, sensitivity C; replace-one moves a node by 2C, the event at sigma / 2). The PLD certificate equals
    dp-accounting's PLD of the Gaussians one example's nodes receive, counted on the tree's incidence matrix."""
    sigma = 20.0
    plan = mechanisms.get("dpftrl-tree").plan(spec(sigma=sigma))

    def tree_rdp(noise_multiplier: float) -> float:
        tree = dp_accounting.SingleEpochTreeAggregationDpEvent(noise_multiplier, P)
        accountant = rdp_privacy_accountant.RdpAccountant(neighboring_relation=REPLACE_SPECIAL)
        return accountant.compose(dp_accounting.SelfComposedDpEvent(tree, EPOCHS)).get_epsilon(DELTA)

    reference = tree_rdp(sigma / 2)
    assert plan.epsilons["rdp"] == pytest.approx(reference, rel=1e-3)
    assert plan.epsilon_claimed == pytest.approx(reference, rel=1e-3)
    assert plan.extra["epsilon_zero_out"] == pytest.approx(tree_rdp(sigma), rel=1e-3)
    nodes = EPOCHS * int(dense_tree(P).sum(0).max())  # the most nodes of one tree that hold one leaf
    pld = dp_accounting.pld.PLDAccountant(REPLACE_ONE, value_discretization_interval=1e-4)
    gaussians = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), nodes)
    assert plan.epsilon_certified == pytest.approx(pld.compose(gaussians).get_epsilon(DELTA), rel=1e-3)
    assert plan.sampler == "fixed-order" and plan.neighboring_relation == "replace-one"
    assert claim_status(plan.epsilon_claimed, plan.epsilon_certified, None) == "ok"


@pytest.mark.parametrize("bands", [1, 2, 3, 8])
def test_bandmf_certificate_equals_the_papers_min_separation_sensitivity(bands):
    sigma = 10.0
    plan = mechanisms.get("dp-bandmf").plan(spec(sigma=sigma, bands=bands))
    coefficients = [math.comb(2 * k, k) / 4 ** k for k in range(bands)]
    sens = 2 * math.sqrt(EPOCHS * sum(c * c for c in coefficients))  # replace-one, b <= P: sqrt(k) max column norm
    assert plan.effective_event == dp_accounting.GaussianDpEvent(pytest.approx(sigma / sens))
    assert plan.epsilon_certified == pytest.approx(
        epsilon(dp_accounting.GaussianDpEvent(sigma / sens), DELTA, "pld"), rel=1e-3)
    assert plan.epsilon_claimed == pytest.approx(plan.epsilon_certified, rel=1e-3)


def test_bandmf_with_more_bands_than_an_epoch_is_overclaimed():
    """b > P: the columns of one example's participations overlap, the certificate adds the overlap, the paper's
    sqrt(k) max-column-norm formula does not: the verdict shows it."""
    small = PrivacySpec(epsilon=None, delta=DELTA, dataset_size=100, batch_size=25, epochs=3, sigma=5.0,
                        options={"bands": 6})  # P = 4 < 6 bands
    plan = mechanisms.get("dp-bandmf").plan(small)
    assert plan.epsilon_certified > plan.epsilon_claimed * 1.01
    assert claim_status(plan.epsilon_claimed, plan.epsilon_certified, None) == "overclaimed"


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
    stream (successive steps' noise correlated as declared), exactly plan.steps updates, privbench's step."""
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
    batches, noises = [], []
    for _ in range(epochs):
        for x, y in private.loader:
            batches.append(x.clone())
            private.optimizer.zero_grad()
            private.criterion(private.module(x), y).backward()
            private.optimizer.step()
            noises.append(private.optimizer.last_released.gradient[0].clone())
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


def test_first_release_is_one_participation():
    """Without a stream, `release` is step 0 of a fresh one: the sums plus N(0, (s / c_0)^2), independent rows."""
    plan = mechanisms.get("dp-bandmf").plan(spec(sigma=2.0, bands=3))
    rows = torch.zeros(20000, 4, dtype=torch.float64)
    out = plan.parts.noise.release([rows], 2.0, torch.Generator().manual_seed(0))[0].numpy()
    assert np.std(out) == pytest.approx(2.0, rel=0.02)


def test_fixed_order_dpsgd_and_the_second_band_count():
    """dpsgd-fixed-order: DP-SGD's noise on the correlated mechanisms' batches, one Gaussian of sigma / 2 per epoch
    (replace-one), whatever the grid's sampler; dp-bandmf-4 is dp-bandmf at 4 bands by default."""
    sigma = 6.0
    plan = mechanisms.get("dpsgd-fixed-order").plan(spec(sigma=sigma))
    assert plan.sampler == "fixed-order" and plan.epsilon_claimed == plan.epsilon_certified
    assert plan.epsilon_certified == pytest.approx(
        epsilon(dp_accounting.GaussianDpEvent(sigma / (2 * math.sqrt(EPOCHS))), DELTA, "pld"), rel=1e-3)
    four = mechanisms.get("dp-bandmf-4").plan(spec(sigma=sigma))
    assert four.extra["options"] == {"bands": 4}
    assert four.epsilon_certified == pytest.approx(mechanisms.get("dp-bandmf").plan(spec(sigma=sigma, bands=4))
                                                   .epsilon_certified)


def test_the_documented_own_correlated_mechanism_certifies():
    """docs/mechanisms.md "Writing your own": the example, verbatim, plans a certified run whose sensitivity is
    computed from its coefficients under the executed schema."""
    import re
    from pathlib import Path

    from mechanisms.framework import registry

    text = (Path(__file__).resolve().parents[2] / "docs" / "mechanisms.md").read_text()
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
