"""The input canaries' draw, their joins and their bound (`mechanisms.auditing.input_canaries`), without a model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mechanisms.auditing import input_canaries


def test_the_draw_is_the_seeds_and_the_public_shapes_alone():
    a = input_canaries.draw("image", (1, 8, 8), 10, 500, seed=3)
    b = input_canaries.draw("image", (1, 8, 8), 10, 500, seed=3)
    assert a.inputs.shape == (500, 1, 8, 8) and a.inputs.dtype == np.float32
    assert np.array_equal(a.inputs, b.inputs) and np.array_equal(a.labels, b.labels)
    assert np.array_equal(a.included, b.included)
    assert set(np.unique(a.inputs)) == {-1.0, 1.0} and set(np.unique(a.labels)) == set(range(10))
    assert 200 < a.included.sum() < 300  # each in with probability 1/2
    other = input_canaries.draw("image", (1, 8, 8), 10, 500, seed=4)
    assert not np.array_equal(a.included, other.included)
    texts = input_canaries.draw("text", None, 2, 20, seed=0)
    assert len(texts.inputs) == 20 and all(isinstance(t, str) and len(t.split()) == 12 for t in texts.inputs)
    with pytest.raises(ValueError, match="input shape"):
        input_canaries.draw("tabular", None, 2, 20, seed=0)


def test_included_canaries_join_each_step_at_the_plan_rate_and_excluded_ones_never():
    included = np.zeros(2_000, dtype=bool)
    included[:1_000] = True
    index, offsets = input_canaries.schedule(included, 0.05, 200, seed=0)
    assert offsets.size == 201 and offsets[0] == 0 and offsets[-1] == index.size
    counts = np.bincount(index, minlength=2_000)
    assert counts[1_000:].sum() == 0
    rate = counts[:1_000].sum() / (1_000 * 200)
    assert abs(rate - 0.05) < 4 * math.sqrt(0.05 * 0.95 / 200_000)
    for t in (0, 57, 199):  # a step holds each canary at most once
        step = index[offsets[t]:offsets[t + 1]]
        assert np.unique(step).size == step.size
    again = input_canaries.schedule(included, 0.05, 200, seed=0)
    assert np.array_equal(again[0], index) and np.array_equal(again[1], offsets)
    assert input_canaries.schedule(np.zeros(5, dtype=bool), 0.5, 3, seed=0)[1].tolist() == [0, 0, 0, 0]


def test_auto_count_and_guess_counts_come_from_sizes_alone():
    assert input_canaries.auto_count(1437) == 718 and input_canaries.auto_count(60_000) == 1_000
    assert input_canaries.auto_count(3) == 2
    assert input_canaries.guess_counts(1_000) == (50, 100, 200, 400)


def test_a_run_that_leaks_everything_is_bounded_by_the_canary_count():
    """Every included canary on top: the bound is the ceiling m allows, above 2 at auto's 718 canaries."""
    c = input_canaries.draw("image", (4,), 2, 718, seed=0)
    b = input_canaries.bound(c.included.astype(float) + 1e-3 * np.arange(718) / 718, c.included, 1e-5)
    assert 3.5 < b.epsilon < 5 and b.epsilon == max(b.steinke, b.fdp) and b.guesses > 0
    assert b.canaries == 718 and b.included == int(c.included.sum())
    with pytest.raises(ValueError, match="finite"):
        input_canaries.bound(np.full(718, np.nan), c.included, 1e-5)


@pytest.mark.parametrize("epsilon", [1.0, 2.0])
def test_soundness_on_the_worst_case_of_the_claim(epsilon):
    """Randomised response at epsilon, the (epsilon, 0)-DP mechanism every bound is tightest on: over 100 runs of
    auto's 718 canaries, the 95% bound exceeds epsilon in at most a few (5 expected at most; 10 allowed)."""
    p = math.exp(epsilon) / (1 + math.exp(epsilon))
    above, bounds = 0, []
    for seed in range(100):
        rng = np.random.default_rng(seed)
        included = rng.random(718) < 0.5
        said_in = np.where(rng.random(718) < p, included, ~included)  # each canary's release: its bit, flipped
        scores = said_in + 0.5 * rng.random(718)  # ties broken at random
        b = input_canaries.bound(scores, included, 1e-5)
        bounds.append(b.epsilon)
        above += b.epsilon > epsilon
    assert above <= 10, (above, sorted(bounds)[-10:])
    assert np.median(bounds) > 0.4 * epsilon  # and the bound is not trivially 0 on a mechanism that leaks
