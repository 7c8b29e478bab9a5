"""The one definition of privbench's own code, which every check asks.

Two questions, one answer each:
- "Is this privbench's own?" (`own_path`, `own_module`, `own_class`, `own_part`): defined in one of privbench's
  packages, by its file, not its name (a plugin could borrow a name). A part, a mechanism's template method or a
  release observer is trusted only when its class is privbench's own: a plugin's subclass of a privbench part lives
  in the plugin's file, so it is not (it may change what is released while keeping the declaration).
- "May the private step run this?" (`foreign_code`): privbench's own code, Opacus', torch's or the standard
  library's.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import site
import sys
import sysconfig
import types
from typing import Any

# privbench's own packages (by folder): what is loaded from them is privbench's code, versioned and tested with it
OWN_PACKAGES = ("mechanisms", "workers", "orchestrator", "storage", "dashboards")
HOME = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))  # the project root


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([folder, path]) == folder


def own_path(path: str | None) -> bool:
    """Whether a source file is inside one of privbench's packages."""
    if path is None:
        return False
    path = os.path.abspath(path)
    return any(_inside(path, os.path.join(HOME, p)) for p in OWN_PACKAGES)


def own_module(module_name: str) -> bool:
    """Whether a module is privbench's own (its file, not its name: a plugin could borrow a name)."""
    module = sys.modules.get(module_name)
    if module is not None:
        return own_path(getattr(module, "__file__", None))
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.has_location and own_path(spec.origin)


@functools.cache
def own_class(cls: type) -> bool:
    """Whether a class is defined in privbench's own packages."""
    return own_module(cls.__module__)


@functools.cache
def _trusted_roots() -> tuple[list[str], list[str]]:
    """(folders whose code the private step may run: privbench's packages, Opacus, torch, the standard library;
    folders excluded from them: installed packages inside the standard library's folder)."""
    import opacus  # lazy: heavy (opacus)
    import torch  # lazy: heavy (torch)

    roots = [os.path.join(HOME, p) for p in OWN_PACKAGES]
    roots += [os.path.dirname(os.path.abspath(opacus.__file__)), os.path.dirname(os.path.abspath(torch.__file__)),
              os.path.abspath(sysconfig.get_paths()["stdlib"])]
    excluded = [os.path.abspath(p) for p in (*site.getsitepackages(), site.getusersitepackages())]
    return roots, excluded


def foreign_code(value: Any) -> str | None:
    """The file a function or class comes from when its code is not privbench's, Opacus', torch's or the
    standard library's (None: trusted, or not Python code)."""
    fn = getattr(value, "__func__", value)
    fn = getattr(fn, "func", fn)  # functools.partial
    if isinstance(fn, type):
        module = sys.modules.get(fn.__module__)
        path = getattr(module, "__file__", None)
    elif isinstance(fn, types.FunctionType):
        path = fn.__code__.co_filename
    else:
        return None
    return None if path is None else _foreign_file(path)


@functools.lru_cache(maxsize=4096)
def _foreign_file(path: str) -> str | None:
    """`foreign_code` for one source file, cached: the trusted folders are fixed for the process, and a trial's
    setup asks about the same few files hundreds of times (0.06 CPU s of `commonpath` per trial uncached)."""
    path = os.path.abspath(path)
    roots, excluded = _trusted_roots()
    inside = [r for r in roots if _inside(path, r)]
    if inside and not any(_inside(path, e) and len(e) > max(map(len, inside)) for e in excluded):
        return None
    return path

def own_part(part: Any) -> bool:
    """Whether a plan's part (sampler, clipper, noise, release) is privbench's own class: what it releases is then
    privbench's code, tested with its declaration."""
    return own_class(type(part))


__all__ = ["HOME", "OWN_PACKAGES", "foreign_code", "own_class", "own_module", "own_part", "own_path"]
