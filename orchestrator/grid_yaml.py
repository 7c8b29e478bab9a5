"""Reading a grid file's YAML the way a person means it.

PyYAML implements YAML 1.1, whose surprises reach grid files: `mode: off` is the boolean false,
`1e9` and `1e-5` are strings (a float needs a dot there), duplicate keys silently keep the last one,
and a few nested aliases expand to billions of nodes ("billion laughs"). This loader follows YAML 1.2
instead for booleans and numbers (`true`/`false` only; `1e9` is a float), rejects duplicate keys, and
bounds the expanded size of aliases before building any Python object.
"""

from __future__ import annotations

import re

import yaml

MAX_NODES = 100_000  # a grid file is small; its alias-expanded tree is too
MAX_INT = 2**63 - 1  # the largest integer a grid may hold

_FLOAT_12 = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$"
                       r"|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$")
_INT_12 = re.compile(r"^[-+]?[0-9]+$|^0o[0-7]+$|^0x[0-9a-fA-F]+$")
_BOOL_12 = re.compile(r"^(true|True|TRUE|false|False|FALSE)$")
_SURROGATE = re.compile("[\ud800-\udfff]")


class GridYamlError(ValueError):
    """A YAML problem, said in one line with its position."""


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema resolution of plain scalars."""


# Replace YAML 1.1's implicit resolvers for bool, int and float by YAML 1.2's.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers
            if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL_12, list("tTfF"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT_12, list("-+0123456789"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+.0123456789"))


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """An integer (plain, `0o`, `0x`, or tagged `!!int`), at most 64 bits: no setting needs more, and a
    5,000-digit one would stop Python's int() (or overflow float arithmetic later)."""
    text = str(loader.construct_scalar(node)).strip()
    digits = text.lstrip("+-").removeprefix("0x").removeprefix("0o")
    if len(digits) > 40:
        raise GridYamlError(f"integer of {len(digits)} digits at {_where(node)}: at most {MAX_INT.bit_length()} bits")
    try:
        value = int(text, 0) if text.lstrip("+-").startswith(("0o", "0x")) else int(text)
    except ValueError:
        raise GridYamlError(f"!!int {_shown(text)} at {_where(node)} is not an integer") from None
    if abs(value) > MAX_INT:
        raise GridYamlError(f"integer {_shown(text)} at {_where(node)} is larger than a 64-bit integer")
    return value


def _construct_bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    """`true` or `false` (any case), as YAML 1.2 says; `!!bool yes` or `!!bool on` is refused, not read as
    false."""
    text = str(loader.construct_scalar(node))
    if text.lower() not in ("true", "false"):
        raise GridYamlError(f"!!bool {_shown(text)} at {_where(node)} is not a boolean (true or false)")
    return text.lower() == "true"


def _construct_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    text = str(loader.construct_scalar(node)).lower()
    if text.lstrip("+-") == ".inf":
        return float("-inf") if text.startswith("-") else float("inf")
    if text == ".nan":
        return float("nan")
    if len(text) > 100:
        raise GridYamlError(f"number of {len(text)} characters at {_where(node)}")
    try:
        return float(text)
    except ValueError:
        raise GridYamlError(f"!!float {_shown(text)} at {_where(node)} is not a number") from None


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:39] + "…")


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def _where(node: yaml.Node) -> str:
    return f"line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"


def _check(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Expanded size of `node` (aliases counted every time they are used), duplicate keys, and text no
    file, database or terminal can hold (a lone surrogate, from a `"\\uD800"` escape)."""
    if id(node) in sizes:
        sizes[0] = 1  # an alias: the document reuses a node
        return sizes[id(node)]
    sizes[id(node)] = MAX_NODES + 1  # a node that contains itself expands without end
    if isinstance(node, yaml.ScalarNode) and _SURROGATE.search(node.value):
        raise GridYamlError(f"text at {_where(node)} holds a lone surrogate ({_shown(node.value)}): not valid "
                            "Unicode, which no store or terminal can write")
    if isinstance(node, yaml.MappingNode):
        seen: dict[object, yaml.Node] = {}
        total = 1
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                ident = (key.tag, key.value)
                if ident in seen:
                    raise GridYamlError(f"duplicate key {key.value!r} ({_where(key)}; first at {_where(seen[ident])})")
                seen[ident] = key
            total += _check(key, sizes) + _check(value, sizes)
            if total > MAX_NODES:
                break
    elif isinstance(node, yaml.SequenceNode):
        total = 1
        for item in node.value:
            total += _check(item, sizes)
            if total > MAX_NODES:
                break
    else:
        total = 1
    sizes[id(node)] = total
    return total


def load(text: str) -> object:
    """Parse one YAML document with YAML 1.2 scalars, no duplicate keys, bounded alias expansion."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        sizes: dict[int, int] = {}
        if _check(node, sizes) > MAX_NODES:
            raise GridYamlError(f"the document expands to more than {MAX_NODES:,} nodes (nested aliases?)" if 0 in sizes
                                else f"the document has more than {MAX_NODES:,} values; a grid lists its axes' "
                                     "values, not its trials")
        return loader.construct_document(node)
    finally:
        loader.dispose()
