"""mechanisms/catalog/dpsgd_fixed_order.py: DP-SGD's noise on the correlated mechanisms' fixed-order batches, one
Gaussian of sigma / 2 per epoch (replace-one) composed over the epochs, whatever the grid's sampler."""

from __future__ import annotations

import dataclasses

import dp_accounting
import pytest

import mechanisms
from tests.mechanisms.catalog.fixed_order_setting import DELTA, EPOCHS, P, spec


def test_certificate_is_dp_accountings_pld_of_one_gaussian_per_epoch():
    sigma = 6.0
    plan = mechanisms.get("dpsgd-fixed-order").plan(spec(sigma=sigma))
    assert plan.sampler == "fixed-order" and plan.epsilon_claimed == plan.epsilon_certified
    epochs = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma / 2), EPOCHS)
    reference = dp_accounting.pld.PLDAccountant().compose(epochs).get_epsilon(DELTA)
    assert plan.epsilon_certified == pytest.approx(reference, rel=1e-3)


def test_the_grids_sampler_does_not_apply():
    """Whatever the grid's sampler (Poisson by default), the run is the fixed-order batches, P steps an epoch, and
    is accounted without amplification by sampling: above DP-SGD's epsilon on Poisson batches at the same sigma."""
    plans = [mechanisms.get("dpsgd-fixed-order").plan(dataclasses.replace(spec(sigma=6.0), sampler=sampler))
             for sampler in ("poisson", "shuffle", "fixed")]
    assert {(plan.sampler, plan.steps, plan.epsilon_certified) for plan in plans} == {
        ("fixed-order", EPOCHS * P, plans[0].epsilon_certified)}
    poisson = mechanisms.get("dpsgd").plan(spec(sigma=6.0))
    assert plans[0].epsilon_certified > 2 * poisson.epsilon_certified
