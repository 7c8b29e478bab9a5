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

_FLOAT_12 = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$"
                       r"|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$")
_INT_12 = re.compile(r"^[-+]?[0-9]+$|^0o[0-7]+$|^0x[0-9a-fA-F]+$")
_BOOL_12 = re.compile(r"^(true|True|TRUE|false|False|FALSE)$")


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
    text = loader.construct_scalar(node)
    return int(text, 0) if text.startswith(("0o", "0x")) else int(text)


def _construct_bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    return loader.construct_scalar(node).lower() == "true"


def _construct_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    text = loader.construct_scalar(node).lower()
    if text.lstrip("+-") == ".inf":
        return float("-inf") if text.startswith("-") else float("inf")
    if text == ".nan":
        return float("nan")
    return float(text)


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def _where(node: yaml.Node) -> str:
    return f"line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"


def _check(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Expanded size of `node` (aliases counted every time they are used), and duplicate keys."""
    if id(node) in sizes:
        return sizes[id(node)]
    sizes[id(node)] = MAX_NODES + 1  # a node that contains itself expands without end
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
        if _check(node, {}) > MAX_NODES:
            raise GridYamlError(f"the document expands to more than {MAX_NODES} nodes (nested aliases?)")
        return loader.construct_document(node)
    finally:
        loader.dispose()
