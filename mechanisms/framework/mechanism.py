"""The mechanism contract: a mechanism is its options, its parts (the releases of one step), its state and
its own (claimed) analysis; privbench plans, trains, certifies and audits it.

`Mechanism` is a template (benchopt's `BaseSolver`, dp-accounting's `PrivacyAccountant`): its methods marked
`@typing.final` (`FINAL`) run the same way for every mechanism, and a subclass fills the methods marked `@hook`,
each declared once with who calls it and the guarantee it must keep (`HOOKS`, derived from the marks;
docs/plugins.md and `privbench list mechanisms --hooks` render it, `hooks_table`). The class attributes `ID`,
`Options`, `private`, `audit_coordinatewise` and `audit_per_tensor` are hooks too (`ATTRIBUTE_HOOKS`).

No hook gets the optimizer, the clipping engine, the model, the noise generator or the clipped sums: what
needs more is a part (declared, accounted and checked) or a declared kind of mechanism whose step the template
builds from the kind's hooks (`KINDS`):

- `Mechanism` itself: DP-SGD's step (noise on the clipped gradient sum), built from the plan's parts;
- a reference run (`private = False`): no parts, no noise, no epsilon; the audit release is the sums themselves;
- `ForwardNoiseMechanism`: the noise is added in the forward pass by privbench's forward-noise layer, which its
  hook installs (DP-Forward); the optimizer and loader stay ordinary, the audit release bounds a row and adds the
  parts' noise;
- `PostProcessingMechanism`: DP-SGD's step, then privbench's own post-processing of the released update (its
  part, `AfterStepPart`: shuffled DP-SGD's coupled permutations), and the same on the audit's release.

What the final methods do, the same way for every mechanism: `plan` (the only place that calibrates: sigma
explicit, or for the target under the grid's `calibration`; the certified event from the parts; epsilon_certified
by PLD with RDP and PRV beside it), `make_private` (the trainer's step, built from the plan's parts by kind),
`privatize_step` (one step's releases, for the auditor, by kind).

A hook that reaches the model or the optimizer (`Hook.reaches_model`) certifies only as privbench's own code; a
mechanism from outside privbench that writes one, or overrides a final method, replaces what privbench accounts
and audits: its trials are `uncertified` with the reason (`integrity.verdict.contract_findings`), never `ok`. The
trainer checks every step from the outside (`mechanisms.framework.integrity`): a run whose checks fail is never
`ok`.

Import-light: a mechanism's descriptor (ID, Options, `private`, its docstring) loads without torch, Opacus
or scipy (`privbench list`, grid validation); the heavy code is imported inside the hooks.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from mechanisms.framework import options as options_lib
from mechanisms.parts.clipping import CLIPPINGS as CLIPPING_RULES
from mechanisms.parts.clipping import FlatClipping, PerLayerClipping

if TYPE_CHECKING:
    import torch

    from mechanisms.auditing.cases import AuditCase
    from mechanisms.auditing.tradeoff import TradeOff
    from mechanisms.framework.private_training import AfterStep, PrivateTraining
    from mechanisms.parts.noise_addition import NoiseMap
    from mechanisms.parts.plan import Parts, PrivacyPlan, PrivacySpec
    from mechanisms.parts.releases import Released

CLIPPINGS = tuple(CLIPPING_RULES)  # the `clipping` option's values: flat, per-layer
BESIDE = ("rdp", "prv")  # accountants recorded next to the certified (PLD) epsilon
Method = TypeVar("Method", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Hook:
    """One hook of the contract: what a mechanism may write, who calls it, and the guarantee it must keep.
    `reaches_model`: the hook runs on the model or the optimizer, so only privbench's own code certifies."""

    name: str
    used_by: str
    guarantee: str
    reaches_model: bool = False


def hook(*, used_by: str, guarantee: str, reaches_model: bool = False) -> Callable[[Method], Method]:
    """Mark a method of a kind as a hook (the one declaration of it): its name and parameters are read from the
    method, so the table cannot drift from the code."""

    def mark(method: Method) -> Method:
        params = ", ".join(list(inspect.signature(method).parameters)[1:])
        method.__privbench_hook__ = Hook(f"{method.__name__}({params})", used_by,  # type: ignore[attr-defined]
                                         guarantee, reaches_model)
        return method

    return mark


def declared_hooks(kind: type) -> dict[str, Hook]:
    """The hooks `kind` itself declares (its marked methods, in order), by method name."""
    return {name: mark for name, value in vars(kind).items()
            if (mark := getattr(value, "__privbench_hook__", None)) is not None}


