"""The loader a trial runs is built from the plan: exactly `plan.steps` batches of the declared geometry; the
samplers refuse bad geometry, rates and names."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

import mechanisms
from mechanisms.framework.private_training import plan_loader
from mechanisms.parts.batch_selection import (
    SAMPLERS,
    FixedSizeSampling,
    PoissonRate,
    PoissonSampling,
    ShuffleSampling,
    batch_selection,
)
from mechanisms.parts.plan import PrivacySpec

# N/B with fractional part just below and just above .5 (round() decides steps per epoch), and the
# geometries of the issue that exposed the plan/loader mismatch.
BOUNDARY = [(1437, 600), (1000, 690), (1000, 400), (1001, 400), (999, 400), (251, 100), (249, 100), (10, 4)]


def _batches(sampler: str, n: int, b: int, epochs: int, seed: int = 0) -> tuple[object, list[list[int]]]:
    spec = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=n, batch_size=b, epochs=epochs, sigma=1.0,
                       sampler=sampler)
    plan = mechanisms.get("dpsgd").plan(spec)
    data = TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.zeros(n, dtype=torch.long))
    loader = plan_loader(data, plan, torch.Generator().manual_seed(seed))
    return plan, [x.flatten().long().tolist() for _ in range(epochs) for x, _ in loader]


@settings(max_examples=20, deadline=None)  # each plans (calibrates) once; the boundaries are below
@given(n=st.integers(1, 3000), frac=st.floats(0.0, 1.0), epochs=st.integers(1, 3),
       sampler=st.sampled_from(sorted(SAMPLERS)))
def test_loader_runs_exactly_the_planned_steps(n, frac, epochs, sampler):
    b = max(1, min(n, round(frac * n)))
    plan, batches = _batches(sampler, n, b, epochs)
    assert len(batches) == plan.steps == epochs * max(1, round(n / b))
    assert plan.sample_rate == b / n
    for batch in batches:
        assert all(0 <= i < n for i in batch)
        assert len(set(batch)) == len(batch)
    if sampler == "fixed":
        assert all(len(batch) == b for batch in batches)
    if sampler == "shuffle":  # every example exactly once per epoch
        per_epoch = len(batches) // epochs
        for e in range(epochs):
            assert sorted(i for batch in batches[e * per_epoch:(e + 1) * per_epoch] for i in batch) == list(range(n))


@pytest.mark.parametrize("n,b", BOUNDARY)
@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_rounding_boundaries(sampler, n, b):
    plan, batches = _batches(sampler, n, b, 3)
    assert len(batches) == plan.steps == 3 * max(1, round(n / b))


def test_poisson_includes_each_example_with_probability_b_over_n():
    n, b = 1000, 690
    _plan, batches = _batches("poisson", n, b, 40, seed=1)
    sizes = np.array([len(x) for x in batches])
    counts = np.bincount(np.concatenate([np.asarray(x, dtype=int) for x in batches]), minlength=n)
    q = b / n
    assert abs(sizes.mean() - b) < 4 * np.sqrt(n * q * (1 - q) / len(sizes))
    assert abs(counts.mean() / len(batches) - q) < 0.01
    # inclusions are independent across steps: the count of one example is Binomial(steps, q)
    assert abs(counts.var() - len(batches) * q * (1 - q)) < 0.2 * len(batches) * q * (1 - q)


def test_poisson_can_draw_an_empty_batch_and_the_loader_yields_it():
    plan, batches = _batches("poisson", 50, 1, 20, seed=3)
    assert any(len(x) == 0 for x in batches)
    assert len(batches) == plan.steps


def test_each_sampler_states_its_event_and_relation():
    step = dp_accounting.GaussianDpEvent(1.0)
    poisson, fixed, shuffle = PoissonSampling(100, 10, 2), FixedSizeSampling(100, 10, 2), ShuffleSampling(100, 10, 2)
    sampled = dp_accounting.PoissonSampledDpEvent(0.1, step)
    assert poisson.dp_event(step) == dp_accounting.SelfComposedDpEvent(sampled, 20)
    assert fixed.dp_event(step) == dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(100, 10, step), 20)
    assert shuffle.dp_event(step) == dp_accounting.SelfComposedDpEvent(step, 2)  # once per epoch, no amplification
    assert poisson.neighboring_relation == dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    assert fixed.neighboring_relation == shuffle.neighboring_relation == dp_accounting.NeighboringRelation.REPLACE_ONE


def test_bad_geometry_is_refused():
    with pytest.raises(ValueError, match="exceeds"):
        PoissonSampling(10, 11, 1)
    with pytest.raises(ValueError, match="integer"):
        PoissonSampling(10, 2.0, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sampler must be one of"):
        PrivacySpec(epsilon=1.0, delta=1e-5, dataset_size=10, batch_size=2, epochs=1, sampler="cyclic")


@pytest.mark.parametrize("kwargs", [dict(sample_rate=0), dict(sample_rate=1.5), dict(steps=0)])
def test_event_bad_input(kwargs):
    args = dict(sample_rate=0.1, steps=10) | kwargs
    with pytest.raises(ValueError):
        PoissonRate(**args)


@pytest.mark.parametrize("sampler", ["cyclic"])
def test_unknown_sampler(sampler):
    with pytest.raises(ValueError, match="unknown sampler"):
        batch_selection(sampler, 100, 10, 1)
