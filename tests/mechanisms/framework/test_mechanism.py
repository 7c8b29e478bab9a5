"""The mechanism contract: hooks are marked (`@hook`) and final methods carry `typing.final`, the tables are derived
from the marks, no mechanism overrides a final method (built-ins none; the test plugins that do are caught), and the
kinds of mechanism (reference, forward noise, post-processing) keep their checked contracts."""

from __future__ import annotations

import importlib.util
import inspect
import pathlib
import sys

import numpy as np
import pytest
import torch

import mechanisms
from mechanisms.catalog.dp_forward import DpForward
from mechanisms.framework.integrity.verdict import contract_findings, runs_own_step
from mechanisms.framework.mechanism import (
    ATTRIBUTE_HOOKS,
    FINAL,
    HOOKS,
    KINDS,
    AfterStepPart,
    ForwardNoiseMechanism,
    Mechanism,
    PostProcessingMechanism,
    declared_hooks,
    filled_hooks,
    hooks_table,
)
from mechanisms.framework.registry import MECHANISMS
from mechanisms.parts.plan import PrivacySpec

PLUGINS = pathlib.Path(__file__).parents[2] / "plugins"
# The test plugins that override a final method on purpose: each must be caught by `contract_findings`.
OVERRIDE_ON_PURPOSE = {"audit-engine-2c": {"post_processing"}, "audit-sum-doubled": {"post_processing"},
                       "audit-reused-noise": {"post_processing"}, "broken-noise-outside": {"make_private"}}
SPEC = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=64, batch_size=16, epochs=1, sigma=0.7)


def overridden(mechanism: Mechanism) -> set[str]:
    return {name for name in FINAL if getattr(type(mechanism), name) is not getattr(Mechanism, name)}