# The class attributes a mechanism may set, each with its guarantee (attributes cannot carry a decorator).
ATTRIBUTE_HOOKS = (
    Hook("ID, Options", "grid, registry", "ID is the grid's name; Options a frozen dataclass of the grid's "
         "options, parsed strictly by privbench"),
    Hook("private", "grid, trial", "False only for a reference run: no parts, no noise, no epsilon axis"),
    Hook("audit_coordinatewise, audit_per_tensor", "audit", "the release treats coordinates (tensors) "
         "independently"),
)


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """A mechanism without options."""


@dataclasses.dataclass(frozen=True)
class Claim:
    """The mechanism's own published analysis of a sigma: its epsilon, who says so, and any extras."""

    epsilon: float | None
    by: str | None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    notes: str = ""


@dataclasses.dataclass(frozen=True)
class Calibrated:
    """What a claimed calibration chose: sigma, and the options the mechanism runs at it when the choice
    changes them (shuffled DP-SGD's Algorithm 1 falls back to plain DP-SGD), with fields for the record."""

    sigma: float
    options: Any = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class AfterStepPart:
    """privbench's own post-processing after each update (`after_step(optimizer)`, from the template step
    `Mechanism.post_processing`), and how it maps noise drawn in a canonical frame to the current one
    (`noise_map`), if it does."""

    after_step: AfterStep | None = None
    noise_map_for: Any = None  # (params) -> NoiseMap
    handle: Any = None  # kept on the optimizer as `optimizer.post_processing` (e.g. a Shuffler)


def uncertified(plan: PrivacyPlan, reason: str) -> PrivacyPlan:
    """`plan` with no sound analysis: what runs is not what privbench can account (`reason` says why)."""
    import dp_accounting  # lazy: heavy (dp_accounting)

    return dataclasses.replace(plan, epsilon_certified=None, effective_event=dp_accounting.UnsupportedDpEvent(),
                               epsilons={name: None for name in plan.epsilons} or {"pld": None},
                               uncertified_reason=reason, notes=f"uncertified: {reason}")


