"""mechanisms/catalog/dpsgd.py: DP-SGD's certificate is dp-accounting's PLD of its T Poisson-sampled Gaussian steps,
its claim is that certificate, and per-layer clipping keeps one example's bound at C. (Calibrating to a target is
the contract's, tested with the accountants.)"""

from __future__ import annotations

import math

import dp_accounting
import pytest

from mechanisms.catalog.dpsgd import mechanism
from mechanisms.parts.plan import PrivacySpec

GEOMETRY = dict(delta=1e-5, dataset_size=60_000, batch_size=240, epochs=2)  # q = 0.004, 250 steps an epoch


def pld_epsilon(sigma: float, q: float = 0.004, steps: int = 500, delta: float = 1e-5) -> float:
    """dp-accounting's own PLD accountant on the textbook DP-SGD event (the reference, not privbench's code)."""
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(
        sigma)), steps)
    return dp_accounting.pld.PLDAccountant().compose(event).get_epsilon(delta)


def test_at_a_given_sigma_claimed_and_certified_are_dp_accountings_pld():
    plan = mechanism.plan(PrivacySpec(epsilon=None, sigma=1.1, **GEOMETRY))
    assert (plan.sample_rate, plan.steps, plan.sigma) == (0.004, 500, 1.1)
    assert plan.epsilon_claimed == plan.epsilon_certified
    reference = pld_epsilon(1.1)  # at dp-accounting's default discretisation, finer than privbench's
    assert reference <= plan.epsilon_certified <= reference * 1.01  # a sound bound: never below, and close


def test_per_layer_clipping_splits_c_so_that_one_examples_bound_stays_c():
    spec = PrivacySpec(epsilon=None, sigma=1.0, n_tensors=4, options={"clipping": "per-layer"}, clip=2.0,
                       **GEOMETRY)
    clipper = mechanism.plan(spec).parts.clipper
    assert len(set(clipper.clips)) == 1 and len(clipper.clips) == 4  # shared equally
    assert math.hypot(*clipper.clips) == pytest.approx(2.0)
    assert clipper.bound == pytest.approx(2.0)
    with pytest.raises(ValueError, match="clipping must be one of"):
        mechanism.options({"clipping": "sideways"})