def plugin_mechanisms() -> dict[str, Mechanism]:
    """Every mechanism instance the modules under tests/plugins define (imported from their files)."""
    found: dict[str, Mechanism] = {}
    for path in sorted(PLUGINS.rglob("*.py")):
        if "Mechanism" not in path.read_text() or path.name == "__init__.py":
            continue
        spec = importlib.util.spec_from_file_location(f"plugin_{path.parent.name}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses resolve their annotations through it
        spec.loader.exec_module(module)
        found |= {m.ID: m for m in vars(module).values() if isinstance(m, Mechanism)}
    return found


# ---- marks ----------------------------------------------------------------------------------------------------

def test_every_public_method_of_a_kind_is_a_hook_or_final():
    """Nothing in the template is left unmarked, so a hook and a final method cannot look alike."""
    for kind in KINDS:
        for name, value in vars(kind).items():
            if inspect.isfunction(value) and not name.startswith("_"):
                marked = name in declared_hooks(kind)
                final = getattr(value, "__final__", False)
                assert marked != final, f"{kind.__name__}.{name}: hook {marked}, final {final}"
    assert {"plan", "make_private", "privatize_step", "post_processing"} <= set(FINAL)
    assert not set(FINAL) & {name for kind in KINDS for name in declared_hooks(kind)}


def test_the_hook_table_is_derived_from_the_marks():
    names = [h.name for h in HOOKS]
    assert names[:len(ATTRIBUTE_HOOKS)] == [h.name for h in ATTRIBUTE_HOOKS]
    for kind in KINDS:
        for name in declared_hooks(kind):
            params = list(inspect.signature(getattr(kind, name)).parameters)[1:]
            shown = f"{name}({', '.join(params)})"
            assert (shown if kind is Mechanism else f"{kind.__name__}.{shown}") in names
    assert len(names) == len(set(names)) == len(ATTRIBUTE_HOOKS) + sum(len(declared_hooks(k)) for k in KINDS)
    table = hooks_table()
    assert all(f"| `{h.name}` | {h.used_by} | {h.guarantee} |" in table for h in HOOKS)
    assert all(f"`{name}`" in table for name in FINAL)


def test_hook_signatures_share_one_style():
    """Every hook takes its arguments positionally: no `**options`, no keyword-only parameters."""
    for kind in KINDS:
        for name in declared_hooks(kind):
            kinds = {p.kind for p in inspect.signature(getattr(kind, name)).parameters.values()}
            assert kinds == {inspect.Parameter.POSITIONAL_OR_KEYWORD}, f"{kind.__name__}.{name}"
    for _, mechanism in MECHANISMS.items():  # the built-ins' hooks follow their kind's signatures
        for kind in KINDS:
            for name in declared_hooks(kind) if isinstance(mechanism, kind) else ():
                mine = list(inspect.signature(getattr(type(mechanism), name)).parameters)
                assert mine == list(inspect.signature(getattr(kind, name)).parameters), (mechanism.ID, name)


# ---- no override of a final method ------------------------------------------------------------------------------

def test_no_built_in_overrides_a_final_method():
    # the built-ins' own table: plugins other tests loaded into this process are in the registry too
    built_ins = {name: mechanisms.get(name) for name in MECHANISMS.builtins}
    assert len(built_ins) > 10 and {name: overridden(m) for name, m in built_ins.items() if overridden(m)} == {}


def test_the_test_plugins_that_override_a_final_method_are_caught():
    plugins = plugin_mechanisms()
    assert set(OVERRIDE_ON_PURPOSE) <= set(plugins) and len(plugins) > len(OVERRIDE_ON_PURPOSE)
    assert {name: overridden(m) for name, m in plugins.items() if overridden(m)} == OVERRIDE_ON_PURPOSE
    for name, methods in OVERRIDE_ON_PURPOSE.items():
        (finding,) = contract_findings(plugins[name])
        assert not finding.passed and all(f"overrides Mechanism.{m}" in finding.reason for m in methods), name
    for name, mechanism in plugins.items():
        if name not in OVERRIDE_ON_PURPOSE:
            assert "overrides" not in contract_findings(mechanism)[0].reason, name


# ---- the kinds --------------------------------------------------------------------------------------------------

def test_the_built_ins_declare_their_kind():
    assert isinstance(mechanisms.get("dp-forward"), ForwardNoiseMechanism)
    assert isinstance(mechanisms.get("shuffled-dpsgd"), PostProcessingMechanism)
    assert not mechanisms.get("nonprivate").private
    assert [runs_own_step(mechanisms.get(n)) for n in ("dpsgd", "shuffled-dpsgd", "nonprivate", "dp-forward")] == \
        [True, True, True, False]
    assert {"post_processing_part", "post_process_release"} <= set(filled_hooks(mechanisms.get("shuffled-dpsgd")))
    assert {"install_forward_noise", "bound_release"} <= set(filled_hooks(mechanisms.get("dp-forward")))


def test_a_reference_run_has_no_parts_and_releases_the_sums():
    class Reference(Mechanism):
        ID = "reference-with-parts"
        private = False

        def parts(self, spec, options):  # ignored: a reference run has no parts
            return mechanisms.get("dpsgd").parts(spec, options)

    plan = Reference().plan(SPEC)
    assert plan.parts is None and plan.sigma is None and plan.epsilon_certified is None
    sums = np.arange(6.0).reshape(2, 3)
    assert np.array_equal(mechanisms.get("nonprivate").privatize_step(sums, 1.0, 1.0, np.random.default_rng(0)), sums)


def test_a_plugin_post_processing_part_is_not_certified():
    class OwnPostProcessing(PostProcessingMechanism):
        ID = "own-post-processing"

        def post_processing_part(self, module, plan, options, generator):
            return AfterStepPart()

        def post_process_release(self, released, rng, options):
            return released

    (finding,) = contract_findings(OwnPostProcessing())
    assert not finding.passed and "PostProcessingMechanism.post_processing_part" in finding.reason
    assert "post_process_release" not in finding.reason  # the audit side sees released values only
    assert contract_findings(mechanisms.get("shuffled-dpsgd"))[0].passed


def test_a_post_processing_the_parts_do_not_name_is_refused():
    class Unnamed(PostProcessingMechanism):
        ID = "unnamed-post-processing"

        def post_processing_part(self, module, plan, options, generator):
            return AfterStepPart(after_step=lambda optimizer: None)

        def post_process_release(self, released, rng, options):
            return released

    mechanism = Unnamed()
    plan = mechanism.plan(SPEC)
    assert plan.parts.post_processing is None
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="its parts do not name it"):
        mechanism.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), None, plan,
                               criterion=torch.nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0))


def test_the_template_refuses_a_forward_layer_the_plan_did_not_account():
    class Uninstalled(DpForward):
        def install_forward_noise(self, module, data, plan, options, generator):
            return data  # installs nothing: nothing would be noised

    mechanism = Uninstalled()
    plan = mechanism.plan(SPEC)
    model = torch.nn.Linear(3, 2)
    data = torch.utils.data.TensorDataset(torch.randn(64, 3), torch.randint(0, 2, (64,)))
    with pytest.raises(ValueError, match="forward-noise layer does not release at the plan's sigma"):
        mechanism.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), data, plan,
                               criterion=torch.nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0))
    (finding,) = contract_findings(mechanism)
    assert not finding.passed and "install_forward_noise" in finding.reason


def test_the_forward_release_is_the_bound_then_the_parts_noise():
    """dp-forward's audit release: each row bounded to norm C by its hook, then its parts' Gaussian noise."""
    rows = np.tile([[3.0, 0.0, 4.0, 0.0]], (100_000, 1))
    out = mechanisms.get("dp-forward").privatize_step(rows, 0.5, 2.0, np.random.default_rng(0))
    np.testing.assert_allclose(out.mean(axis=0), [1.2, 0.0, 1.6, 0.0], atol=0.01)
    np.testing.assert_allclose(out.std(axis=0), 1.0, rtol=0.02)  # sigma C = 0.5 * 2