class Mechanism:
    """The contract every mechanism follows; subclasses are registered as instances (entry points, or
    `mechanisms.register` in a notebook). Defaults are DP-SGD's, so a DP-SGD variant overrides only what
    differs (see docs/plugins.md for a worked example)."""

    ID: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    references: ClassVar[tuple[str, ...]] = ()  # the papers it implements (arXiv ids), shown with its results
    #: True when the mechanism claims privacy; False for a reference run (no noise, no epsilon), which the
    #: grid runs once per seed without an epsilon axis and the leaderboard uses as the utility baseline.
    private: ClassVar[bool] = True
    #: True when `privatize_step` treats coordinates independently (output column k depends only on input
    #: column k and fresh noise): the audit may then run it on the canary's support only, which is exact for
    #: projection statistics. False when the release mixes coordinates (FFT, permutations, normalisation).
    audit_coordinatewise: ClassVar[bool] = True
    #: True when the release acts on each parameter tensor on its own (gredp's per-tensor FFT): the audit
    #: then passes `privatize_step` the model's tensor structure, scaled to the audited dimension, as
    #: `tensor_sizes` (summing to the gradient's columns).
    audit_per_tensor: ClassVar[bool] = False

    @property
    def description(self) -> str:
        """What `privbench list mechanisms` shows: the first paragraph of the class' own docstring, else of
        its module's (one mechanism per module, as the built-ins)."""
        module = sys.modules.get(type(self).__module__)
        doc = type(self).__dict__.get("__doc__") or (module.__doc__ if module else None) or ""
        return " ".join(doc.strip().split("\n\n")[0].split())

    # ---- options and parts (hooks: Options, parts) ------------------------------------------------------

    @typing.final
    def options(self, mapping: Mapping[str, Any] | None) -> Any:
        """The grid's `mechanism_options[ID]` as a frozen `Options`; raises ValueError listing every problem."""
        return options_lib.parse(self.Options, mapping, self.ID)

    @typing.final
    def option_problems(self, mapping: Mapping[str, Any] | None) -> list[str]:
        """Every problem with the options, one per line (empty when they are valid); never raises."""
        return options_lib.problems(self.Options, mapping, self.ID)

    @hook(used_by="plan, training, audit", guarantee="the releases one step makes on its sample, built from "
          "privbench's part classes; the event they add up to is the certified event")
    def parts(self, spec: PrivacySpec, options: Any) -> Parts | None:
        """Hook: the releases one private step makes on its sample, each a privbench part stating its guarantee
        (None: nothing private runs, for a reference mechanism).

        Guarantee: training runs exactly these parts (`make_private` builds the loader, clipping, noise and
        every other release from them), so the event they add up to (`Parts.dp_event`) is the run's
        certified event. DP-SGD's parts by default: the spec's sampler, flat clipping at C, Gaussian noise.
        """
        if not self.private:
            return None
        from mechanisms.parts.noise_addition import GaussianNoise  # lazy: keeps import mechanisms light
        from mechanisms.parts.plan import Parts  # lazy: keeps import mechanisms light

        clipper = FlatClipping(spec.clip)
        return Parts(spec.batch_selection, clipper, GaussianNoise(clipper.bound))

    @typing.final
    def planned_parts(self, spec: PrivacySpec, options: Any) -> Parts | None:
        """The mechanism's `parts` with the statistics the model releases before training (`spec.dataset_statistics`):
        the model, not the mechanism, decides those, and the trainer releases exactly these. A reference run
        (`private = False`) has none, whatever its `parts` say."""
        parts = self.parts(spec, options) if self.private else None
        if parts is None or parts.dataset_releases == spec.dataset_statistics:
            return parts
        return dataclasses.replace(parts, dataset_releases=spec.dataset_statistics)

    # ---- analysis (hooks: claimed_sigma, claim, certification_gap) ----------------------------------------

    @hook(used_by="plan", guarantee="the paper's epsilon at sigma (default: the certified one); a claim, not a "
          "bound: the audits test it")
    def claim(self, sigma: float, spec: PrivacySpec, options: Any, parts: Parts, certified: float | None) -> Claim:
        """Hook: the mechanism's own epsilon for `sigma`: by default the reference accountant's (nothing claimed
        beyond what is certified). A claim is the paper's number, not a bound: the audits test it."""
        return Claim(certified, "pld")

    @hook(used_by="plan", guarantee="the sigma the paper's analysis picks for the target (default: the certified "
          "one); may return Calibrated with the options it runs at")
    def claimed_sigma(self, spec: PrivacySpec, options: Any, parts: Parts) -> float | Calibrated:
        """Hook: the sigma the paper's analysis picks for the target (a `Calibrated` when the choice also
        changes the options): by default the certified one."""
        return self.certified_sigma(spec, parts)

    @hook(used_by="plan", guarantee="why no sound analysis of what runs is known (None: the parts certify); a gap "
          "makes the trial uncertified")
    def certification_gap(self, spec: PrivacySpec, options: Any) -> str | None:
        """Hook: why no sound analysis of what runs is known with these options (None: the parts certify)."""
        return None

    @typing.final
    def certified_sigma(self, spec: PrivacySpec, parts: Parts) -> float:
        """The smallest sigma (on the calibration grid) whose certified epsilon is <= the target."""
        from mechanisms.accounting import calibrate_sigma  # lazy: heavy (dp_accounting, numpy, scipy)

        gap = self.certification_gap(spec, self.options(spec.options)) or parts.certification_gap()
        if gap is not None:
            raise ValueError(f"{self.ID} cannot be calibrated to a certified epsilon (calibration: certified "
                             f"skips it): {gap}")
        if parts.noise_multiplier(1.0) == 0:
            raise ValueError(f"{self.ID}: this configuration leaves a direction without noise, so no sigma "
                             "reaches a finite certified epsilon (calibration: certified cannot apply)")
        return calibrate_sigma(parts, spec.epsilon, spec.delta, spec.accountant).sigma

    @typing.final
    def plan(self, spec: PrivacySpec) -> PrivacyPlan:
        """What runs and what it is worth: parts, sigma, the certified event and the three epsilons. The only
        place that calibrates.

        Guarantee: `epsilon_certified` is a sound upper bound (PLD) for the event of the parts that
        `make_private` runs at `sigma`, accounted under the relation calibration used; `epsilon_claimed` is
        the mechanism's own analysis (`claim`).
        """
        options = self.options(spec.options)
        parts = self.planned_parts(spec, options)
        if parts is None:
            return self._reference_plan(spec)
        extra: Mapping[str, Any] = {}
        if spec.sigma is not None:
            sigma = spec.sigma
        elif spec.epsilon is None:
            raise ValueError(f"{self.ID} needs a target epsilon or an explicit sigma")
        elif spec.calibration == "claimed":
            chosen = self.claimed_sigma(spec, options, parts)
            if isinstance(chosen, Calibrated):
                if chosen.options is not None and chosen.options != options:
                    options = chosen.options
                    parts = self.planned_parts(spec, options)
                sigma, extra = chosen.sigma, chosen.extra
            else:
                sigma = chosen
        else:
            sigma = self.certified_sigma(spec, parts)
        return self._assemble(spec, options, parts, float(sigma), extra)

    def _assemble(self, spec: PrivacySpec, options: Any, parts: Parts, sigma: float,
                  extra: Mapping[str, Any]) -> PrivacyPlan:
        """The plan of `parts` at `sigma`: the event they add up to, its epsilons, and the claim."""
        import dp_accounting  # lazy: heavy (dp_accounting)

        from mechanisms.accounting import epsilon  # lazy: heavy (dp_accounting, numpy, scipy)
        from mechanisms.parts.plan import PrivacyPlan, relation_name  # lazy: keeps import mechanisms light

        gap = self.certification_gap(spec, options) or parts.certification_gap()
        relation = parts.accounting_relation
        if gap is None:
            event = parts.dp_event(sigma)
            epsilons = {name: epsilon(event, spec.delta, name, relation) for name in ("pld", *BESIDE)}
        else:  # what runs is not what the parts describe, or the parts are not privbench's: no sound analysis
            event = dp_accounting.UnsupportedDpEvent()
            epsilons = {name: None for name in ("pld", *BESIDE)}
        certified = epsilons["pld"]
        claim = self.claim(sigma, spec, options, parts, certified)
        notes = claim.notes
        if gap is not None and not notes:
            notes = f"uncertified: {gap}"
        elif certified is not None and math.isinf(certified) and not notes:
            notes = "the noise leaves a direction unprotected: no finite epsilon holds"
        guarantee = relation if relation != parts.neighboring_relation and relation.name == "REPLACE_ONE" \
            else parts.neighboring_relation
        return PrivacyPlan(
            mechanism=self.ID, sigma=sigma, sample_rate=parts.sampler.sample_rate, steps=parts.sampler.steps,
            delta=spec.delta, sampler=parts.sampler.name, accountant=spec.accountant, claimed_by=claim.by,
            epsilon_claimed=claim.epsilon, epsilon_certified=certified, effective_event=event, notes=notes,
            extra={"options": dataclasses.asdict(options), **claim.extra, **extra}, parts=parts,
            neighboring_relation=relation_name(guarantee), epsilons=epsilons, uncertified_reason=gap,
            release_multipliers=parts.release_multipliers(sigma),
        )

    def _reference_plan(self, spec: PrivacySpec) -> PrivacyPlan:
        """No privacy: no sigma, no epsilons; the sampler is shuffling, as ordinary training."""
        import dp_accounting  # lazy: heavy (dp_accounting)

        from mechanisms.parts.plan import PrivacyPlan  # lazy: keeps import mechanisms light

        selection = dataclasses.replace(spec, sampler="shuffle").batch_selection
        return PrivacyPlan(
            mechanism=self.ID, sigma=None, sample_rate=selection.sample_rate, steps=selection.steps, delta=spec.delta,
            sampler=selection.name, accountant=spec.accountant, claimed_by=None, epsilon_claimed=None,
            epsilon_certified=None, effective_event=dp_accounting.NonPrivateDpEvent(), extra={"options": {}},
            batch=selection,
        )

    # ---- state and post-processing (hooks: initial_state, update_state, after_step) ------------------------

    @hook(used_by="training", guarantee="the state the first step starts from (default: the declared bound of a "
          "clipper whose bound the state sets)")
    def initial_state(self, plan: PrivacyPlan, options: Any) -> dict[str, float]:
        """Hook: the state the mechanism starts with, name -> value (kept on the training device). By default,
        the declared bound of a clipper that reads its bound from the state, under its `state_key`."""
        clipper = plan.parts.clipper if plan.parts is not None else None
        if clipper is not None and clipper.state_key is not None:
            return {clipper.state_key: float(clipper.bound)}
        return {}

    @hook(used_by="training", guarantee="the next state from copies of the state and of what the step released "
          "(noised values) only: post-processing, computed on the device; a clip bound is held to the clipper's "
          "declared range, and the trajectory is replayed from the releases")
    def update_state(self, state: Mapping[str, torch.Tensor], released: Released, plan: PrivacyPlan,
                     options: Any) -> Mapping[str, torch.Tensor]:
        """Hook: the state after a step, from copies of the state before it and of what the step released
        (nothing else reaches it, so the update is post-processing of the releases). Returns the entries that
        change, computed on the device (no host synchronisation); none by default.

        Enforced: a bound the state sets is held to the clipper's declared range (a clamp is recorded and the
        run is not certified), and the analysis replays the trajectory from the recorded releases alone, in a
        process of its own with a fresh mechanism: a state that used anything else does not replay."""
        return {}

    @hook(used_by="training", guarantee="sees copies of each step's releases and state after the update, and returns "
          "nothing (never the model, the optimizer or the noise)")
    def after_step(self, released: Released, state: Mapping[str, torch.Tensor], plan: PrivacyPlan,
                   options: Any) -> None:
        """Hook: sees copies of each step's releases and of the state after the update (a mechanism's own
        statistics, logging); returns nothing: nothing it does reaches the model or the next step."""
        return None

    @typing.final
    def post_processing(self, module: torch.nn.Module, plan: PrivacyPlan, options: Any,
                        generator: torch.Generator) -> AfterStepPart:
        """privbench's own post-processing of the updated model after each step, reading no data: the part a
        `PostProcessingMechanism` declares (shuffled DP-SGD's coupled permutations), none for other kinds. A
        plugin that overrides it runs code on the model that privbench has not verified, and is not certified
        (`contract_findings`)."""
        if not isinstance(self, PostProcessingMechanism):
            return AfterStepPart()
        part = self.post_processing_part(module, plan, options, generator)
        if part.after_step is not None and (plan.parts is None or plan.parts.post_processing is None):
            raise ValueError(f"{self.ID} post-processes every update, but its parts do not name it "
                             "(Parts.post_processing), so the plan would not record it")
        return part

    # ---- training ---------------------------------------------------------------------------------------

    @typing.final
    def make_private(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Any, plan: PrivacyPlan, *,
                     criterion: Any, generator: torch.Generator, grad_sample_mode: str = "hooks",
                     noise_generator: torch.Generator | None = None, secure_mode: bool = False,
                     pad_to: int | None = None) -> PrivateTraining:
        """Wrap like Opacus' `make_private`, every part from the plan (the trainer's step).

        Guarantee: the loader, clipping, noise and every other release that run are `plan.parts` (the
        accounted process is the executed one); the state is updated from the releases only. `generator`
        drives batch selection and post-processing, `noise_generator` the noise (both derived from the
        trial seed by the worker). Batches come on the module's device (`private_training.plan_loader`), padded to
        multiples of `pad_to` rows of weight 0 when given (static shapes for a compiled step). A reference run
        keeps the plain optimizer; a `ForwardNoiseMechanism` too, with its forward-noise layer installed.
        """
        # lazy: keeps import mechanisms light
        from mechanisms.framework.private_training import PrivateTraining, make_private, plan_loader

        if plan.mechanism != self.ID:
            raise ValueError(f"{self.ID}.make_private got a plan for {plan.mechanism!r}")
        if isinstance(self, ForwardNoiseMechanism):
            data = _install_forward_noise(self, module, data, plan, generator)
        if plan.parts is None or isinstance(self, ForwardNoiseMechanism):
            device = next((p.device for p in module.parameters()), None)
            return PrivateTraining(module, optimizer, plan_loader(data, plan, generator, device=device, pad_to=pad_to),
                                   criterion)
        options = self.options(plan.extra.get("options", {}))
        post = self.post_processing(module, plan, options, generator)
        params = [p for p in module.parameters() if p.requires_grad]
        noise_map: NoiseMap | None = post.noise_map_for(params) if post.noise_map_for is not None else None
        state = self.initial_state(plan, options)
        cls = type(self)

        def update(current: Mapping[str, torch.Tensor], released: Released) -> Mapping[str, torch.Tensor]:
            return self.update_state(current, released, plan, options)

        def released_hook(released: Released, current: Mapping[str, torch.Tensor]) -> Any:
            return self.after_step(released, current, plan, options)

        # the hooks run (on copies) only when the mechanism writes them: a step without them copies nothing
        training = make_private(module, optimizer, data, plan, criterion=criterion, generator=generator,
                                grad_sample_mode=grad_sample_mode, noise_generator=noise_generator,
                                secure_mode=secure_mode, after_step=post.after_step, noise_map=noise_map,
                                state=state, pad_to=pad_to,
                                update_state=update if cls.update_state is not Mechanism.update_state else None,
                                released_hook=released_hook if cls.after_step is not Mechanism.after_step else None)
        training.optimizer.post_processing = post.handle
        return training

    # ---- auditing -----------------------------------------------------------------------------------------

    @typing.final
    def audit_parts(self, sigma: float, clip: float, dim: int, options: Mapping[str, Any],
                    tensor_sizes: tuple[int, ...] | None = None, batch_size: int | None = None) -> Parts:
        """The parts of one un-subsampled step releasing a `dim`-coordinate gradient (for the one-step audit),
        split into tensors of `tensor_sizes` when given (one tensor by default), on a batch of the trial's
        expected size (`batch_size`, 1 by default: parts whose noise depends on it get the trial's)."""
        from mechanisms.parts.plan import PrivacySpec  # lazy: keeps import mechanisms light

        sizes = tuple(tensor_sizes) if tensor_sizes else (dim,)
        batch = int(batch_size or 1)
        spec = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=batch, batch_size=batch, epochs=1, clip=clip,
                           sigma=sigma, options=options, model_dim=dim, n_tensors=len(sizes), tensor_sizes=sizes)
        parts = self.parts(spec, self.options(options))
        if parts is None:
            raise ValueError(f"{self.ID} adds no noise to audit")
        return parts

    @typing.final
    def privatize_step(self, sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator, *,
                       layout: tuple[int, ...] | None = None, tensor_sizes: tuple[int, ...] | None = None,
                       batch_size: int | None = None, **options: Any) -> np.ndarray:
        """The audit release: one privatised step per row, every release of the step side by side.

        A row is the step's sums in its release layout: the clipped-gradient sum's columns (an example's
        gradient has norm <= the clipper's bound), then each other release's (`Parts.releases`, in order).
        `layout` gives each block's width when the rows hold only some columns (the audit's support path);
        by default the gradient takes what the other releases leave. `tensor_sizes` splits the gradient's
        columns as the model's tensors are split (for parts that act per tensor); `batch_size` is the trial's
        expected batch size (`audit_parts`).

        Guarantee: the same code and law as one training step's releases (the noise part's own `release`,
        each release's own noise), so what the auditor measures is what training does. `options` are the
        mechanism's own (extra, auditor-side keys are dropped: `audit_options`). By kind: a reference run releases
        the sums themselves; a `ForwardNoiseMechanism` bounds each row and adds its parts' noise; a
        `PostProcessingMechanism`'s release is then post-processed as training's is.
        """
        import torch  # lazy: heavy (torch)

        if not self.private:
            return np.asarray(sums, dtype=np.float64)
        if isinstance(self, ForwardNoiseMechanism):
            return _forward_release(self, sums, sigma, clip, rng, options)
        rows = np.atleast_2d(np.asarray(sums, dtype=np.float64))
        extra = self.audit_parts(sigma, clip, 1, self.audit_options(options), batch_size=batch_size).releases
        widths = list(layout) if layout is not None else \
            [rows.shape[1] - sum(r.width for r in extra), *(r.width for r in extra)]
        parts = self.audit_parts(sigma, clip, widths[0], self.audit_options(options), tensor_sizes, batch_size)
        if len(widths) != 1 + len(parts.releases) or sum(widths) != rows.shape[1] or min(widths) < 0:
            raise ValueError(f"{self.ID}: rows of {rows.shape[1]} columns do not fit the release layout {widths}")
        generator = torch.Generator().manual_seed(int(rng.integers(0, 2**63 - 1)))
        blocks = list(torch.split(torch.from_numpy(rows), widths, dim=1))
        gradient = list(torch.split(blocks[0], list(tensor_sizes), dim=1)) if tensor_sizes else [blocks[0]]
        if tensor_sizes and sum(tensor_sizes) != widths[0]:
            raise ValueError(f"tensor_sizes sum to {sum(tensor_sizes)}, the gradient has {widths[0]} columns")
        released = [torch.cat(parts.noise.release(gradient, sigma, generator), dim=1)]
        released += [release.add_noise(block, sigma, generator) for release, block in
                     zip(parts.releases, blocks[1:], strict=True)]
        out = torch.cat(released, dim=1).numpy()
        if isinstance(self, PostProcessingMechanism):
            return self.post_process_release(out, rng, self.options(self.audit_options(options)))
        return out

    @typing.final
    def audit_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The subset of `options` this mechanism declares (audits pass extra, auditor-side keys)."""
        known = {f.name for f in dataclasses.fields(self.Options)}
        return {k: v for k, v in options.items() if k in known}

    @hook(used_by="audit", guarantee="the claim for one un-subsampled step as a trade-off curve (default: the "
          "parts' Gaussian curve, or the claim's profile)")
    def claimed_step_tradeoff(self, sigma: float, options: Mapping[str, Any]) -> TradeOff | None:
        """Hook: what the claim says about ONE un-subsampled step at `sigma`, as a trade-off curve (None: it
        claims nothing). The audit calls the claim violated when an attack beats this curve.

        By default: a mechanism that claims what its parts certify (no `claim` of its own) claims the Gaussian
        curve of the step's parts, all releases together (G_mu, mu = 1 / their combined multiplier; G_{1/sigma}
        for DP-SGD); one with its own `claim` claims the privacy profile its plan gives for one step
        (`auditing.profile.claimed_profile`). Override it where the paper states a closed form. `options`: the
        audit's, a mapping of the mechanism's own options (`self.options(self.audit_options(options))` parses
        them) and the auditor's (`batch_size`, `tensor_sizes`)."""
        from mechanisms.auditing import profile, tradeoff  # lazy: keeps import mechanisms light

        if not self.private:
            return None
        if type(self).claim is not Mechanism.claim:
            return profile.claimed_profile(self, sigma, options=options)
        parts = self.audit_parts(sigma, 1.0, 1, self.audit_options(options), batch_size=options.get("batch_size"))
        multiplier = parts.noise_multiplier(sigma)
        return tradeoff.Gaussian(mu=math.inf if multiplier == 0 else 1.0 / multiplier)

    @hook(used_by="audit", guarantee="extra worst-case neighbours, each side a valid clipped sum, one example apart")
    def audit_cases(self, dim: int, clip: float, rng: np.random.Generator,
                    options: Mapping[str, Any]) -> list[AuditCase]:
        """Hook: worst-case neighbouring inputs beyond the Dirac canary every mechanism gets (`auditing/cases.py`).

        Each case's two sides must be valid clipped sums (norm <= clip per example) that differ in one
        example, so a bound found on them is a bound on the mechanism. `options` as `claimed_step_tradeoff`'s.
        None by default."""
        return []


