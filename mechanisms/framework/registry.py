"""Registries of named things (mechanisms, accountants, and in `workers` models and datasets), filled from
entry points, so that privbench's own entries and a user's plugins arrive the same way.

Each kind has an entry-point group, `privbench.<kind>s`; an entry's name is the id a grid uses and its value
(`module:attr`) names an object following the kind's contract (`mechanisms.Mechanism`,
`mechanisms.accounting.accountant.Accountant`, `workers.models.Model`, `workers.datasets.Dataset`).
privbench's built-ins are declared once, in the `builtins` of each registry (not in pyproject.toml): a Ray
worker that received privbench as shipped folders (runtime_env `py_modules`) has no package metadata, yet
must find them. Installed entry points into the built-ins' own packages (an older install's metadata still
lists them) are ignored, so the table stays the only definition. Installed plugins come from package metadata,
on the driver and on every worker; modules named by a grid's `plugins:` are imported and scanned by
`workers.plugins`.

Loading happens once per process, on first use (never at import), and imports only the modules the
entries name: those hold light descriptors, whose heavy code is imported inside the hooks that need it.
A plugin that fails to load does not take the others down: asking for it raises its error.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from mechanisms.accounting.accountant import Accountant
    from mechanisms.framework.mechanism import Mechanism

T = TypeVar("T")
GROUP_PREFIX = "privbench."


class UnknownName(ValueError):
    """A name that is not in a registry; the message lists what exists."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(known)}")
        self.kind, self.name, self.known = kind, name, known


class PluginError(ValueError):
    """An entry point or plugin module that cannot be loaded, or an object that breaks its kind's contract."""


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Which code a plugin's entry is: its distribution and version (None for a module that is not installed,
    e.g. one beside a grid) and a SHA-256 of its source files. A trial's key includes it, so editing a plugin
    runs its trials again, and its record names the code that produced it."""

    module: str
    distribution: str | None
    version: str | None
    source_sha256: str

    def __str__(self) -> str:
        release = f"{self.distribution} {self.version}" if self.distribution else self.module
        return f"{release} sha256:{self.source_sha256[:16]}"


def _origin(module_name: str) -> str | None:
    """The file a module is (or would be) loaded from, without running it when it is not imported yet."""
    module = sys.modules.get(module_name)
    if module is not None:
        return getattr(module, "__file__", None)
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.has_location else None


def is_privbench(module_name: str) -> bool:
    """Whether a module is privbench's own: its file is inside one of privbench's packages."""
    from mechanisms.framework.integrity import own_module  # lazy: keeps import mechanisms light

    return own_module(module_name)


def code_module(obj: Any) -> str:
    """The module whose code an entry runs: its class's, or, for an entry that is one of privbench's
    descriptors (a model's `builder`, a dataset's `loader`), the module of the callable it names."""
    module = obj.__module__ if isinstance(obj, type) else type(obj).__module__
    if not is_privbench(module) or not dataclasses.is_dataclass(obj):
        return module
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        named = value.partition(":")[0] if isinstance(value, str) and ":" in value else \
            getattr(value, "__module__", None) if callable(value) else None
        if named and not is_privbench(named):
            return named
    return module


def provenance(obj: Any) -> Provenance | None:
    """The provenance of a registry entry (`Provenance`); None for privbench's own entries. The source is the
    top-level package of the entry's code (`code_module`: every `.py` file under it), or its single module."""
    module_name = code_module(obj)
    if is_privbench(module_name):
        return None
    top = module_name.partition(".")[0]
    path = _origin(top) or _origin(module_name)
    if path is None:
        return Provenance(module_name, None, None, "unknown (no source file)")
    dists = _distributions().get(top) or []
    distribution = dists[0] if dists else None
    version = importlib.metadata.version(distribution) if distribution else None
    package = os.path.basename(path) == "__init__.py"
    root = os.path.dirname(path) if package else path
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names if f.endswith(".py")) \
        if os.path.isdir(root) else [root]
    stamps = tuple((f, os.stat(f).st_mtime_ns, os.stat(f).st_size) for f in files)
    return Provenance(top if package else module_name, distribution, version,
                      _source_hash(os.path.dirname(root), stamps))


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    """Top-level package -> the distributions providing it (read once per process: it scans every install)."""
    return importlib.metadata.packages_distributions()


