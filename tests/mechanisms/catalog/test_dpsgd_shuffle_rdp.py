"""`dpsgd-shuffle-rdp`, DP-SGD as Tramèr & Boneh (2021) ran it: shuffled batches executed, RDP under Poisson
sampling claimed. Their claim against an independent RDP computation, their published sigmas, and the
verdict privbench gives it."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch

import mechanisms
from mechanisms.accounting.moments_accountant import TF_PRIVACY_ORDERS
from mechanisms.framework.claims import claim_status
from mechanisms.framework.integrity.verdict import plan_for
from mechanisms.parts.batch_selection import ShuffleSampling
from mechanisms.parts.plan import PrivacySpec

N, DELTA, EPOCHS = 60_000, 1e-5, 40
# Their README's commands: (batch size, published noise multiplier) at (3, 1e-5) over 40 epochs.
PUBLISHED = {"fashion-mnist cnn": (2048, 2.15), "fashion-mnist scatternet-linear": (8192, 4.05),
             "mnist cnn": (512, 1.23)}


def spec(batch: int, *, sigma: float | None = None, sampler: str = "poisson") -> PrivacySpec:
    return PrivacySpec(epsilon=None if sigma else 3.0, delta=DELTA, dataset_size=N, batch_size=batch, epochs=EPOCHS,
                       clip=0.1, sigma=sigma, sampler=sampler)


def classic_from_dp_accounting(sigma: float, q: float, steps: int) -> float:
    """Their epsilon recomputed from dp-accounting's RDP of the Poisson-subsampled Gaussian (an implementation
    independent of Opacus'), at their orders, with the classic conversion min_a [RDP(a) + log(1/delta)/(a-1)].
    dp-accounting has no public getter for the composed RDP curve, so this reads its `_rdp`."""
    accountant = dp_accounting.rdp.RdpAccountant(list(TF_PRIVACY_ORDERS))
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    orders = np.asarray(TF_PRIVACY_ORDERS)
    return float(np.min(np.asarray(accountant._rdp) + math.log(1 / DELTA) / (orders - 1)))


@pytest.mark.parametrize("batch, sigma", PUBLISHED.values(), ids=PUBLISHED)
def test_the_claim_is_rdp_of_poisson_sampling_with_the_classic_conversion(batch, sigma):
    plan = mechanisms.get("dpsgd-shuffle-rdp").plan(spec(batch, sigma=sigma))
    steps = EPOCHS * (N // batch)  # their get_noise_mul's steps, and the shuffled loader's round(N / B)
    assert (plan.extra["claimed_sample_rate"], plan.extra["claimed_steps"]) == (batch / N, steps)
    assert plan.epsilon_claimed == pytest.approx(classic_from_dp_accounting(sigma, batch / N, steps), rel=1e-6)
    assert plan.epsilon_claimed == pytest.approx(3.0, abs=0.01)  # what their paper reports for it
    improved = dp_accounting.rdp.RdpAccountant().compose(
        dp_accounting.PoissonSampledDpEvent(batch / N, dp_accounting.GaussianDpEvent(sigma)), steps).get_epsilon(DELTA)
    assert plan.extra["epsilon_if_poisson_pld"] < improved < plan.epsilon_claimed  # PLD < RDP (improved) < classic


@pytest.mark.parametrize("batch, sigma", PUBLISHED.values(), ids=PUBLISHED)
def test_calibrating_to_their_claim_gives_their_published_sigma(batch, sigma):
    plan = mechanisms.get("dpsgd-shuffle-rdp").plan(spec(batch))
    assert plan.sigma == pytest.approx(sigma, abs=0.01)  # their bisection stops at 0.01 in epsilon
    assert plan.epsilon_claimed <= 3.0
    sound = mechanisms.get("dpsgd").plan(spec(batch))  # the as-certified way: Poisson executed, PLD meets 3
    assert sound.epsilon_certified <= 3.0 and sound.sampler == "poisson"
    assert sound.sigma < plan.sigma  # PLD asks less noise than their RDP for the same epsilon


def test_certified_is_the_shuffled_run_and_the_verdict_is_overclaimed():
    batch, sigma = PUBLISHED["fashion-mnist cnn"]
    for sampler in ("poisson", "shuffle"):  # the grid's sampler does not change what runs
        plan = plan_for(mechanisms.get("dpsgd-shuffle-rdp"), spec(batch, sigma=sigma, sampler=sampler))
        assert isinstance(plan.parts.sampler, ShuffleSampling) and plan.sampler == "shuffle"
        assert plan.neighboring_relation == "replace-one"
        # one Gaussian release per epoch (replace-one: sensitivity 2C), composed over the epochs
        shuffled = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma / 2), EPOCHS)
        expected = dp_accounting.pld.PLDAccountant().compose(shuffled).get_epsilon(DELTA)
        assert plan.epsilon_certified == pytest.approx(expected, rel=1e-3)
        assert plan.epsilon_certified > 40 > 3.01 > plan.epsilon_claimed
        assert claim_status(plan.epsilon_claimed, plan.epsilon_certified) == "overclaimed"


def test_each_epoch_sees_every_example_once():
    plan = mechanisms.get("dpsgd-shuffle-rdp").plan(PrivacySpec(epsilon=None, delta=DELTA, dataset_size=100,
                                                                batch_size=32, epochs=2, sigma=1.0))
    seen = [i for step in plan.parts.sampler.epoch(torch.Generator().manual_seed(0)) for i in step.index.tolist()]
    assert sorted(seen) == list(range(100)) and plan.steps == 2 * 3


def test_the_step_audit_does_not_refute_the_one_step_claim():
    """Their claim is loose about the sampler, not about one Gaussian step: the step audit passes (the verdict is
    `overclaimed` from the certificate, not `violated`)."""
    from workers.audit import step_audit
    from workers.config import AuditConfig

    mechanism = mechanisms.get("dpsgd-shuffle-rdp")
    small = PrivacySpec(epsilon=2.0, delta=DELTA, dataset_size=1437, batch_size=64, epochs=2, model_dim=1000)
    plan = plan_for(mechanism, small)
    audit = step_audit(mechanism, plan, small.clip, AuditConfig(samples=20_000), {}, seed=0, workers=2)
    assert not audit["audit_step_violated"]
    assert claim_status(plan.epsilon_claimed, plan.epsilon_certified, None,
                        audit_violated=audit["audit_step_violated"]) == "overclaimed"
