"""The `tune:` block parser: a valid block becomes a TuneSpec; each bad block gives its one-line problem."""

import pytest

from mechanisms.accounting.tuning_cost import Choice, LogRange, RunCount
from orchestrator.tune_block import parse_tune

OPTIONS = {"dpsgd": set(), "dpsgd-gdp": {"mu_rounding"}}
GOOD = {"space": {"lr": [0.05, 0.1, 0.2], "clip": {"log": [0.01, 1]}, "batch_size": [64, 128]},
        "runs": {"distribution": "poisson", "mean": 8}, "select": "val_accuracy", "budget": "total"}


def test_valid_block():
    spec, problems = parse_tune(GOOD, OPTIONS)
    assert problems == []
    assert spec.runs == RunCount("poisson", 8) and spec.budget == "total" and spec.select == "val_accuracy"
    assert spec.space == (Choice("lr", (0.05, 0.1, 0.2)), LogRange("clip", 0.01, 1.0),
                          Choice("batch_size", (64, 128)))
    assert spec.val_noise is None


def test_defaults_and_mechanism_options():
    block = {"space": {"mu_rounding": [1, 2]}, "runs": {"distribution": "negative-binomial", "mean": 4,
                                                        "shape": 0.5}, "val_noise": 5}
    spec, problems = parse_tune(block, lambda: {"dpsgd-gdp": {"mu_rounding"}})
    assert problems == [] and spec.budget == "total" and spec.select == "val_accuracy"
    assert spec.runs.dp_shape == 0.5 and spec.val_noise == 5.0


@pytest.mark.parametrize("change, expected", [
    ({"runs": {"distribution": "poisson", "mean": -2}},
     "tune.runs.mean: must be >= 1 (the mean number of candidate runs), got -2"),
    ({"runs": {"distribution": "uniform", "mean": 8}},
     "tune.runs.distribution: unknown 'uniform'; known: poisson, geometric, logarithmic, negative-binomial"),
    ({"select": "test"}, "tune.select: 'test' is a test-set metric"),
    ({"select": "accuracy"}, "tune.select: 'accuracy' is a test-set metric"),
    ({"select": "test_loss"}, "tune.select: 'test_loss' is a test-set metric"),
    ({"space": {}}, "tune.space: empty: give at least one parameter to tune"),
    ({"space": {"lr": []}}, "tune.space.lr: empty list"),
    ({"space": {"mu_rounding": [1, 2]}}, "tune.space.mu_rounding: mechanism dpsgd does not take 'mu_rounding'"),
    ({"space": {"momentum": [0.0, 0.9]}}, "tune.space.momentum: mechanisms dpsgd, dpsgd-gdp do not take"),
    ({"runs": {"distribution": "negative-binomial", "mean": 8}}, "tune.runs.shape: negative-binomial needs a shape"),
    ({"runs": {"distribution": "geometric", "mean": 8, "shape": 2}}, "tune.runs.shape: only negative-binomial"),
    ({"budget": "half"}, "tune.budget: unknown 'half'; known: total, per-run"),
    ({"space": {"lr": {"log": [1, 0.1]}}}, "tune.space.lr: a log-range is {log: [low, high]}"),
    ({"space": {"batch_size": [64.5]}}, "tune.space.batch_size: values must be integers >= 1"),
    ({"space": {"lr": [0.1, 0.1]}}, "tune.space.lr: duplicated values"),
    ({"val_noise": -1}, "tune.val_noise: must be a number > 0"),
    ({"seed": 3}, "tune: unknown key seed"),
])
def test_bad_block_one_line_each(change, expected):
    spec, problems = parse_tune({**GOOD, **change}, OPTIONS)
    assert spec is None and len(problems) == 1, problems
    assert problems[0].startswith(expected) and "\n" not in problems[0]


def test_every_problem_is_reported():
    block = {"space": {}, "runs": {"distribution": "uniform", "mean": -1}, "select": "test"}
    spec, problems = parse_tune(block, OPTIONS)
    assert spec is None and len(problems) == 4
    assert parse_tune("poisson", OPTIONS)[1] == ["tune: must be a mapping with keys space, runs, select, budget, "
                                                 "val_noise, got 'poisson'"]
    assert any(p.startswith("tune.runs: missing") for p in parse_tune({"space": {"lr": [1]}}, OPTIONS)[1])
