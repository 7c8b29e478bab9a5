"""The correlated-noise strategies against jax-privacy's `matrix_factorization` (an independent implementation):
its numbers, written by scripts/jax_privacy_references.py where jax-privacy is installed (the `references`
extra; it pins its own jax and numpy, so a separate venv is the usual place), are stored in
jax_privacy_references.json. This test always runs and compares privbench's values with them;
`python scripts/jax_privacy_references.py --check` recomputes them with jax-privacy and compares with the file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mechanisms.parts.correlated_noise import (
    BandedToeplitz,
    CorrelatedNoise,
    RestartedTree,
    square_root_coefficients,
)
from mechanisms.parts.participation import Participation

REFERENCE = json.loads((Path(__file__).parent / "jax_privacy_references.json").read_text())


@pytest.mark.parametrize("case", REFERENCE["banded"],
                         ids=lambda c: f"b{c['bands']}-P{c['steps_per_epoch']}-E{c['epochs']}")
def test_banded_sensitivity_equals_jax_privacy(case):
    strategy = BandedToeplitz.square_root(case["bands"])
    period, epochs = case["steps_per_epoch"], case["epochs"]
    steps = period * epochs
    assert strategy.sensitivity(Participation.cyclic(period, epochs)) == pytest.approx(case["cyclic"], rel=1e-9)
    assert strategy.sensitivity(Participation(steps, 1, 1, "min-separation")) == pytest.approx(case["single"], rel=1e-9)
    minsep = Participation(steps, epochs, period, "min-separation")
    assert strategy.sensitivity(minsep) == pytest.approx(case["min_separation"], rel=1e-9)


@pytest.mark.parametrize("case", REFERENCE["trees"], ids=lambda c: f"P{c['leaves']}-E{c['epochs']}")
def test_tree_sensitivity_equals_jax_privacy_fixed_epoch(case):
    tree = RestartedTree(case["leaves"])
    assert tree.sensitivity(Participation.cyclic(case["leaves"], case["epochs"])) == pytest.approx(case["cyclic"],
                                                                                                   rel=1e-9)


def test_square_root_coefficients_equal_jax_privacy():
    assert square_root_coefficients(16) == pytest.approx(REFERENCE["coefficients"], rel=1e-12)


@pytest.mark.parametrize("case", REFERENCE["errors"], ids=lambda c: f"b{c['bands']}-T{c['steps']}")
def test_prefix_sum_errors_equal_jax_privacy_per_query_error(case):
    """The per-step prefix-sum error of the noise the stream adds (its matrix read off the stream itself) is
    jax-privacy's `toeplitz.per_query_error` (squared error of each prefix sum, unit noise)."""
    noise = CorrelatedNoise(1.0, BandedToeplitz.square_root(case["bands"]), Participation.cyclic(case["steps"], 1))
    prefix = np.cumsum(noise.noise_matrix(case["steps"]), axis=0)
    assert (prefix ** 2).sum(axis=1) == pytest.approx(case["per_query"], rel=1e-9)
    # and on draws: 20000 streamed runs
    stream = noise.start()
    zero = [torch.zeros(20000, 1, dtype=torch.float64)]
    gen = torch.Generator().manual_seed(0)
    draws = np.cumsum([stream.release(zero, 1.0, gen)[0][:, 0].numpy() for _ in range(case["steps"])], axis=0)
    assert draws.var(axis=1) == pytest.approx(case["per_query"], rel=0.05)
