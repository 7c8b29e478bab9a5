"""orchestrator/lazy.py: a stand-in module is imported on its first attribute access, not when it is made."""

from __future__ import annotations

import sys

import pytest

from orchestrator.lazy import lazy


def test_the_module_is_imported_on_first_use_only(monkeypatch):
    name = "colorsys"  # a small standard-library module, removed first so that its import can be seen
    monkeypatch.delitem(sys.modules, name, raising=False)
    stand_in = lazy(name)
    assert name not in sys.modules
    assert stand_in.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)  # red: hue 0, full saturation and value
    assert stand_in.rgb_to_hsv is sys.modules[name].rgb_to_hsv


def test_a_missing_module_fails_on_first_use_not_when_named():
    stand_in = lazy("privbench_no_such_module")
    with pytest.raises(ModuleNotFoundError, match="privbench_no_such_module"):
        stand_in.anything  # noqa: B018 - the access is the import
