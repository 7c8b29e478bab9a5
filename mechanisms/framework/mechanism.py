"""The mechanism contract: a mechanism is its options, its parts (the releases of one step), its state and
its own (claimed) analysis; privbench plans, trains, certifies and audits it.

`Mechanism` is a template (benchopt's `BaseSolver`, dp-accounting's `PrivacyAccountant`): the methods in
`FINAL` run the same way for every mechanism, and a subclass fills hooks. The hooks, each with the
guarantee it must keep (docs/plugins.md shows them all, `privbench list mechanisms --hooks` too):

- `ID`, `Options`: the grid's name and a frozen dataclass of its options (parsed strictly, one way).
- `parts(spec, options)`: the releases of one private step on one sample (`mechanisms.parts.plan.Parts`):
  the sampler, the clipper and noise of the gradient sum, and any other release (a noised count). Only
  privbench's part classes certify; the event they add up to is the certified event.
- `claimed_sigma(...)` and `claim(...)`: the paper's own analysis, when it differs from the certified one.
- `certification_gap(spec, options)`: why no sound analysis of what runs exists (None: there is one).
- `initial_state(plan, options)` and `update_state(state, released, plan, options)`: state that lives
  across steps (a clip bound that adapts). The update gets copies of what the step released (noised values)
  and of the state: whatever it computes is post-processing. A clipper with a `state_key` takes its bound from
  the state, held by the trainer to the clipper's declared range.
- `after_step(released, state, plan, options)`: sees copies of each step's releases and state after the
  update; returns nothing (logging, a mechanism's own statistics).

No hook gets the optimizer, the clipping engine, the model, the noise generator or the clipped sums: what
needs more is a part (declared, accounted and checked) or privbench's own code (`post_processing`, the
template step that runs shuffled DP-SGD's permutations). The trainer checks every step from the outside
(`mechanisms.framework.integrity`): a run whose checks fail is never `ok`.
- `claimed_step_tradeoff(sigma, **options)` and `audit_cases(...)`: what the one-step audit tests.

What the base class does, the same way for every mechanism (`FINAL`): `plan` (the only place that
calibrates: sigma explicit, or for the target under the grid's `calibration`; the certified event from
the parts; epsilon_certified by PLD with RDP and PRV beside it), `make_private` (the trainer's private
step, built from the plan's parts), `privatize_step` (one step's releases, for the auditor). A mechanism
from outside privbench that overrides one of them replaces what privbench accounts and audits: its trials
are `uncertified` with the reason (`integrity.verdict.contract_findings`), never `ok`.

Import-light: a mechanism's descriptor (ID, Options, `private`, its docstring) loads without torch, Opacus
or scipy (`privbench list`, grid validation); the heavy code is imported inside the hooks.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

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
# The template methods: what privbench runs the same way for every mechanism. A plugin overriding one of them
# replaces what is accounted, trained or audited (`integrity.verdict.contract_findings`).
FINAL = ("options", "option_problems", "plan", "planned_parts", "certified_sigma", "make_private", "privatize_step",
         "audit_parts", "audit_options", "post_processing")


@dataclasses.dataclass(frozen=True)
class Hook:
    """One hook of the contract: what a mechanism may write, who calls it, and the guarantee it must keep."""

    name: str
    used_by: str
    guarantee: str


# Every hook a mechanism may fill, with its guarantee (`privbench list mechanisms --hooks` and docs/plugins.md
# show this table; a test keeps the docs equal to it).
HOOKS = (
    Hook("ID, Options", "grid, registry", "ID is the grid's name; Options a frozen dataclass of the grid's "
         "options, parsed strictly by privbench"),
    Hook("private", "grid, trial", "False only for a reference run: no parts, no noise, no epsilon axis"),
    Hook("parts(spec, options)", "plan, training, audit", "the releases one step makes on its sample, built "
         "from privbench's part classes; the event they add up to is the certified event"),
    Hook("claimed_sigma(spec, options, parts)", "plan", "the sigma the paper's analysis picks for the target "
         "(default: the certified one); may return Calibrated with the options it runs at"),
    Hook("claim(sigma, spec, options, parts, certified)", "plan", "the paper's epsilon at sigma (default: the "
         "certified one); a claim, not a bound: the audits test it"),
    Hook("certification_gap(spec, options)", "plan", "why no sound analysis of what runs is known (None: the "
         "parts certify); a gap makes the trial uncertified"),
    Hook("initial_state(plan, options)", "training", "the state the first step starts from (default: the "
         "declared bound of a clipper whose bound the state sets)"),
    Hook("update_state(state, released, plan, options)", "training", "the next state from copies of the state "
         "and of what the step released (noised values) only: post-processing, computed on the device; a clip "
         "bound is held to the clipper's declared range, and the trajectory is replayed from the releases"),
    Hook("after_step(released, state, plan, options)", "training", "sees copies of each step's releases and "
         "state after the update, and returns nothing (never the model, the optimizer or the noise)"),
    Hook("claimed_step_tradeoff(sigma, **options)", "audit", "the claim for one un-subsampled step as a "
         "trade-off curve (default: the parts' Gaussian curve, or the claim's profile)"),
    Hook("audit_cases(dim, clip, rng, **options)", "audit", "extra worst-case neighbours, each side a valid "
         "clipped sum, one example apart"),
    Hook("audit_coordinatewise, audit_per_tensor", "audit", "the release treats coordinates (tensors) "
         "independently"),
)


def filled_hooks(mechanism: Mechanism) -> list[str]:
    """The hooks `mechanism`'s class writes itself (beside ID and Options), for `privbench list mechanisms`."""
    names = ("parts", "claimed_sigma", "claim", "certification_gap", "initial_state", "update_state", "after_step",
             "claimed_step_tradeoff", "audit_cases")
    return [n for n in names if getattr(type(mechanism), n) is not getattr(Mechanism, n)]


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

    def options(self, mapping: Mapping[str, Any] | None) -> Any:
        """The grid's `mechanism_options[ID]` as a frozen `Options`; raises ValueError listing every problem."""
        return options_lib.parse(self.Options, mapping, self.ID)

    def option_problems(self, mapping: Mapping[str, Any] | None) -> list[str]:
        """Every problem with the options, one per line (empty when they are valid); never raises."""
        return options_lib.problems(self.Options, mapping, self.ID)

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

    def planned_parts(self, spec: PrivacySpec, options: Any) -> Parts | None:
        """The mechanism's `parts` with the statistics the model releases before training (`spec.dataset_statistics`):
        the model, not the mechanism, decides those, and the trainer releases exactly these."""
        parts = self.parts(spec, options)
        if parts is None or parts.dataset_releases == spec.dataset_statistics:
            return parts
        return dataclasses.replace(parts, dataset_releases=spec.dataset_statistics)

    # ---- analysis (hooks: claimed_sigma, claim, certification_gap) ----------------------------------------

    def claim(self, sigma: float, spec: PrivacySpec, options: Any, parts: Parts, certified: float | None) -> Claim:
        """Hook: the mechanism's own epsilon for `sigma`: by default the reference accountant's (nothing claimed
        beyond what is certified). A claim is the paper's number, not a bound: the audits test it."""
        return Claim(certified, "pld")

    def claimed_sigma(self, spec: PrivacySpec, options: Any, parts: Parts) -> float | Calibrated:
        """Hook: the sigma the paper's analysis picks for the target (a `Calibrated` when the choice also
        changes the options): by default the certified one."""
        return self.certified_sigma(spec, parts)

    def certification_gap(self, spec: PrivacySpec, options: Any) -> str | None:
        """Hook: why no sound analysis of what runs is known with these options (None: the parts certify)."""
        return None

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

    def initial_state(self, plan: PrivacyPlan, options: Any) -> dict[str, float]:
        """Hook: the state the mechanism starts with, name -> value (kept on the training device). By default,
        the declared bound of a clipper that reads its bound from the state, under its `state_key`."""
        clipper = plan.parts.clipper if plan.parts is not None else None
        if clipper is not None and clipper.state_key is not None:
            return {clipper.state_key: float(clipper.bound)}
        return {}

    def update_state(self, state: Mapping[str, torch.Tensor], released: Released, plan: PrivacyPlan,
                     options: Any) -> Mapping[str, torch.Tensor]:
        """Hook: the state after a step, from copies of the state before it and of what the step released
        (nothing else reaches it, so the update is post-processing of the releases). Returns the entries that
        change, computed on the device (no host synchronisation); none by default.

        Enforced: a bound the state sets is held to the clipper's declared range (a clamp is recorded and the
        run is not certified), and the analysis replays the trajectory from the recorded releases alone, in a
        process of its own with a fresh mechanism: a state that used anything else does not replay."""
        return {}

    def after_step(self, released: Released, state: Mapping[str, torch.Tensor], plan: PrivacyPlan,
                   options: Any) -> None:
        """Hook: sees copies of each step's releases and of the state after the update (a mechanism's own
        statistics, logging); returns nothing: nothing it does reaches the model or the next step."""
        return None

    def post_processing(self, module: torch.nn.Module, plan: PrivacyPlan, options: Any,
                        generator: torch.Generator) -> AfterStepPart:
        """privbench's own post-processing of the updated model after each step, reading no data (shuffled
        DP-SGD's coupled permutations): a template step, not a hook. A plugin that overrides it runs code on
        the model that privbench has not verified, and is not certified (`contract_findings`). None by default."""
        return AfterStepPart()

    # ---- training ---------------------------------------------------------------------------------------

    def make_private(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Any, plan: PrivacyPlan, *,
                     criterion: Any, generator: torch.Generator, grad_sample_mode: str = "hooks",
                     noise_generator: torch.Generator | None = None, secure_mode: bool = False,
                     pad_to: int | None = None) -> PrivateTraining:
        """Wrap like Opacus' `make_private`, every part from the plan (the trainer's step).

        Guarantee: the loader, clipping, noise and every other release that run are `plan.parts` (the
        accounted process is the executed one); the state is updated from the releases only. `generator`
        drives batch selection and post-processing, `noise_generator` the noise (both derived from the
        trial seed by the worker). Batches come on the module's device (`private_training.plan_loader`), padded to
        multiples of `pad_to` rows of weight 0 when given (static shapes for a compiled step).
        """
        # lazy: keeps import mechanisms light
        from mechanisms.framework.private_training import PrivateTraining, make_private, plan_loader

        if plan.mechanism != self.ID:
            raise ValueError(f"{self.ID}.make_private got a plan for {plan.mechanism!r}")
        if plan.parts is None:
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

        def hook(released: Released, current: Mapping[str, torch.Tensor]) -> Any:
            return self.after_step(released, current, plan, options)

        # the hooks run (on copies) only when the mechanism writes them: a step without them copies nothing
        training = make_private(module, optimizer, data, plan, criterion=criterion, generator=generator,
                                grad_sample_mode=grad_sample_mode, noise_generator=noise_generator,
                                secure_mode=secure_mode, after_step=post.after_step, noise_map=noise_map,
                                state=state, pad_to=pad_to,
                                update_state=update if cls.update_state is not Mechanism.update_state else None,
                                released_hook=hook if cls.after_step is not Mechanism.after_step else None)
        training.optimizer.post_processing = post.handle
        return training

    # ---- auditing -----------------------------------------------------------------------------------------

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
        mechanism's own (extra, auditor-side keys are dropped: `audit_options`).
        """
        import torch  # lazy: heavy (torch)

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
        return torch.cat(released, dim=1).numpy()

    def audit_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The subset of `options` this mechanism declares (audits pass extra, auditor-side keys)."""
        known = {f.name for f in dataclasses.fields(self.Options)}
        return {k: v for k, v in options.items() if k in known}

    def claimed_step_tradeoff(self, sigma: float, **options: Any) -> TradeOff | None:
        """Hook: what the claim says about ONE un-subsampled step at `sigma`, as a trade-off curve (None: it
        claims nothing). The audit calls the claim violated when an attack beats this curve.

        By default: a mechanism that claims what its parts certify (no `claim` of its own) claims the Gaussian
        curve of the step's parts, all releases together (G_mu, mu = 1 / their combined multiplier; G_{1/sigma}
        for DP-SGD); one with its own `claim` claims the privacy profile its plan gives for one step
        (`auditing.profile.claimed_profile`). Override it where the paper states a closed form."""
        from mechanisms.auditing import profile, tradeoff  # lazy: keeps import mechanisms light

        if not self.private:
            return None
        if type(self).claim is not Mechanism.claim:
            return profile.claimed_profile(self, sigma, options=options)
        parts = self.audit_parts(sigma, 1.0, 1, self.audit_options(options), batch_size=options.get("batch_size"))
        multiplier = parts.noise_multiplier(sigma)
        return tradeoff.Gaussian(mu=math.inf if multiplier == 0 else 1.0 / multiplier)

    def audit_cases(self, dim: int, clip: float, rng: np.random.Generator, **options: Any) -> list[AuditCase]:
        """Hook: worst-case neighbouring inputs beyond the Dirac canary every mechanism gets (`auditing/cases.py`).

        Each case's two sides must be valid clipped sums (norm <= clip per example) that differ in one
        example, so a bound found on them is a bound on the mechanism. None by default."""
        return []


def clipping_for(clipping: str, clip: float, n_tensors: int | None, owner: str) -> FlatClipping | PerLayerClipping:
    """Flat clipping at C, or per-layer clipping splitting C over the model's tensors (same example bound)."""
    if clipping not in CLIPPING_RULES:
        raise ValueError(f"{owner} clipping must be one of {', '.join(CLIPPINGS)}, got {clipping!r}")
    if clipping == "flat":
        return FlatClipping(clip)
    if n_tensors is None:
        raise ValueError(f"{owner} per-layer clipping needs the model's number of parameter tensors (n_tensors)")
    return PerLayerClipping.splitting(clip, n_tensors)


__all__ = ["CLIPPINGS", "FINAL", "HOOKS", "AfterStepPart", "Calibrated", "Claim", "Hook", "Mechanism", "NoOptions",
           "clipping_for", "filled_hooks", "uncertified"]