class ForwardNoiseMechanism(Mechanism):
    """The kind whose noise is added in the forward pass (DP-Forward): each example's hidden state is bounded and
    released with the parts' Gaussian noise by privbench's forward-noise layer, which `install_forward_noise`
    installs; the template keeps the model's own optimizer (no per-example gradients) and builds the loader.

    Its contract, checked: the template refuses a layer that does not release at the plan's sigma and clip bound;
    before the first step and after the last the layer, its methods and every forward hook on the model must be
    privbench's or torch's code (`integrity.verdict.forward_noise_findings`); the audit release is `bound_release`
    then the parts' own noise, as the layer does."""

    @hook(used_by="training", reaches_model=True, guarantee="installs privbench's forward-noise layer on the model "
          "(`module.dp_forward`) at the plan's sigma and clip bound, and returns the training data with what is "
          "released once before training applied (randomised labels)")
    def install_forward_noise(self, module: torch.nn.Module, data: Any, plan: PrivacyPlan, options: Any,
                              generator: torch.Generator) -> Any:
        """Hook: see the guarantee; the layer's seed derives from `generator` (the trial's) unless an option sets it."""
        raise NotImplementedError(f"{self.ID} is a forward-noise mechanism: it installs its forward noise")

    @hook(used_by="audit", guarantee="what the forward-noise layer does to a row before its noise (bounds its norm "
          "to clip), the same function training runs; the template adds the parts' noise")
    def bound_release(self, rows: torch.Tensor, clip: float, options: Any) -> torch.Tensor:
        """Hook: the rows (one flattened hidden state each) as the layer bounds them before the noise."""
        raise NotImplementedError(f"{self.ID} is a forward-noise mechanism: it bounds what it releases")


