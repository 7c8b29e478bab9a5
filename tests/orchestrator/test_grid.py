"""Grid parsing: every bad-grid case is refused with a reason before anything runs or is written."""

from __future__ import annotations

import pytest
import yaml

from orchestrator import grid
from tests.conftest import TINY


def parse(overrides: dict) -> grid.GridSpec:
    return grid.parse(yaml.safe_dump(TINY | overrides))


def test_expansion_nonprivate_ignores_epsilon_and_keys_are_stable():
    spec = parse({"sigma": None, "seeds": [0, 1], "grid": TINY["grid"] | {"epsilon": [1, 8]}})
    by_mech = [t["mechanism"] for t in spec.trials]
    assert by_mech.count("nonprivate") == 2 and by_mech.count("dpsgd") == 4
    assert all(t["epsilon"] is None for t in spec.trials if t["mechanism"] == "nonprivate")
    keys = [t["trial_key"] for t in spec.trials]
    assert len(set(keys)) == len(keys)
    again = parse({"sigma": None, "seeds": [0, 1], "grid": TINY["grid"] | {"epsilon": [1, 8]}})
    assert keys == [t["trial_key"] for t in again.trials]
    other = parse({"sigma": None, "seeds": [0, 1], "grid": TINY["grid"] | {"epsilon": [1, 4]}})
    assert set(keys) != {t["trial_key"] for t in other.trials}


def test_mechanism_train_overrides_only_that_mechanism():
    spec = parse({"mechanism_train": {"nonprivate": {"lr": 0.01}}})
    lrs = {t["mechanism"]: t["train"]["lr"] for t in spec.trials}
    assert lrs == {"nonprivate": 0.01, "dpsgd": 0.5}


def test_model_train_overrides_that_model_and_mechanism_train_wins():
    spec = parse({"grid": TINY["grid"] | {"model": ["mlp", "cnn-small"]},
                  "model_train": {"cnn-small": {"lr": 0.05, "epochs": 3}},
                  "mechanism_train": {"dpsgd": {"lr": 0.2}}})
    got = {(t["model"], t["mechanism"]): (t["train"]["lr"], t["train"]["epochs"]) for t in spec.trials}
    assert got == {("mlp", "nonprivate"): (0.5, 1), ("mlp", "dpsgd"): (0.2, 1),
                   ("cnn-small", "nonprivate"): (0.05, 3), ("cnn-small", "dpsgd"): (0.2, 3)}


@pytest.mark.parametrize("overrides, fragment", [
    ({"grid": TINY["grid"] | {"dataset": ["cifar-99"]}}, "unknown dataset 'cifar-99'"),
    ({"grid": TINY["grid"] | {"model": ["resnet-9000"]}}, "unknown model 'resnet-9000'"),
    ({"grid": TINY["grid"] | {"mechanism": ["magic-dp"]}}, "unknown mechanism 'magic-dp'"),
    ({"grid": TINY["grid"] | {"epsilon": [0]}}, "epsilon: must be > 0"),
    ({"grid": TINY["grid"] | {"epsilon": [-1]}}, "epsilon: must be > 0"),
    ({"delta": 0}, "delta: must lie in (0, 1)"),
    ({"delta": 1.5}, "delta: must lie in (0, 1)"),
    ({"train": {"epochs": 1, "batch_size": 64, "lr": 0.5, "bogus": 1}}, "train:"),
    ({"resources": {"cpus": 1, "gpus": "many"}}, "resources.gpus"),
    ({"colour": "blue"}, "unknown top-level keys"),
    ({"model_train": {"mlp": {"lr": -1}}}, "model_train.mlp: lr must be > 0"),
    ({"model_train": ["mlp"]}, "model_train: must map a model"),
])
def test_bad_grids_name_the_problem(overrides, fragment):
    with pytest.raises(grid.GridError) as e:
        parse(overrides)
    assert any(fragment in p for p in e.value.problems), e.value.problems


def test_unknown_name_lists_what_exists():
    with pytest.raises(grid.GridError) as e:
        parse({"grid": TINY["grid"] | {"mechanism": ["magic-dp"]}})
    assert "dpsgd" in str(e.value) and "nonprivate" in str(e.value)


def test_yaml_syntax_error_has_a_line_number():
    with pytest.raises(grid.GridError) as e:
        grid.parse("name: x\ngrid: {dataset: [digits\n")
    assert "YAML syntax error" in str(e.value) and "line" in str(e.value)
