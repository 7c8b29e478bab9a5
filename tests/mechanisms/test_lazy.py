"""`submodule`, the PEP 562 loader behind `mechanisms.<name>`: a submodule is imported on first access, a name
that is no submodule is an AttributeError (what `getattr` and `hasattr` expect), and a submodule that fails on
its own missing dependency still says so."""

from __future__ import annotations

import sys

import pytest

from mechanisms.lazy import submodule


def test_a_submodule_is_imported_on_first_access(monkeypatch):
    monkeypatch.delitem(sys.modules, "mechanisms.auditing.binomial", raising=False)
    module = submodule("mechanisms.auditing", "binomial")
    assert module is sys.modules["mechanisms.auditing.binomial"]
    assert callable(module.clopper_pearson_lower)


def test_a_missing_submodule_is_an_attribute_error():
    with pytest.raises(AttributeError, match="'mechanisms.auditing' has no attribute 'no_such_part'"):
        submodule("mechanisms.auditing", "no_such_part")
    import mechanisms

    assert not hasattr(mechanisms, "no_such_part")


def test_a_submodule_missing_its_own_dependency_is_not_hidden(tmp_path, monkeypatch):
    package = tmp_path / "lazy_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "broken.py").write_text("import lazy_probe_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="lazy_probe_absent_dependency"):
        submodule("lazy_probe", "broken")
    for name in ("lazy_probe", "lazy_probe.broken"):
        monkeypatch.delitem(sys.modules, name, raising=False)