class PostProcessingMechanism(Mechanism):
    """The kind whose released update privbench post-processes after each step, reading no data (shuffled DP-SGD's
    coupled permutations): DP-SGD's step from the parts, then the declared post-processing part, in training and in
    the audit's release alike.

    Its contract, checked: the parts name the post-processing (`Parts.post_processing`, recorded with the plan);
    the part runs on the model and the optimizer, so only privbench's own certifies (a plugin's is
    `uncertified`, `contract_findings`); the step guards re-read the parameters after it, and the audit's release
    is the post-processed one."""

    @hook(used_by="training", reaches_model=True, guarantee="the post-processing after each update (`AfterStepPart`"
          ": what runs on the optimizer, how noise drawn in a canonical frame maps to the current one), reading "
          "no data; the parts name it")
    def post_processing_part(self, module: torch.nn.Module, plan: PrivacyPlan, options: Any,
                             generator: torch.Generator) -> AfterStepPart:
        """Hook: the part (its generator seeded from `generator`, the trial's, unless an option sets it)."""
        raise NotImplementedError(f"{self.ID} is a post-processing mechanism: it declares its post-processing")

    @hook(used_by="audit", guarantee="the same post-processing on the audit's released rows (one release per row)"
          ", from the released values and `rng` only")
    def post_process_release(self, released: np.ndarray, rng: np.random.Generator, options: Any) -> np.ndarray:
        """Hook: the released rows, post-processed as a training step's update is."""
        raise NotImplementedError(f"{self.ID} is a post-processing mechanism: it post-processes the audit release")


