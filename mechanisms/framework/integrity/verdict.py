"""The integrity checks judged from the outside: whether a mechanism stays inside the contract (`contract_findings`,
and `plan_for`, the one door to a trial's plan), whether the step that runs is privbench's (`step_findings`), and
whether the state trajectory follows from the releases alone (`replay_state`). `verify` gathers every finding of a
trial, whichever phase measured it: the one entry point the trial's verdict reads."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from mechanisms.framework.integrity.findings import Finding, certify, unique
from mechanisms.framework.integrity.guard import REPLAY_ATOL, REPLAY_RTOL, apply_state, decode
from mechanisms.framework.integrity.trust import foreign_code, own_class
from mechanisms.framework.mechanism import FINAL, ForwardNoiseMechanism, Mechanism, kind_hooks, uncertified
from mechanisms.parts.noise_addition import RunNoise
from mechanisms.parts.plan import Parts
from mechanisms.parts.releases import Released

if TYPE_CHECKING:
    from mechanisms.parts.plan import PrivacyPlan, PrivacySpec


# ---- planning -----------------------------------------------------------------------------------------------
def contract_findings(mechanism: Mechanism, plan: PrivacyPlan | None = None) -> list[Finding]:
    """Whether a mechanism stays inside the contract: a mechanism from outside privbench that overrides a
    template method (`FINAL`) decides itself what is planned, trained or released, so privbench's certificate
    and audit would no longer describe what runs; one that writes a hook of its kind that runs on the model or the
    optimizer (`Hook.reaches_model`) runs code privbench has not verified there; and a plan's parts must be
    privbench's `Parts`. No built-in overrides a final method (a test walks them all)."""

    problems = []
    cls = type(mechanism)
    if not own_class(cls):
        problems += [f"{cls.__module__}.{cls.__qualname__} overrides Mechanism.{name}, which privbench runs itself "
                     "(the accounted process would no longer be the executed one)"
                     for name in FINAL if getattr(cls, name, None) is not getattr(Mechanism, name)]
        problems += [f"{cls.__module__}.{cls.__qualname__} writes {kind.__name__}.{name}, which runs on the model "
                     "or the optimizer: only privbench's own code certifies there"
                     for kind, name, mark in kind_hooks() if mark.reaches_model and issubclass(cls, kind)
                     and not own_class(_defined_by(cls, name))]
    if plan is not None and plan.parts is not None and type(plan.parts) is not Parts:
        problems.append(f"its parts are a {type(plan.parts).__qualname__}, not privbench's Parts")
    return [Finding("contract", not problems, "; ".join(problems))]


def _defined_by(cls: type, name: str) -> type:
    """The class in `cls`'s MRO whose body defines `name`."""
    return next(k for k in cls.__mro__ if name in vars(k))


def runs_own_step(mechanism: Mechanism) -> bool:
    """Whether a trial trains with privbench's private gradient step (the template's `make_private`, for a kind
    that noises gradients): a forward-noise mechanism keeps the model's optimizer, and an override is the
    mechanism's own, which `contract_findings` flags for a plugin."""

    return type(mechanism).make_private is Mechanism.make_private and not isinstance(mechanism,
                                                                                    ForwardNoiseMechanism)

# ---- training: the step's code ------------------------------------------------------------------------------
STEP_MODULES = ("mechanisms.framework.private_training", "mechanisms.framework.integrity.guard",
                "mechanisms.clipping_engine.engine", "mechanisms.clipping_engine.norms",
                "mechanisms.clipping_engine.rules", "mechanisms.parts.noise_addition", "mechanisms.parts.releases",
                "mechanisms.parts.correlated_noise", "mechanisms.parts.clipping", "opacus.optimizers.optimizer",
                "opacus.optimizers.ddpoptimizer")
STEP_METHODS = ("step", "pre_step", "add_noise", "clip_and_accumulate", "accumulate", "scale_grad", "zero_grad",
                "backward", "contribute", "_finish", "release", "example_norms", "clipped_norm", "attach_probe",
                "next", "_draw")