@functools.lru_cache(maxsize=256)
def _source_hash(base: str, stamps: tuple[tuple[str, int, int], ...]) -> str:
    """SHA-256 over the files' paths (relative to `base`) and bytes; cached by path, mtime and size, so an
    edited file is read again."""
    digest = hashlib.sha256()
    for path, _, _ in stamps:
        digest.update(os.path.relpath(path, base).encode() + b"\0")
        with open(path, "rb") as fh:
            digest.update(fh.read())
        digest.update(b"\0")
    return digest.hexdigest()


class Registry(Generic[T]):
    """Named objects of one kind: the built-in entry points, the installed ones, and `register`ed ones.

    `check(obj)` returns the name the object declares (its id), raising TypeError when it does not follow
    the contract; an entry point's name must equal it.
    """

    def __init__(self, kind: str, builtins: Mapping[str, str], check: Callable[[Any], str]) -> None:
        self.kind, self.group = kind, f"{GROUP_PREFIX}{kind}s"
        self.builtins, self._check = dict(builtins), check
        self._objects: dict[str, T] = {}
        self._broken: dict[str, str] = {}
        self._loaded = False

    def entry_points(self) -> list[importlib.metadata.EntryPoint]:
        """The built-in entries, then the installed plugins'. An installed entry into the built-ins' own
        package is not read: the built-ins are `builtins`, and an older install's metadata may still list them."""
        points = [importlib.metadata.EntryPoint(name, value, self.group) for name, value in self.builtins.items()]
        seen = {(p.name, p.value) for p in points}
        own = {p.module.partition(".")[0] for p in points}
        for point in importlib.metadata.entry_points(group=self.group):
            if point.module.partition(".")[0] not in own and (point.name, point.value) not in seen:
                seen.add((point.name, point.value))
                points.append(point)
        return points

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for point in self.entry_points():
            try:
                obj = point.load()
                self._add(obj, point.name)
            except Exception as e:  # noqa: BLE001 - one broken plugin must not hide the others
                self._broken[point.name] = (f"{self.group} entry point {point.name} = {point.value}: "
                                            f"{type(e).__name__}: {e}").splitlines()[0]

    def _add(self, obj: Any, declared: str | None = None) -> T:
        try:
            name = self._check(obj)
        except TypeError as e:
            raise PluginError(f"not a {self.kind}: {e}") from None
        if declared is not None and declared != name:
            raise PluginError(f"the entry point is named {declared!r} but the {self.kind} says it is {name!r}")
        if name in self._objects and self._objects[name] is not obj:
            raise PluginError(f"{self.kind} {name!r} registered twice")
        self._objects[name] = obj
        return obj

    def register(self, obj: T) -> T:
        """Add an object (a notebook's, or a `plugins:` module's); a second object under a name is an error."""
        self._load()
        return self._add(obj)

    def unregister(self, name: str) -> None:
        """Remove an entry (a notebook's or a test's); unknown names are an error."""
        self._load()
        if name not in self._objects:
            raise UnknownName(self.kind, name, self.names())
        del self._objects[name]

    def get(self, name: str) -> T:
        self._load()
        if name in self._objects:
            return self._objects[name]
        if name in self._broken:
            raise PluginError(self._broken[name])
        raise UnknownName(self.kind, name, self.names())

    def names(self) -> list[str]:
        self._load()
        return sorted(self._objects)

    def items(self) -> list[tuple[str, T]]:
        self._load()
        return sorted(self._objects.items())

    def resolve(self, name: str) -> tuple[T, str | None]:
        """The entry for `name` and, for an entry that names a family (a true `prefix`, as `hf:<name>`), the
        part after the prefix. A broken plugin raises its own error; an unknown name lists what exists."""
        items = dict(self.items())
        if name in items and not getattr(items[name], "prefix", False):
            return items[name], None
        head, sep, rest = name.partition(":")
        if sep and rest and head in items and getattr(items[head], "prefix", False):
            return items[head], rest
        for wanted in (name, head):
            if wanted in self._broken:
                raise PluginError(self._broken[wanted])
        raise UnknownName(self.kind, name, self.written_names())

    def written_names(self) -> list[str]:
        """The names a grid can write: plain ones, then `name:<name>` for each family."""
        items = self.items()
        return ([n for n, e in items if not getattr(e, "prefix", False)]
                + [f"{n}:<name>" for n, e in items if getattr(e, "prefix", False)])

    def broken(self) -> dict[str, str]:
        """Entries that failed to load, with why (shown by `privbench list`)."""
        self._load()
        return dict(self._broken)

    def provenance(self, name: str) -> Provenance | None:
        """The code behind `name` (`provenance`): None for privbench's own entries."""
        return provenance(self.resolve(name)[0])

    def name_of(self, obj: Any) -> str:
        """The name `obj` declares; TypeError when it does not follow this kind's contract."""
        return self._check(obj)

    def accepts(self, obj: Any) -> bool:
        try:
            self._check(obj)
        except TypeError:
            return False
        return True