def _install_forward_noise(mechanism: ForwardNoiseMechanism, module: torch.nn.Module, data: Any, plan: PrivacyPlan,
                           generator: torch.Generator) -> Any:
    """The forward-noise kind's training step: its hook installs the layer, the template checks it releases at the
    plan's sigma and clip bound (what the plan accounted), and returns the data the hook randomised."""
    if plan.sigma is None or plan.parts is None:
        raise ValueError(f"make_private needs a {mechanism.ID} plan with a sigma, got {plan.mechanism!r}")
    if getattr(module, "dp_forward", None) is not None:
        raise ValueError(f"this model already carries {mechanism.ID} hooks")
    data = mechanism.install_forward_noise(module, data, plan, mechanism.options(plan.extra.get("options", {})),
                                           generator)
    layer = getattr(module, "dp_forward", None)
    if layer is None or (layer.sigma, layer.clip) != (plan.sigma, plan.parts.clipper.bound):
        raise ValueError(f"{mechanism.ID}'s forward-noise layer does not release at the plan's sigma {plan.sigma} "
                         f"and clip bound {plan.parts.clipper.bound}")
    return data


def _forward_release(mechanism: ForwardNoiseMechanism, sums: np.ndarray, sigma: float, clip: float,
                     rng: np.random.Generator, options: Mapping[str, Any]) -> np.ndarray:
    """The forward-noise kind's audit release: one release per row (a flattened hidden state), bounded as the layer
    bounds it, with the noise of the mechanism's parts (the part training's layer draws from)."""
    import torch  # lazy: heavy (torch)

    declared = mechanism.audit_options(options)
    rows = torch.from_numpy(np.atleast_2d(np.asarray(sums, dtype=np.float64)).reshape(len(sums), -1))
    bounded = mechanism.bound_release(rows, clip, mechanism.options(declared))
    noise = mechanism.audit_parts(sigma, clip, rows.shape[1], declared).noise
    generator = torch.Generator().manual_seed(int(rng.integers(0, 2**63 - 1)))
    return noise.release([bounded], sigma, generator)[0].numpy()