def step_findings(training: Any, when: str = "before the first step") -> Finding:
    """Whether the private step in `training` is privbench's: a mechanism that patches the optimizer, the
    clipping engine or the parts (at class level, on the instance, or in the modules the step calls) would run
    something else than the plan accounts. The trainer checks before the first step and after the last."""
    # lazy: keeps grid validation light
    from mechanisms.framework.private_training import PrivateOptimizerMixin  # torch and Opacus: only with a step

    optimizer = training.optimizer
    if not isinstance(optimizer, PrivateOptimizerMixin) and getattr(training.module, "dp_forward", None) is not None:
        return forward_noise_findings(training.module, when)
    if not isinstance(optimizer, PrivateOptimizerMixin):
        return Finding("step_code", False, f"{when}, the optimizer is a {type(optimizer).__module__}."
                       f"{type(optimizer).__qualname__}, not privbench's private optimizer")
    problems = []
    objects = [optimizer, optimizer.noise, *optimizer.releases]
    if isinstance(optimizer.noise, RunNoise):  # a correlated-noise part's stream (and what it runs) is in the step
        objects += optimizer.noise_stream.step_objects()
    engine = getattr(optimizer, "engine", None)
    if engine is not None:
        objects.append(engine)
    for obj in objects:
        cls = type(obj)
        if source := foreign_code(cls):
            problems.append(f"the step runs {cls.__qualname__}, code from {source}, not privbench's")
            continue
        for klass in cls.__mro__:
            for name in set(STEP_METHODS) & set(vars(klass)):
                if source := foreign_code(vars(klass)[name]):
                    problems.append(f"{klass.__qualname__}.{name} runs code from {source}, not privbench's")
        for name in set(STEP_METHODS) & set(vars(obj)):
            if source := foreign_code(vars(obj)[name]):
                problems.append(f"{cls.__qualname__}.{name} was replaced on the instance by code from {source}")
    for name in STEP_MODULES:
        module = sys.modules.get(name)
        for attr, value in vars(module).items() if module is not None else ():
            if not attr.startswith("__") and (source := foreign_code(value)):
                problems.append(f"{name}.{attr} was replaced by {source}")
    return Finding("step_code", not problems, f"{when}: " + "; ".join(problems) if problems else "")

FORWARD_METHODS = ("privatize", "generator", "_on_output", "_on_input")


def forward_noise_findings(module: Any, when: str) -> Finding:
    """The step of a mechanism that adds its noise in the forward pass (dp-forward): its optimizer is the model's
    own and clips nothing, so what is checked instead is what releases the hidden states: the noise layer is
    privbench's, none of its methods was replaced, and every forward hook on the model (the noise layer's and any
    other) runs privbench's or torch's code, so nothing reads or changes a hidden state around the noise."""
    noise = module.dp_forward
    problems = []
    if not own_class(type(noise)):
        problems.append(f"the forward noise layer is a {type(noise).__module__}.{type(noise).__qualname__}, not "
                        "privbench's")
    for name in FORWARD_METHODS:
        for holder in (vars(noise), *(vars(k) for k in type(noise).__mro__)):
            if name in holder and (source := foreign_code(holder[name])):
                problems.append(f"the forward noise layer's {name} runs code from {source}")
    for path, sub in module.named_modules():
        hooks = [*sub._forward_hooks.values(), *sub._forward_pre_hooks.values()]
        for hook in hooks:
            if source := foreign_code(hook):
                problems.append(f"a forward hook on {path or 'the model'} runs code from {source}")
    return Finding("step_code", not problems, f"{when}: " + "; ".join(problems) if problems else "")


