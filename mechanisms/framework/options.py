"""Strict option parsing: a grid's mapping becomes a frozen dataclass, or a list of problems.

Every mechanism, model and dataset declares its options as a frozen dataclass (fields with types and
defaults; value checks in `__post_init__`). `parse` rejects unknown keys, values of the wrong type
(booleans are not numbers, floats are not integers, numbers must be finite) and whatever the dataclass'
own checks reject, so a typo such as `gredp: {noize: real}` fails before a sweep writes anything.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class OptionsError(ValueError):
    """One or more problems with an options mapping, one per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _type_ok(value: Any, annotation: Any) -> bool:
    """Does `value` (from YAML or Python) fit the annotation? Handles unions, Literal, tuples, lists."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if annotation is type(None) or annotation is None:
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if annotation is str:
        return isinstance(value, str)
    if origin in (tuple, list) or annotation in (tuple, list):
        if not isinstance(value, list | tuple):
            return False
        args = typing.get_args(annotation)
        if not args:
            return True
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return len(value) == len(args) and all(_type_ok(v, a) for v, a in zip(value, args, strict=True))
        return all(_type_ok(v, args[0]) for v in value)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def _describe(annotation: Any) -> str:
    text = str(annotation).replace("typing.", "")
    return text.replace("<class '", "").replace("'>", "")


def parse(cls: type[T], options: Mapping[str, Any] | None, owner: str) -> T:
    """`cls(**options)` after checking keys and types; raises OptionsError naming every problem."""
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise OptionsError([f"{owner}: options must be a mapping, got {type(options).__name__}"])
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    problems = []
    unknown = sorted(str(k) for k in options if k not in fields)
    if unknown:
        problems.append(f"{owner}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
    values = {}
    for key, value in options.items():
        if key not in fields:
            continue
        if not _type_ok(value, hints[key]):
            problems.append(f"{owner}: option {key} must be {_describe(hints[key])}, got {value!r}")
            continue
        values[key] = tuple(value) if typing.get_origin(hints[key]) is tuple else value
    if problems:
        raise OptionsError(problems)
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise OptionsError([f"{owner}: {e}"]) from None


def problems(cls: type, options: Mapping[str, Any] | None, owner: str) -> list[str]:
    try:
        parse(cls, options, owner)
    except OptionsError as e:
        return e.problems
    return []


def _value_problem(key: str, value: Any) -> str | None:
    """The value rules builder options share: seeds >= 0, other integers (sizes, counts) >= 1,
    fractions in [0, 1), other floats >= 0; noise multipliers and clip bounds (keys ending in `multiplier` or
    `bounds`) > 0, each number of a list or tuple by its key's rule."""
    if isinstance(value, list | tuple):
        return next((p for v in value if (p := _value_problem(key, v))), None)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float) and key.endswith(("multiplier", "bounds")) and not value > 0:
        return f"option {key} must be > 0, got {value}"
    if isinstance(value, int) and key.endswith("seed") and value < 0:
        return f"option {key} must be >= 0, got {value}"
    if isinstance(value, int) and not key.endswith("seed") and value < 1:
        return f"option {key} must be >= 1, got {value}"
    if isinstance(value, float) and key.endswith("fraction") and not 0 <= value < 1:
        return f"option {key} must lie in [0, 1), got {value}"
    if isinstance(value, float) and value < 0:
        return f"option {key} must be >= 0, got {value}"
    return None


def from_signature(fn: Callable[..., Any], skip: int, name: str) -> type:
    """A frozen dataclass of `fn`'s keyword parameters after the first `skip` (their types and defaults),
    checking the shared value rules (`_value_problem`) on construction.

    Registries of builders (models, datasets) use it so that a builder's signature is its options' schema.
    """
    hints = typing.get_type_hints(fn)
    fields = []
    for param in list(inspect.signature(fn).parameters.values())[skip:]:
        if param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        annotation = hints.get(param.name, Any)
        default = param.default if param.default is not param.empty else dataclasses.MISSING
        fields.append((param.name, annotation, dataclasses.field(default=default)))

    def __post_init__(self: Any) -> None:
        found = [p for f in dataclasses.fields(self) if (p := _value_problem(f.name, getattr(self, f.name)))]
        if found:
            raise ValueError("; ".join(found))

    return dataclasses.make_dataclass(name, fields, frozen=True, namespace={"__post_init__": __post_init__})


__all__ = ["OptionsError", "from_signature", "parse", "problems"]