KINDS = (Mechanism, ForwardNoiseMechanism, PostProcessingMechanism)  # the kinds of mechanism; each declares its hooks
# The template methods (marked `typing.final`): what privbench runs the same way for every mechanism. A plugin
# overriding one replaces what is accounted, trained or audited (`integrity.verdict.contract_findings`).
FINAL = tuple(name for name, value in vars(Mechanism).items() if getattr(value, "__final__", False))


def kind_hooks() -> list[tuple[type, str, Hook]]:
    """(kind, method name, hook) for every hook a method declares, kind by kind."""
    return [(kind, name, mark) for kind in KINDS for name, mark in declared_hooks(kind).items()]


# Every hook a mechanism may fill, with its guarantee: the attributes', then each kind's methods' (a kind's hooks are
# named with the kind). `privbench list mechanisms --hooks` and docs/plugins.md render this (`hooks_table`).
HOOKS = (*ATTRIBUTE_HOOKS, *(mark if kind is Mechanism else dataclasses.replace(mark, name=f"{kind.__name__}."
                                                                                          f"{mark.name}")
                             for kind, _, mark in kind_hooks()))


def filled_hooks(mechanism: Mechanism) -> list[str]:
    """The hooks `mechanism`'s class writes itself (beside ID and Options), for `privbench list mechanisms`."""
    cls = type(mechanism)
    return [name for kind, name, _ in kind_hooks() if issubclass(cls, kind) and getattr(cls, name) is not
            getattr(kind, name)]