def replay_state(mechanism: Mechanism, plan: PrivacyPlan, trace: Mapping[str, Any]) -> Finding:
    """The state trajectory recomputed from the recorded releases alone (`trace`, `StateTrace.to_dict`) by
    `mechanism`'s hooks, compared with the one training recorded. Run it in a process of its own with a fresh
    mechanism object (the worker's analysis phase does), so nothing training kept in memory reaches it."""
    import torch  # lazy: heavy (torch)

    if trace.get("broken"):
        return Finding("state_replay", False, f"the state trajectory could not be recorded: {trace['broken']}")
    steps = int(trace["steps"])
    values = {n: decode(a) for n, a in trace["values"].items()}
    recorded = {n: decode(a) for n, a in trace["states"].items()}
    kept = trace.get("gradients") or {"steps": [], "shapes": [], "tensors": []}
    rows = {t: i for i, t in enumerate(kept["steps"])}
    tensors = [decode(a) for a in kept["tensors"]]
    options = mechanism.options(plan.extra.get("options", {}))
    clipper = plan.parts.clipper
    bounds = (float(getattr(clipper, "min_bound", clipper.bound)), float(clipper.max_bound))
    state = {n: torch.tensor(float(v), dtype=torch.float32) for n, v in mechanism.initial_state(plan, options).items()}
    for t in range(steps):
        grad = tuple(torch.from_numpy(g[rows[t]]).float().reshape(s) for g, s in zip(tensors, kept["shapes"],
                                                                                      strict=True)) \
            if t in rows else ()  # the gradient of a step whose update did not read it is not kept
        released = Released(grad, {n: torch.from_numpy(v[t]).float() for n, v in values.items()})
        try:
            new = mechanism.update_state({k: v.clone() for k, v in state.items()}, released, plan, options)
            apply_state(state, {k: v for k, v in new.items() if k in state}, clipper.state_key, bounds)
        except Exception as exc:  # noqa: BLE001 - a hook that cannot run on the releases alone is the finding
            more = " (some released gradients were too large to keep for the replay)" if trace.get(
                "gradient_dropped") else ""
            return Finding("state_replay", False, f"the state update failed at step {t + 1} when given only the "
                                                  f"recorded releases{more}: {type(exc).__name__}: {exc}")
        for name, series in recorded.items():
            got, want = state[name].double().reshape(-1).numpy(), series[t]
            if not np.allclose(got, want, rtol=REPLAY_RTOL, atol=REPLAY_ATOL):
                return Finding("state_replay", False, f"the state {name!r} recomputed from the releases alone is "
                                                      f"{got.tolist()} at step {t + 1}, training used {want.tolist()}: "
                                                      "the state used more than what the steps released")
    return Finding("state_replay", True)


def plan_for(mechanism: Mechanism, spec: PrivacySpec) -> PrivacyPlan:
    """The plan a trial runs: `mechanism.plan(spec)`, made `uncertified` when the mechanism steps outside the
    contract or its parts are not privbench's (`contract_findings`). The trial's plan phase, tuning and the step
    audit all plan through here."""
    plan = mechanism.plan(spec)
    reason = certify(contract_findings(mechanism, plan))
    if reason and mechanism.private:
        return uncertified(plan, reason)
    return plan


def verify(mechanism: Mechanism, plan: PrivacyPlan, recorded: Iterable[Finding] = (),
           replayed: Finding | None = None) -> list[Finding]:
    """Every integrity finding of a trial, once each: the contract (judged against its plan), what its phases
    measured (`recorded`: the plan-time checks, the step's code before the first step and after the last, every
    step's guard), and the state replayed from the recorded releases (`replayed`, run apart by the caller with
    `replay_state`). A finding reached twice counts once (`findings.unique`)."""
    return unique([*contract_findings(mechanism, plan), *recorded, *([replayed] if replayed is not None else [])])


__all__ = ["FORWARD_METHODS", "STEP_METHODS", "STEP_MODULES", "contract_findings", "forward_noise_findings",
           "plan_for", "replay_state", "runs_own_step", "step_findings", "verify"]
