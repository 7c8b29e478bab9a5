"""Plugin modules a grid names under `plugins:`, for code that is not installed as a package.

Installed plugins need nothing here: their `privbench.mechanisms|models|datasets|accountants` entry
points are read by each registry on first use, in the driver and in every worker. A module listed under
`plugins:` is imported instead (the driver when it validates the grid, each worker before its trial),
and every object in it that follows a contract (`mechanisms.Mechanism`,
`mechanisms.accounting.accountant.Accountant`, `workers.models.Model`, `workers.datasets.Dataset`) is
registered under its own name. The driver ships the modules' top-level packages to the cluster through
Ray's runtime_env (`orchestrator.cluster.runtime_env`), as it ships privbench itself, so workers need no
copy of them.
"""

from __future__ import annotations

import importlib
import re
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from mechanisms.framework.integrity import OWN_PACKAGES
from mechanisms.framework.registry import ACCOUNTANTS, MECHANISMS, PluginError
from workers.datasets.contract import DATASETS
from workers.models.contract import MODELS

MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
REGISTRIES = (MECHANISMS, ACCOUNTANTS, MODELS, DATASETS)


def import_plugin(name: str, search: Sequence[str | Path] = ()) -> ModuleType:
    """Import a plugin module: from sys.path, else from the `search` folders (a grid's own folder), which
    are then added to sys.path so that the module's own imports resolve too. Whatever the module does while
    it is imported (raise, `sys.exit()`) is one `PluginError` line: importing a plugin runs its code."""
    if not isinstance(name, str) or not MODULE_RE.fullmatch(name):
        raise PluginError(f"plugins: {name!r} is not a module name (dotted Python identifiers)")
    try:
        return _run_import(name)
    except ModuleNotFoundError as e:
        top = name.split(".")[0]
        if e.name is None or not name.startswith(e.name):
            raise PluginError(f"plugins: {name}: {e}") from None
        for folder in search:
            folder = str(Path(folder).resolve())
            if (Path(folder) / top).is_dir() or (Path(folder) / f"{top}.py").is_file():
                if folder not in sys.path:
                    sys.path.insert(0, folder)
                return _run_import(name)
        raise PluginError(f"plugins: cannot import {name!r} (not installed, and not beside the grid file)") from None


def _run_import(name: str) -> ModuleType:
    """`importlib.import_module`, with the module's own failures said in one line (a missing module is
    left to the caller, which looks beside the grid file)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and name.startswith(e.name):
            raise
        raise PluginError(f"plugins: {name} failed to import: {e}".splitlines()[0]) from None
    except SystemExit as e:  # a plugin that calls sys.exit() must not decide privbench's exit code
        raise PluginError(f"plugins: {name} called sys.exit({e.code!r}) while it was imported") from None
    except Exception as e:  # noqa: BLE001 - any failure of a user's module is one line for the user
        raise PluginError(f"plugins: {name} failed to import: {type(e).__name__}: {e}".splitlines()[0][:500]) from None


def register_module(module: ModuleType) -> list[str]:
    """Register every contract object the module holds; returns '<kind> <name>' for each."""
    found = []
    for value in list(vars(module).values()):
        for registry in REGISTRIES:
            if registry.accepts(value):
                registry.register(value)
                found.append(f"{registry.kind} {registry.name_of(value)}")
    return found


def load(names: Sequence[str], search: Sequence[str | Path] = ()) -> list[ModuleType]:
    """Import and register the modules a grid names (idempotent: a module already loaded is a no-op)."""
    modules = []
    for name in names:
        module = import_plugin(name, search)
        try:
            found = register_module(module)
        except Exception as e:  # noqa: BLE001 - any failure of a user's module is one line for the user
            raise PluginError(f"plugins: {name}: {e}".splitlines()[0]) from None
        if not found:
            raise PluginError(f"plugins: {name} defines no mechanism, model, dataset or accountant")
        modules.append(module)
    return modules


def shipped(names: Sequence[str]) -> list[ModuleType]:
    """The top-level packages (or single-file modules) of the named plugin modules, for Ray's `py_modules`,
    with the modules they imported from their own folder (a plugin `mine.py` beside the grid file that
    imports `helpers.py` beside it needs both on the workers); privbench's own packages are shipped anyway
    and left out, and so is what is installed (site-packages, the standard library)."""
    tops = [importlib.import_module(top) for top in dict.fromkeys(name.split(".")[0] for name in names)
            if top not in OWN_PACKAGES]
    folders = {_folder(m) for m in tops} - {None}
    siblings = [m for name, m in list(sys.modules.items())
                if "." not in name and name not in OWN_PACKAGES and m not in tops and _folder(m) in folders]
    return tops + siblings


def _folder(module: ModuleType) -> Path | None:
    """The folder a top-level module or package lives in, unless it is installed (site-packages, stdlib)."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file).resolve()
    folder = path.parent.parent if path.name == "__init__.py" else path.parent
    installed = {Path(p).resolve() for key in ("purelib", "platlib", "stdlib", "platstdlib")
                 if (p := sysconfig.get_paths().get(key))}
    return None if any(folder == p or p in folder.parents for p in installed) else folder


__all__ = ["code_of", "import_plugin", "load", "register_module", "shipped"]


def code_of(mechanism: str, model: str, dataset: str, accountant: str) -> dict[str, str]:
    """The provenance (`mechanisms.framework.registry.Provenance`) of each plugin entry a trial uses, by component:
    `TrialConfig.code`, computed by the driver and checked again by the worker that runs the trial."""
    entries = (("mechanism", MECHANISMS, mechanism), ("model", MODELS, model), ("dataset", DATASETS, dataset),
               ("accountant", ACCOUNTANTS, accountant))
    return {kind: f"{name}: {p}" for kind, registry, name in entries if (p := registry.provenance(name))}