def hooks_table() -> str:
    """The contract's hooks as the markdown table docs/plugins.md shows (a test compares the two), and the final
    methods."""
    rows = ["| hook | used by | guarantee it must keep |", "|---|---|---|"]
    rows += [f"| `{h.name}` | {h.used_by} | {h.guarantee} |" for h in HOOKS]
    finals = ", ".join(f"`{name}`" for name in FINAL)
    return "\n".join(rows) + f"\n\nThe final methods, which privbench runs itself: {finals}.\n"


def clipping_for(clipping: str, clip: float, n_tensors: int | None, owner: str) -> FlatClipping | PerLayerClipping:
    """Flat clipping at C, or per-layer clipping splitting C over the model's tensors (same example bound)."""
    if clipping not in CLIPPING_RULES:
        raise ValueError(f"{owner} clipping must be one of {', '.join(CLIPPINGS)}, got {clipping!r}")
    if clipping == "flat":
        return FlatClipping(clip)
    if n_tensors is None:
        raise ValueError(f"{owner} per-layer clipping needs the model's number of parameter tensors (n_tensors)")
    return PerLayerClipping.splitting(clip, n_tensors)


__all__ = ["ATTRIBUTE_HOOKS", "CLIPPINGS", "FINAL", "HOOKS", "KINDS", "AfterStepPart", "Calibrated", "Claim",
           "ForwardNoiseMechanism", "Hook", "Mechanism", "NoOptions", "PostProcessingMechanism", "clipping_for",
           "declared_hooks", "filled_hooks", "hook", "hooks_table", "kind_hooks", "uncertified"]
