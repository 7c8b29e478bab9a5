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
    ({"model_train": {"mlp": {"lr": -1}}}, "model_train.mlp.lr: must be > 0"),
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


STRICT = [
    ({"seeds": [0, 0, 1, 1]}, "seeds: duplicated values 0, 1"),
    ({"seeds": [-1]}, "seeds: must be >= 0"),
    ({"seeds": [2**32]}, "seeds: must be at most 4.29497e+09"),
    ({"seeds": [1.5]}, "seeds: must be an integer"),
    ({"seeds": [True]}, "seeds: must be an integer, got True"),
    ({"grid": TINY["grid"] | {"epsilon": [True]}}, "grid.epsilon: must be a number, got True"),
    ({"grid": TINY["grid"] | {"epsilon": [1, 1.0]}}, "grid.epsilon: duplicated values"),
    ({"grid": TINY["grid"] | {"mechanism": ["dpsgd", "dpsgd"]}}, "grid.mechanism: duplicated values 'dpsgd'"),
    ({"grid": TINY["grid"] | {"epsilon": [float("inf")]}}, "grid.epsilon: must be finite"),
    ({"train": {"lr": float("inf")}}, "train.lr: must be finite"),
    ({"train": {"lr": float("nan")}}, "train.lr: must be finite"),
    ({"train": {"max_train_examples": -5}}, "train.max_train_examples: must be >= 1"),
    ({"train": {"epochs": 1.5}}, "train.epochs: must be an integer"),
    ({"train": {"epochs": True}}, "train.epochs: must be an integer"),
    ({"train": {"batch_size": 1e9}}, "train.batch_size: must be at most"),
    ({"train": {"momentum": -0.5}}, "train.momentum: must be >= 0"),
    ({"train": {"grad_sample_mode": "turbo"}}, "train.grad_sample_mode: must be one of"),
    ({"resources": {"cpus": 1, "gpu": 1}}, "resources: unknown keys ['gpu']"),
    ({"resources": [1]}, "resources: must be a mapping"),
    ({"resources": {"cpus": True}}, "resources.cpus: must be a number"),
    ({"audit": {"samples": 100, "colour": 1}}, "audit: unknown keys ['colour']"),
    ({"sigma": float("nan")}, "sigma: must be finite"),
    ({"delta": True}, "delta: must be a number"),
    ({"name": "sweep\n"}, "name:"),
    ({"name": 12}, "name:"),
    ({"mechanism_options": {"magic-dp": {}}}, "mechanism_options: unknown mechanism 'magic-dp'"),
    ({"model_options": {"mlp": [1]}}, "model_options.mlp: must map a model"),
]


@pytest.mark.parametrize("overrides, fragment", STRICT)
def test_strict_input_names_every_problem(overrides, fragment):
    with pytest.raises(grid.GridError) as e:
        parse(overrides)
    assert any(fragment in p for p in e.value.problems), e.value.problems


@pytest.mark.parametrize("text, fragment", [
    ("name: x\nname: y\ngrid: {dataset: [digits], model: [mlp], mechanism: [nonprivate]}\n", "duplicate key 'name'"),
    ("{1: a, b: 2}\n", "keys must be text"),
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
     "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n",
     "expands to more than"),
])
def test_yaml_surprises_are_refused(text, fragment):
    with pytest.raises(grid.GridError) as e:
        grid.parse(text)
    assert fragment in str(e.value)


def test_yaml_1_1_off_and_exponents_read_as_meant():
    text = yaml.safe_dump(TINY).replace("lr: 0.5", "lr: 5e-1") + "audit: {mode: off}\ndelta: 1e-5\n"
    text = text.replace("delta: 1.0e-05\n", "")
    spec = grid.parse(text)
    assert {t["audit"]["mode"] for t in spec.trials} == {"off"}
    assert {t["train"]["lr"] for t in spec.trials} == {0.5} and {t["delta"] for t in spec.trials} == {1e-5}


def test_resources_do_not_change_trial_keys():
    keys = {t["trial_key"] for t in parse({}).trials}
    assert keys == {t["trial_key"] for t in parse({"resources": {"cpus": 2, "gpus": 0}}).trials}


def test_integral_floats_are_integers_in_trial_keys():
    assert [t["trial_key"] for t in parse({"train": TINY["train"] | {"epochs": 1.0}}).trials] == \
        [t["trial_key"] for t in parse({}).trials]
