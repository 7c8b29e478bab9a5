"""mechanisms/framework/integrity/trust.py: privbench's own code is decided by its file, never by its name, and the
private step may run only privbench's, Opacus', torch's or the standard library's code."""

from __future__ import annotations

import functools
import json
import sys
import types

import torch
import yaml

from mechanisms.catalog.dpsgd import DpSgd
from mechanisms.framework.integrity import trust


class PluginDpSgd(DpSgd):
    """A plugin's subclass of a built-in: its file is the plugin's."""


def plugin_function() -> None:
    """Code outside privbench's packages (this test file)."""


def test_own_code_is_decided_by_the_file_not_the_name(monkeypatch, tmp_path):
    assert trust.own_module("mechanisms.catalog.dpsgd") and trust.own_class(DpSgd)
    assert not trust.own_module("json") and not trust.own_module("privbench_no_such_module")
    borrowed = types.ModuleType("mechanisms.borrowed_name")
    borrowed.__file__ = str(tmp_path / "borrowed_name.py")  # a plugin that names itself as privbench's
    monkeypatch.setitem(sys.modules, borrowed.__name__, borrowed)
    assert not trust.own_module(borrowed.__name__)
    assert not trust.own_class(PluginDpSgd) and not trust.own_part(PluginDpSgd()) and trust.own_part(DpSgd())
    assert trust.own_path(sys.modules["mechanisms"].__file__) and not trust.own_path(__file__)
    assert not trust.own_path(None)


def test_the_step_may_run_torch_opacus_the_standard_library_and_privbench_only():
    from opacus.optimizers import DPOptimizer

    for trusted in (torch.optim.SGD.step, DPOptimizer.step, json.dumps, DpSgd, DpSgd().make_private, len):
        assert trust.foreign_code(trusted) is None, trusted
    assert trust.foreign_code(plugin_function) == __file__
    assert trust.foreign_code(functools.partial(plugin_function)) == __file__
    assert trust.foreign_code(PluginDpSgd) == __file__
    assert trust.foreign_code(yaml.safe_dump) == yaml.__file__  # an installed package is not trusted code
