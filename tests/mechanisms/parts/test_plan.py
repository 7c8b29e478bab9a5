"""The one privacy setting in (`PrivacySpec`: validated once, where it is made) and the one plan out
(`PrivacyPlan`: the setting it restates is the spec's and its batch selection's, for every built-in mechanism)."""

from __future__ import annotations

import math

import pytest

import mechanisms
from mechanisms.framework.integrity.verdict import plan_for
from mechanisms.framework.registry import MECHANISMS
from mechanisms.parts.batch_selection import batch_selection
from mechanisms.parts.plan import PrivacySpec

GOOD = {"epsilon": None, "sigma": 1.5, "delta": 1e-5, "dataset_size": 1_000, "batch_size": 50, "epochs": 2,
        "model_dim": 100, "n_tensors": 2, "tensor_sizes": (60, 40)}


def test_the_setting_is_keyword_only_and_a_good_one_is_made():
    with pytest.raises(TypeError):
        PrivacySpec(None, 1e-5, 1_000, 50, 2)  # type: ignore[misc]
    spec = PrivacySpec(**GOOD)
    assert (spec.sample_rate, spec.steps) == (0.05, 40)


@pytest.mark.parametrize("changes, message", [
    ({"epsilon": 0.0}, "epsilon must be a positive finite number, got 0.0"),
    ({"epsilon": math.inf, "sigma": None}, "epsilon must be a positive finite number, got inf"),
    ({"sigma": -1.0}, "sigma must be a positive finite number, got -1.0"),
    ({"sigma": math.nan}, "sigma must be a positive finite number, got nan"),
    ({"sigma": math.inf}, "sigma must be a positive finite number, got inf"),
    ({"clip": math.nan}, "clip must be a positive finite number, got nan"),
    ({"clip": 0.0}, "clip must be a positive finite number, got 0.0"),
    ({"delta": 1.0}, "delta must lie in (0, 1), got 1.0"),
    ({"delta": 0.0}, "delta must lie in (0, 1), got 0.0"),
    ({"sampler": "sideways"}, "sampler must be one of"),
    ({"calibration": "guess"}, "calibration must be one of"),
    ({"batch_size": 2_000}, "batch_size 2000 exceeds dataset_size 1000"),
    ({"epochs": 0}, "epochs must be an integer >= 1, got 0"),
    ({"dataset_size": 1.5}, "dataset_size must be an integer >= 1, got 1.5"),
])
def test_every_bad_setting_is_refused_where_it_is_made(changes, message):
    with pytest.raises(ValueError) as raised:
        PrivacySpec(**(GOOD | changes))
    assert message in str(raised.value)


def test_the_geometry_is_checked_by_the_sampler_that_runs_it():
    """The spec's geometry check is its batch selection's: the same message, whoever makes it."""
    for sampler in ("poisson", "shuffle", "fixed", "fixed-order"):
        with pytest.raises(ValueError) as from_sampler:
            batch_selection(sampler, 1_000, 2_000, 2)
        with pytest.raises(ValueError) as from_spec:
            PrivacySpec(**(GOOD | {"sampler": sampler, "batch_size": 2_000}))
        assert str(from_spec.value) == str(from_sampler.value)


@pytest.mark.parametrize("name", list(MECHANISMS.builtins))
def test_the_plan_restates_the_setting_it_runs(name):
    """What the record and the audits read of a plan (sample rate, steps, sampler, delta, accountant) is the
    sampler that runs and the spec it was made from."""
    spec = PrivacySpec(**GOOD)
    plan = plan_for(mechanisms.get(name), spec)
    selection = plan.batch_selection
    assert (plan.sample_rate, plan.steps, plan.sampler) == (selection.sample_rate, selection.steps, selection.name)
    assert (plan.delta, plan.accountant) == (spec.delta, spec.accountant)
    assert plan.as_record()["batch_selection"] == selection.describe()
