"""Each noise part's declared guarantee holds: a worst-case pair of neighbouring batches attains the declared
sensitivity, random pairs never exceed it, and the noise is what the event says."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from clipped_sums import ADD_REMOVE, REPLACE, distance

import mechanisms
from mechanisms.catalog import dp_forward
from mechanisms.parts.clipping import FlatClipping
from mechanisms.parts.noise_addition import BatchClippedGaussian, FrequencyNoise, GaussianNoise
from mechanisms.parts.plan import PrivacySpec


def _pre_noise(noise: BatchClippedGaussian, sums: list[torch.Tensor]) -> list[torch.Tensor]:
    """The batch-clipped sums, read from the release itself at sigma 0 (no noise drawn)."""
    return noise.release([s.unsqueeze(0) for s in sums], 0.0, None)


@pytest.mark.parametrize("ratio", [0.1, 0.3, 0.5, 2.0])
def test_batch_clip_sensitivity_is_attained_and_never_exceeded(ratio):
    c = 1.0
    clipper, noise = FlatClipping(c), BatchClippedGaussian(c, ratio * c)
    declared = noise.sensitivity(clipper, ADD_REMOVE)
    assert declared == pytest.approx(min(c, 2 * ratio * c))
    u = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    # worst case: S = c' u and S' = (c' - c) u: both in the ball, or the clip maps them to +-c' u
    a, b = _pre_noise(noise, [ratio * c * u]), _pre_noise(noise, [(ratio * c - c) * u])
    assert distance(a, b) == pytest.approx(declared, rel=1e-5)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        s = torch.randn(3, generator=gen, dtype=torch.float64) * 3
        v = torch.randn(3, generator=gen, dtype=torch.float64)
        v = v / v.norm() * c * float(torch.rand(1, generator=gen))
        assert distance(_pre_noise(noise, [s]), _pre_noise(noise, [s + v])) <= declared * (1 + 1e-5)


def test_gaussian_noise_has_the_declared_std_and_multiplier():
    clipper = FlatClipping(0.5)
    noise = GaussianNoise(clipper.bound)
    out = noise.release([torch.zeros(1, 200_000, dtype=torch.float64)], 2.0, torch.Generator().manual_seed(0))[0]
    assert float(out.std()) == pytest.approx(2.0 * 0.5, rel=0.01)
    assert noise.noise_multiplier(2.0, clipper, ADD_REMOVE) == pytest.approx(2.0)
    assert noise.noise_multiplier(2.0, clipper, REPLACE) == pytest.approx(1.0)


@pytest.mark.parametrize("parts,fft,expected_min", [
    ((1 / math.sqrt(2), 1 / math.sqrt(2)), "unitary", 1 / math.sqrt(2)),
    ((1.0, 1.0), "unitary", 1.0),
    ((1.0, 0.0), "unitary", 0.0),
    ((0.9, 0.4), "unitary", 0.4),
])
def test_frequency_noise_covariance_is_bounded_below_as_declared(parts, fft, expected_min):
    """The declared multiplier is sigma min(|a|, |b|): the smallest eigenvalue of the release's covariance."""
    d, n, sigma = 8, 40_000, 1.0
    noise = FrequencyNoise(1.0, parts, fft)
    released = noise.release([torch.zeros(n, d, dtype=torch.float64)], sigma, torch.Generator().manual_seed(0))[0]
    smallest = float(np.sqrt(np.linalg.eigvalsh(np.cov(released.numpy().T)).min().clip(0)))
    assert noise.noise_multiplier(sigma, FlatClipping(1.0), ADD_REMOVE) == pytest.approx(expected_min)
    assert smallest == pytest.approx(expected_min, abs=0.03)


def test_gredp_real_noise_is_certified_infinite_hence_overclaimed():
    spec = PrivacySpec(epsilon=2.0, delta=1e-5, dataset_size=1000, batch_size=100, epochs=2,
                       options={"noise": "real"})
    plan = mechanisms.get("gredp").plan(spec)
    assert math.isinf(plan.epsilon_certified) and math.isfinite(plan.epsilon_claimed)
    from mechanisms.framework.claims import claim_status

    assert claim_status(plan.epsilon_claimed, plan.epsilon_certified) == "overclaimed"
    with pytest.raises(ValueError, match="without noise"):
        mechanisms.get("gredp").plan(PrivacySpec(epsilon=2.0, delta=1e-5, dataset_size=1000, batch_size=100,
                                                 epochs=2, options={"noise": "real"}, calibration="certified"))


def test_nan_epsilon_is_an_error_never_a_verdict():
    from mechanisms.framework.claims import claim_status

    with pytest.raises(ValueError, match="NaN"):
        claim_status(float("nan"), 1.0)
    with pytest.raises(ValueError, match="NaN"):
        claim_status(1.0, 1.0, float("nan"))


@pytest.mark.parametrize("mechanism", ["dpsgd", "dpsgd-gdp", "gredp", "shuffled-dpsgd"])
@pytest.mark.parametrize("sampler", ["poisson", "fixed", "shuffle"])
def test_certified_event_is_derived_from_the_parts(mechanism, sampler):
    spec = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=1000, batch_size=100, epochs=2, sigma=1.3,
                       sampler=sampler, model_dim=1000, n_tensors=2, tensor_sizes=(600, 400))
    plan = mechanisms.get(mechanism).plan(spec)
    parts = plan.parts
    assert plan.steps == parts.sampler.steps and plan.sample_rate == parts.sampler.sample_rate
    step = dp_accounting.GaussianDpEvent(parts.noise.noise_multiplier(1.3, parts.clipper, parts.neighboring_relation))
    assert plan.effective_event == parts.sampler.dp_event(step)


def test_dp_forward_event_is_recomputed_by_dp_accounting_to_the_certified_value():
    """The stored event and the certified number use one convention: replace-one, which RR requires."""
    spec = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=1000, batch_size=32, epochs=3, sigma=2.0,
                       options={"freeze_pre_noise": True})
    plan = dp_forward.mechanism.plan(spec)
    assert plan.neighboring_relation == "replace-one"
    pld = dp_accounting.pld.PLDAccountant(REPLACE, value_discretization_interval=1e-4)
    value = pld.compose(plan.effective_event).get_epsilon(1e-5)
    assert plan.epsilon_certified == pytest.approx(value, rel=2e-3)
    assert plan.epsilon_certified >= value - 1e-9  # the coarser discretisation rounds up
    # the same number as composing the pieces by hand: Gaussian releases 2C apart, RR once
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    from mechanisms.catalog.dp_forward import label_rr

    by_hand = pld_lib.from_gaussian_mechanism(2.0 / (2 * math.sqrt(3)), sensitivity=1.0).compose(
        pld_lib.from_randomized_response(label_rr.rr_noise_parameter(math.log(9), 2), 2,
                                         neighboring_relation=REPLACE))
    assert plan.epsilon_certified == pytest.approx(by_hand.get_epsilon_for_delta(1e-5), rel=2e-3)
    assert plan.epsilons["rdp"] is None  # dp-accounting's RDP reads replace-one Gaussians differently