def _mechanism_id(obj: Any) -> str:
    from mechanisms.framework.mechanism import Mechanism  # lazy: heavy (numpy)

    if not isinstance(obj, Mechanism):
        raise TypeError(f"{obj!r} is not a mechanisms.Mechanism instance")
    if not isinstance(getattr(obj, "ID", None), str) or not obj.ID:
        raise TypeError(f"{type(obj).__name__} has no ID (the name grids use)")
    return obj.ID


def _accountant_name(obj: Any) -> str:
    from mechanisms.accounting.accountant import Accountant  # lazy: keeps import mechanisms light

    if not isinstance(obj, Accountant):
        raise TypeError(f"{obj!r} is not a mechanisms.accounting.accountant.Accountant")
    return obj.name


MECHANISMS: Registry[Mechanism] = Registry("mechanism", {
    "nonprivate": "mechanisms.catalog.nonprivate:mechanism",
    "dpsgd": "mechanisms.catalog.dpsgd:mechanism",
    "dpsgd-gdp": "mechanisms.catalog.dpsgd_gdp:mechanism",
    "dpsgd-adaclip": "mechanisms.catalog.dpsgd_adaclip:mechanism",
    "gredp": "mechanisms.catalog.gredp:mechanism",
    "shuffled-dpsgd": "mechanisms.catalog.shuffled_dpsgd:mechanism",
    "dp-forward": "mechanisms.catalog.dp_forward:mechanism",
    "dpsgd-shuffle-rdp": "mechanisms.catalog.dpsgd_shuffle_rdp:mechanism",
    "dpftrl-tree": "mechanisms.catalog.dpftrl_tree:mechanism",
    "dp-bandmf": "mechanisms.catalog.dp_bandmf:mechanism",
    "dp-bandmf-4": "mechanisms.catalog.dp_bandmf:mechanism_4",
    "dpsgd-fixed-order": "mechanisms.catalog.dpsgd_fixed_order:mechanism",
}, _mechanism_id)

ACCOUNTANTS: Registry[Accountant] = Registry("accountant", {
    name: f"mechanisms.accounting.accountant:{name.upper()}"
    for name in ("pld", "rdp", "prv", "gdp", "ma_classic", "fenton_wilkinson")
}, _accountant_name)


def register(mechanism: Mechanism) -> Mechanism:
    return MECHANISMS.register(mechanism)


def get(mechanism_id: str) -> Mechanism:
    return MECHANISMS.get(mechanism_id)


def names() -> list[str]:
    return MECHANISMS.names()


def unregister(mechanism_id: str) -> None:
    MECHANISMS.unregister(mechanism_id)


__all__ = ["ACCOUNTANTS", "MECHANISMS", "PluginError", "Provenance", "Registry", "UnknownName", "get", "names",
           "provenance", "register", "unregister"]
