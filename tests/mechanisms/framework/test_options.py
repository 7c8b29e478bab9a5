"""mechanisms/framework/options.py: a grid's mapping becomes the declared frozen dataclass, or every problem in
one list, before anything runs."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from mechanisms.framework import options


@dataclasses.dataclass(frozen=True)
class Opts:
    noise: Literal["complex", "real"] = "complex"
    rate: float = 0.1
    steps: int = 3
    shape: tuple[int, int] = (1, 2)
    scale: float | None = None

    def __post_init__(self) -> None:
        if self.rate >= 1:
            raise ValueError(f"rate must be below 1, got {self.rate}")


def test_a_valid_mapping_becomes_the_dataclass_with_lists_as_tuples():
    parsed = options.parse(Opts, {"noise": "real", "rate": 0, "shape": [3, 4]}, "gredp")  # an int is a float
    assert parsed == Opts(noise="real", rate=0.0, steps=3, shape=(3, 4))
    assert options.parse(Opts, None, "gredp") == Opts()


@pytest.mark.parametrize("given, said", [
    ({"noize": "real"}, "gredp: unknown option(s) noize; known: noise, rate, scale, shape, steps"),
    ({"noise": "imaginary"}, "gredp: option noise must be Literal['complex', 'real'], got 'imaginary'"),
    ({"steps": True}, "gredp: option steps must be int, got True"),  # a boolean is not a number
    ({"steps": 2.0}, "gredp: option steps must be int, got 2.0"),  # a float is not an integer
    ({"rate": float("nan")}, "gredp: option rate must be float, got nan"),
    ({"shape": [1, 2, 3]}, "gredp: option shape must be tuple[int, int], got [1, 2, 3]"),
    ({"rate": 2.0}, "gredp: rate must be below 1, got 2.0"),  # the dataclass' own check
])
def test_each_problem_is_one_line_naming_the_owner(given, said):
    assert options.problems(Opts, given, "gredp") == [said]


def test_every_problem_is_reported_at_once():
    with pytest.raises(options.OptionsError) as e:
        options.parse(Opts, {"noize": 1, "steps": "3", "scale": "x"}, "m")
    assert len(e.value.problems) == 3 and str(e.value) == "; ".join(e.value.problems)
    assert options.problems(Opts, [1], "m") == ["m: options must be a mapping, got list"]


def test_a_builders_signature_is_its_options_schema_with_the_shared_value_rules():
    def build(data: object, *, hidden: int = 16, dropout_fraction: float = 0.0, split_seed: int = 0,
              clip_bounds: tuple[float, ...] = (1.0,)) -> None: ...

    cls = options.from_signature(build, 1, "MlpOptions")
    assert [f.name for f in dataclasses.fields(cls)] == ["hidden", "dropout_fraction", "split_seed", "clip_bounds"]
    assert options.parse(cls, {"hidden": 8, "split_seed": 0}, "mlp").hidden == 8
    assert options.problems(cls, {"hidden": 0}, "mlp") == ["mlp: option hidden must be >= 1, got 0"]
    assert options.problems(cls, {"dropout_fraction": 1.0}, "mlp") == [
        "mlp: option dropout_fraction must lie in [0, 1), got 1.0"]
    assert options.problems(cls, {"split_seed": -1}, "mlp") == ["mlp: option split_seed must be >= 0, got -1"]
    assert options.problems(cls, {"clip_bounds": [1.0, 0.0]}, "mlp") == ["mlp: option clip_bounds must be > 0, got 0.0"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cls().hidden = 3
