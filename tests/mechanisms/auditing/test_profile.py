"""A step's claim rebuilt from the mechanism's own plan (`claimed_profile`): for DP-SGD, one step of the Gaussian
mechanism, every (epsilon, delta) of the profile is the Gaussian's exact epsilon (dp-accounting's closed form)
and the envelope lies inside, and close to, the exact curve G_{1/sigma} (written here from scipy's normal)."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.gaussian_mechanism import get_epsilon_gaussian
from scipy.stats import norm

import mechanisms
from mechanisms.auditing.profile import PROFILE_DELTAS, claimed_profile, step_options, step_spec

DPSGD = mechanisms.get("dpsgd")


def test_dpsgd_profile_is_the_gaussian_step():
    sigma = 1.5
    profile = claimed_profile(DPSGD, sigma)
    assert [curve.delta for curve in profile.curves] == list(PROFILE_DELTAS)
    for curve in profile.curves:
        assert curve.epsilon == pytest.approx(get_epsilon_gaussian(sigma, curve.delta), rel=1e-6, abs=1e-9)
    alpha = np.linspace(0.001, 0.999, 200)
    exact_curve = norm.cdf(norm.ppf(1 - alpha) - 1 / sigma)
    assert np.all(profile(alpha) <= exact_curve + 1e-6)
    assert np.max(exact_curve - profile(alpha)) < 0.05


def test_nonprivate_claims_no_profile():
    assert claimed_profile(mechanisms.get("nonprivate"), 1.0) is None


def test_one_step_spec_and_declared_options_only():
    spec = step_spec(2.0, 1e-5, batch_size=8)
    assert (spec.dataset_size, spec.batch_size, spec.epochs, spec.sigma) == (8, 8, 1, 2.0)
    batch, declared, key = step_options(DPSGD, {"batch_size": 8, "tensor_sizes": [3, 4]})
    assert batch == 8 and "tensor_sizes" not in declared and key == tuple(sorted(declared.items()))
