"""The mechanism contract: a mechanism is its options, its parts, and its own (claimed) analysis.

Every hook the planner (`plan`), the trainer (`make_private`) and the auditor (`privatize_step`,
`claimed_step_tradeoff`, `audit_cases`, `audit_coordinatewise`) use is declared here, with the guarantee it
must keep; `private` says whether the mechanism claims any privacy. A subclass writes:
- `ID` (the grid's name) and `Options`: a frozen dataclass of its grid options (parsed strictly by
  `mechanisms.options`);
- `parts(spec, options)`: the sampler, clipper and noise adder it runs (`mechanisms.parts.plan.Parts`);
- optionally `claim(...)` / `claimed_sigma(...)`: the paper's own analysis, when it differs from the
  reference; `after_step(...)`: post-processing run after each update; `audit_cases(...)`; and
  `claimed_step_tradeoff(...)` when the claim is not the reference accountant's.

What the base class derives, the same way for every mechanism: the certified event (from the parts), sigma
(explicit, or calibrated under the grid's `calibration`), epsilon_certified (PLD, always; RDP and PRV
recorded beside it), the private training objects (`make_private`, from the plan's parts), and the
one-step release the auditor tests (`privatize_step`: the noise part's own torch code).

Import-light: a mechanism's descriptor (ID, Options, `private`, its module's docstring) loads without
torch, Opacus or scipy (`privbench list`, grid validation); the heavy code is imported inside the hooks.
Mechanisms are found through the `privbench.mechanisms` entry points (`mechanisms.registry`).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from mechanisms import options as options_lib
from mechanisms.parts.clipping import CLIPPINGS as CLIPPING_RULES
from mechanisms.parts.clipping import FlatClipping, PerLayerClipping

if TYPE_CHECKING:
    import torch

    from mechanisms.auditing.cases import AuditCase
    from mechanisms.auditing.tradeoff import TradeOff
    from mechanisms.parts.noise_addition import NoiseMap
    from mechanisms.parts.plan import Parts, PrivacyPlan, PrivacySpec
    from mechanisms.private_training import AfterStep, PrivateTraining

CLIPPINGS = tuple(CLIPPING_RULES)  # the `clipping` option's values: flat, per-layer
BESIDE = ("rdp", "prv")  # accountants recorded next to the certified (PLD) epsilon


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
class AfterStepPart:
    """Post-processing after each update (`after_step(optimizer)`), and how it maps noise drawn in a
    canonical frame to the current one (`noise_map`), if it does."""

    after_step: AfterStep | None = None
    noise_map_for: Any = None  # (params) -> NoiseMap
    handle: Any = None  # kept on the optimizer as `optimizer.post_processing` (e.g. a Shuffler)


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
    #: `tensor_sizes` (summing to the row length).
    audit_per_tensor: ClassVar[bool] = False

    @property
    def description(self) -> str:
        """What `privbench list mechanisms` shows: the first paragraph of the class' own docstring, else of
        its module's (one mechanism per module, as the built-ins)."""
        module = sys.modules.get(type(self).__module__)
        doc = type(self).__dict__.get("__doc__") or (module.__doc__ if module else None) or ""
        return " ".join(doc.strip().split("\n\n")[0].split())

    # ---- options and parts ---------------------------------------------------------------------------

    def options(self, mapping: Mapping[str, Any] | None) -> Any:
        """The grid's `mechanism_options[ID]` as a frozen `Options`; raises ValueError listing every problem."""
        return options_lib.parse(self.Options, mapping, self.ID)

    def option_problems(self, mapping: Mapping[str, Any] | None) -> list[str]:
        """Every problem with the options, one per line (empty when they are valid); never raises."""
        return options_lib.problems(self.Options, mapping, self.ID)

    def parts(self, spec: PrivacySpec, options: Any) -> Parts | None:
        """The parts one private step is made of, each stating its guarantee (None: nothing private runs).

        Guarantee: training runs exactly these parts (`make_private` builds the loader, clipper and noise
        from them), so the event they add up to (`Parts.dp_event`) is the run's certified event.
        DP-SGD's parts by default: the spec's sampler, flat clipping at C, Gaussian noise.
        """
        from mechanisms.parts.noise_addition import GaussianNoise
        from mechanisms.parts.plan import Parts

        clipper = FlatClipping(spec.clip)
        return Parts(spec.batch_selection, clipper, GaussianNoise(clipper.bound))

    # ---- analysis -----------------------------------------------------------------------------------

    def claim(self, sigma: float, spec: PrivacySpec, options: Any, parts: Parts, certified: float | None) -> Claim:
        """The mechanism's own epsilon for `sigma`: by default the reference accountant's (nothing claimed
        beyond what is certified). A claim is the paper's number, not a bound: the audit tests it."""
        return Claim(certified, "pld")

    def claimed_sigma(self, spec: PrivacySpec, options: Any, parts: Parts) -> float:
        """The sigma the paper's analysis picks for the target: by default the certified one."""
        return self.certified_sigma(spec, parts)

    def certified_sigma(self, spec: PrivacySpec, parts: Parts) -> float:
        """The smallest sigma (on the calibration grid) whose certified epsilon is <= the target."""
        from mechanisms.accountants import calibrate_sigma

        if parts.noise_multiplier(1.0) == 0:
            raise ValueError(f"{self.ID}: this configuration leaves a direction without noise, so no sigma "
                             "reaches a finite certified epsilon (calibration: certified cannot apply)")
        return calibrate_sigma(parts, spec.epsilon, spec.delta, spec.accountant).sigma

    def plan(self, spec: PrivacySpec) -> PrivacyPlan:
        """What runs and what it is worth: parts, sigma, the certified event and the three epsilons.

        Guarantee: `epsilon_certified` is a sound upper bound (PLD) for the event of the parts that
        `make_private` runs at `sigma`; `epsilon_claimed` is the mechanism's own analysis (`claim`).
        """
        options = self.options(spec.options)
        parts = self.parts(spec, options)
        if parts is None:
            raise ValueError(f"{self.ID} has no private parts to plan")
        if spec.sigma is not None:
            sigma = spec.sigma
        elif spec.epsilon is None:
            raise ValueError(f"{self.ID} needs a target epsilon or an explicit sigma")
        elif spec.calibration == "claimed":
            sigma = self.claimed_sigma(spec, options, parts)
        else:
            sigma = self.certified_sigma(spec, parts)
        return self.assemble(spec, options, parts, sigma)

    def assemble(self, spec: PrivacySpec, options: Any, parts: Parts, sigma: float) -> PrivacyPlan:
        """The plan of `parts` at `sigma`: the event they add up to, its epsilons, and the claim."""
        from mechanisms.accountants import epsilon
        from mechanisms.parts.plan import PrivacyPlan, relation_name

        event = parts.dp_event(sigma)
        epsilons = {name: epsilon(event, spec.delta, name, parts.accounting_relation) for name in ("pld", *BESIDE)}
        certified = epsilons["pld"]
        claim = self.claim(sigma, spec, options, parts, certified)
        notes = claim.notes
        if certified is not None and math.isinf(certified) and not notes:
            notes = "the noise leaves a direction unprotected: no finite epsilon holds"
        return PrivacyPlan(
            mechanism=self.ID, sigma=float(sigma), sample_rate=parts.sampler.sample_rate, steps=parts.sampler.steps,
            delta=spec.delta, sampler=parts.sampler.name, accountant=spec.accountant, claimed_by=claim.by,
            epsilon_claimed=claim.epsilon, epsilon_certified=certified, effective_event=event, notes=notes,
            extra={"options": dataclasses.asdict(options), **claim.extra}, parts=parts,
            neighboring_relation=relation_name(parts.neighboring_relation), epsilons=epsilons,
        )

    # ---- training -------------------------------------------------------------------------------------

    def after_step(self, module: torch.nn.Module, plan: PrivacyPlan, options: Any,
                   generator: torch.Generator) -> AfterStepPart:
        """Post-processing after each update (it must not read the data: it costs and earns no privacy);
        none by default."""
        return AfterStepPart()

    def make_private(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Any, plan: PrivacyPlan, *,
                     criterion: Any, generator: torch.Generator, grad_sample_mode: str = "hooks",
                     noise_generator: torch.Generator | None = None, secure_mode: bool = False) -> PrivateTraining:
        """Wrap like Opacus' `make_private`, every part from the plan.

        Guarantee: the loader, clipping and noise that run are `plan.parts` (the accounted process is the
        executed one). `generator` drives batch selection and post-processing, `noise_generator` the noise
        (both derived from the trial seed by the worker).
        """
        from mechanisms.private_training import make_private

        if plan.mechanism != self.ID:
            raise ValueError(f"{self.ID}.make_private got a plan for {plan.mechanism!r}")
        post = self.after_step(module, plan, self.options(plan.extra.get("options", {})), generator)
        params = [p for p in module.parameters() if p.requires_grad]
        noise_map: NoiseMap | None = post.noise_map_for(params) if post.noise_map_for is not None else None
        training = make_private(module, optimizer, data, plan, criterion=criterion, generator=generator,
                                grad_sample_mode=grad_sample_mode, noise_generator=noise_generator,
                                secure_mode=secure_mode, after_step=post.after_step, noise_map=noise_map)
        training.optimizer.post_processing = post.handle
        return training

    # ---- auditing ---------------------------------------------------------------------------------------

    def audit_parts(self, sigma: float, clip: float, dim: int, options: Mapping[str, Any]) -> Parts:
        """The parts of one un-subsampled release of a `dim`-coordinate vector (for the one-step audit)."""
        from mechanisms.parts.plan import PrivacySpec

        spec = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=1, batch_size=1, epochs=1, clip=clip,
                           sigma=sigma, options=options, model_dim=dim, n_tensors=1)
        parts = self.parts(spec, self.options(options))
        if parts is None:
            raise ValueError(f"{self.ID} adds no noise to audit")
        return parts

    def privatize_step(self, sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator,
                       **options: Any) -> np.ndarray:
        """The audit release: one privatised step per row of clipped-gradient sums (rows have norm <= clip).

        Guarantee: the same code and law as one training step's release (the noise part's own `release`),
        so what the auditor measures is what training does. `options` are the mechanism's own (extra,
        auditor-side keys are allowed: `audit_options` keeps the declared ones).
        """
        import torch

        rows = np.atleast_2d(np.asarray(sums, dtype=np.float64))
        parts = self.audit_parts(sigma, clip, rows.shape[1], self.audit_options(options))
        generator = torch.Generator().manual_seed(int(rng.integers(0, 2**63 - 1)))
        released = parts.noise.release([torch.from_numpy(rows)], sigma, generator)
        return released[0].numpy()

    def audit_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The subset of `options` this mechanism declares (audits pass extra, auditor-side keys)."""
        known = {f.name for f in dataclasses.fields(self.Options)}
        return {k: v for k, v in options.items() if k in known}

    def claimed_step_tradeoff(self, sigma: float, **options: Any) -> TradeOff | None:
        """What the claim says about ONE un-subsampled release with sensitivity `clip` at `sigma`, as a
        trade-off curve (None: it claims nothing). The audit calls the claim violated when an attack beats
        this curve. DP-SGD's Gaussian: G_{1/sigma}."""
        from mechanisms.auditing import tradeoff

        return tradeoff.Gaussian(mu=1.0 / sigma)

    def audit_cases(self, dim: int, clip: float, rng: np.random.Generator, **options: Any) -> list[AuditCase]:
        """Worst-case neighbouring inputs beyond the Dirac canary every mechanism gets (`auditing/cases.py`).

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


__all__ = ["CLIPPINGS", "AfterStepPart", "Claim", "Mechanism", "NoOptions", "clipping_for"]
