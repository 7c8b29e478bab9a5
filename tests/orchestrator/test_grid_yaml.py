"""orchestrator/grid_yaml.py: a grid file's YAML read as a person means it (YAML 1.2 scalars, no duplicate keys,
bounded aliases), alone and through `grid.parse`."""

from __future__ import annotations

import pytest
import yaml

from orchestrator import grid, grid_yaml
from tests.conftest import TINY


@pytest.mark.parametrize("text, value", [  # YAML 1.2 core schema booleans and numbers (yaml.org/spec/1.2.2, 10.3.2)
    ("off", "off"), ("yes", "yes"), ("on", "on"), ("true", True), ("False", False),
    ("1e-5", 1e-5), ("1e9", 1e9), ("-2.5E+3", -2500.0), ("0o17", 15), ("0x1f", 31), ("017", 17),
    (".inf", float("inf")), ("1_000", "1_000"), ("null", None),
])
def test_plain_scalars_are_read_by_yaml_1_2(text, value):
    assert grid_yaml.load(f"v: {text}\n") == {"v": value}
    assert type(grid_yaml.load(f"v: {text}\n")["v"]) is type(value)


def test_a_duplicate_key_names_both_lines():
    with pytest.raises(grid_yaml.GridYamlError, match=r"duplicate key 'lr' \(line 3, column 3; first at line 2"):
        grid_yaml.load("train:\n  lr: 1\n  lr: 2\n")


def test_yaml_syntax_error_has_a_line_number():
    with pytest.raises(grid.GridError) as e:
        grid.parse("name: x\ngrid: {dataset: [digits\n")
    assert "YAML syntax error" in str(e.value) and "line" in str(e.value)


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
    assert {t.audit.mode for t in spec.trials} == {"off"}
    assert {t.train.lr for t in spec.trials} == {0.5} and {t.delta for t in spec.trials} == {1e-5}
