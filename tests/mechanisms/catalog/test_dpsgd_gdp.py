"""dpsgd-gdp: sigma from the mu-GDP CLT, certified by PLD at that sigma; the CLT under-reports at few steps."""

from __future__ import annotations

import pytest

from mechanisms import PrivacySpec
from mechanisms.accounting import epsilon
from mechanisms.catalog import dpsgd, dpsgd_gdp
from tests.events import poisson_events

MNIST = dict(delta=1e-5, dataset_size=60000, batch_size=256)


@pytest.mark.parametrize("epochs, target, sigma_clt, true_eps", [
    (20, 1.0, 1.279, 1.038), (20, 8.0, 0.534, 9.78),  # arXiv 1911.11607
])
def test_claimed_is_the_target_and_certified_is_pld_at_the_clt_sigma(epochs, target, sigma_clt, true_eps):
    plan = dpsgd_gdp.mechanism.plan(PrivacySpec(epsilon=target, epochs=epochs, **MNIST))
    assert plan.sigma == pytest.approx(sigma_clt, rel=2e-3)
    assert plan.epsilon_claimed == pytest.approx(target, rel=1e-6)
    assert plan.epsilon_certified == pytest.approx(true_eps, rel=0.01)
    spec = PrivacySpec(epsilon=target, epochs=epochs, **MNIST)
    assert plan.epsilon_certified == pytest.approx(epsilon(poisson_events(spec.sample_rate, spec.steps)(plan.sigma),
                                                           spec.delta))


def test_certified_calibration_uses_the_reference_sigma():
    spec = PrivacySpec(epsilon=2.0, epochs=3, calibration="certified", **MNIST)
    plan = dpsgd_gdp.mechanism.plan(spec)
    assert plan.sigma == pytest.approx(dpsgd.mechanism.plan(spec).sigma)
    assert plan.epsilon_certified <= 2.0 * (1 + 1e-3) < plan.epsilon_claimed * 2


def test_few_steps_expose_the_clt_under_report():
    plan = dpsgd_gdp.mechanism.plan(PrivacySpec(epsilon=1.0, epochs=1, **(MNIST | {"batch_size": 3000})))
    assert plan.epsilon_certified > 1.3 * plan.epsilon_claimed
