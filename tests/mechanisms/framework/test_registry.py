"""mechanisms/framework/registry.py: a registry of one kind loads its entries by name, keeps a broken entry's
reason without hiding the others, refuses a second object under a name, resolves `family:<name>` entries, and gives
a plugin's code a provenance that changes when its source does."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import SimpleNamespace

import pytest

from mechanisms.framework import registry

BUILTINS = {"dpsgd": "mechanisms.catalog.dpsgd:mechanism",
            "renamed": "mechanisms.catalog.gredp:mechanism",  # the entry's name is not the mechanism's ID
            "missing": "privbench_no_such_module:mechanism"}


def fresh() -> registry.Registry:
    """A registry of mechanisms under a kind nothing installs entry points for (`privbench.toys`)."""
    return registry.Registry("toy", BUILTINS, registry.MECHANISMS.name_of)


def test_entries_load_by_name_and_a_broken_one_says_why_without_hiding_the_others():
    reg = fresh()
    assert reg.names() == ["dpsgd"] and reg.get("dpsgd").ID == "dpsgd"
    broken = reg.broken()
    assert set(broken) == {"renamed", "missing"}
    assert "the entry point is named 'renamed' but the toy says it is 'gredp'" in broken["renamed"]
    assert broken["missing"].startswith("privbench.toys entry point missing = privbench_no_such_module")
    with pytest.raises(registry.PluginError, match="ModuleNotFoundError"):
        reg.get("missing")
    with pytest.raises(registry.UnknownName, match="unknown toy 'nope'; known: dpsgd"):
        reg.get("nope")


def test_register_checks_the_contract_and_refuses_a_second_object_under_a_name():
    reg, dpsgd = fresh(), importlib.import_module("mechanisms.catalog.dpsgd")
    assert reg.register(reg.get("dpsgd")) is reg.get("dpsgd")  # the same object again: nothing changes
    with pytest.raises(registry.PluginError, match="toy 'dpsgd' registered twice"):
        reg.register(dpsgd.DpSgd())
    with pytest.raises(registry.PluginError, match="not a toy"):
        reg.register(object())
    reg.unregister("dpsgd")
    assert reg.names() == [] and reg.register(dpsgd.DpSgd()).ID == "dpsgd"
    assert not reg.accepts(object()) and reg.accepts(dpsgd.DpSgd())


def test_a_family_entry_resolves_its_members_and_plain_entries_do_not():
    def name_of(obj: object) -> str:
        if not isinstance(obj, SimpleNamespace):
            raise TypeError("not a namespace")
        return obj.name

    reg = registry.Registry("toy", {}, name_of)
    hf, mlp = reg.register(SimpleNamespace(name="hf", prefix=True)), reg.register(SimpleNamespace(name="mlp"))
    assert reg.resolve("hf:bert-tiny") == (hf, "bert-tiny") and reg.resolve("mlp") == (mlp, None)
    assert reg.written_names() == ["mlp", "hf:<name>"]
    for unknown in ("hf", "mlp:x", "cnn"):
        with pytest.raises(registry.UnknownName, match=r"known: mlp, hf:<name>"):
            reg.resolve(unknown)


def test_a_plugins_provenance_follows_its_source_and_privbenchs_own_has_none(tmp_path, monkeypatch):
    assert registry.provenance(registry.MECHANISMS.get("dpsgd")) is None
    source = tmp_path / "my_plugin.py"
    source.write_text("class Thing:\n    pass\n")
    spec = importlib.util.spec_from_file_location("my_plugin", source)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "my_plugin", module)  # a `plugins:` module beside a grid, imported
    spec.loader.exec_module(module)
    thing = module.Thing()
    first = registry.provenance(thing)
    assert (first.module, first.distribution, first.version) == ("my_plugin", None, None)
    assert registry.provenance(thing) == first
    source.write_text("class Thing:\n    pass  # edited\n")
    os.utime(source, ns=(1, 1))  # another mtime, whatever the clock's resolution
    edited = registry.provenance(thing)
    assert edited.source_sha256 != first.source_sha256 and len(edited.source_sha256) == 64
