"""The `Mechanism` base class: a mechanism is its options, its parts, and its own (claimed) analysis.

What a subclass writes:
- `Options`: a frozen dataclass of its grid options (parsed strictly by `mechanisms.options`);
- `parts(spec, options)`: the sampler, clipper and noise adder it runs (`mechanisms.plan.Parts`);
- optionally `claim(...)` / `claimed_sigma(...)`: the paper's own analysis, when it differs from the
  reference; and `after_step(...)`: post-processing run after each update.

What the base class derives, the same way for every mechanism: the certified event (from the parts), sigma
(explicit, or calibrated under the grid's `calibration`), epsilon_certified (PLD, always; RDP and PRV
recorded beside it), the private training objects (`make_private`, from the plan's parts), and the
one-step release the auditor tests (`privatize_step`: the noise part's own torch code).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from mechanisms import options as options_lib
from mechanisms.accountants import calibrate_sigma, epsilon
from mechanisms.clipping import FlatClipping, PerLayerClipping
from mechanisms.noise_addition import GaussianNoise, NoiseMap
from mechanisms.plan import Parts, PrivacyPlan, PrivacySpec, relation_name
from mechanisms.private_training import AfterStep, PrivateTraining, make_private

CLIPPINGS = ("flat", "per-layer")
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
    """Base class; subclasses are registered as instances (`mechanisms.register`)."""

    ID: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    AUDIT_COORDINATEWISE: ClassVar[bool] = True  # privatize_step treats coordinates independently
    private: ClassVar[bool] = True

    @property
    def summary(self) -> str:
        """One line for `privbench list mechanisms`: the first line of its module's docstring."""
        doc = sys.modules[type(self).__module__].__doc__ or type(self).__doc__ or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""

    # ---- options and parts ---------------------------------------------------------------------------

    def options(self, mapping: Mapping[str, Any] | None) -> Any:
        return options_lib.parse(self.Options, mapping, self.ID)

    def option_problems(self, mapping: Mapping[str, Any] | None) -> list[str]:
        return options_lib.problems(self.Options, mapping, self.ID)

    def parts(self, spec: PrivacySpec, options: Any) -> Parts | None:
        """DP-SGD's parts by default: the spec's sampler, flat clipping at C, Gaussian noise."""
        clipper = FlatClipping(spec.clip)
        return Parts(spec.batch_selection, clipper, GaussianNoise(clipper.bound))

    # ---- analysis -----------------------------------------------------------------------------------

    def claim(self, sigma: float, spec: PrivacySpec, options: Any, parts: Parts, certified: float | None) -> Claim:
        """The mechanism's own epsilon for `sigma`: by default the reference accountant's (nothing claimed
        beyond what is certified)."""
        return Claim(certified, "pld")

    def claimed_sigma(self, spec: PrivacySpec, options: Any, parts: Parts) -> float:
        """The sigma the paper's analysis picks for the target: by default the certified one."""
        return self.certified_sigma(spec, parts)

    def certified_sigma(self, spec: PrivacySpec, parts: Parts) -> float:
        if parts.noise_multiplier(1.0) == 0:
            raise ValueError(f"{self.ID}: this configuration leaves a direction without noise, so no sigma "
                             "reaches a finite certified epsilon (calibration: certified cannot apply)")
        return calibrate_sigma(parts, spec.epsilon, spec.delta, spec.accountant).sigma

    def plan(self, spec: PrivacySpec) -> PrivacyPlan:
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
        """Post-processing after each update; none by default."""
        return AfterStepPart()

    def make_private(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Any, plan: PrivacyPlan, *,
                     criterion: Any, generator: torch.Generator, grad_sample_mode: str = "hooks",
                     noise_generator: torch.Generator | None = None, secure_mode: bool = False) -> PrivateTraining:
        """Wrap like Opacus' `make_private`, every part from the plan. `generator` drives batch selection
        and post-processing, `noise_generator` the noise (both derived from the trial seed by the worker)."""
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
        spec = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=1, batch_size=1, epochs=1, clip=clip,
                           sigma=sigma, options=options, model_dim=dim, n_tensors=1)
        parts = self.parts(spec, self.options(options))
        if parts is None:
            raise ValueError(f"{self.ID} adds no noise to audit")
        return parts

    def privatize_step(self, sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator,
                       **options: Any) -> np.ndarray:
        """One release per row of clipped-gradient sums, through the noise part training runs."""
        rows = np.atleast_2d(np.asarray(sums, dtype=np.float64))
        parts = self.audit_parts(sigma, clip, rows.shape[1], self.audit_options(options))
        generator = torch.Generator().manual_seed(int(rng.integers(0, 2**63 - 1)))
        released = parts.noise.release([torch.from_numpy(rows)], sigma, generator)
        return released[0].numpy()

    def audit_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The subset of `options` this mechanism declares (audits pass extra, auditor-side keys)."""
        known = {f.name for f in dataclasses.fields(self.Options)}
        return {k: v for k, v in options.items() if k in known}

    def claimed_step_tradeoff(self, sigma: float, **options: Any) -> Any:
        """What the claim says about one un-subsampled release: G_{1/sigma} for DP-SGD's Gaussian."""
        from mechanisms.auditing import tradeoff

        return tradeoff.Gaussian(mu=1.0 / sigma)


def clipping_for(clipping: str, clip: float, n_tensors: int | None, owner: str) -> FlatClipping | PerLayerClipping:
    """Flat clipping at C, or per-layer clipping splitting C over the model's tensors (same example bound)."""
    if clipping == "flat":
        return FlatClipping(clip)
    if n_tensors is None:
        raise ValueError(f"{owner} per-layer clipping needs the model's number of parameter tensors (n_tensors)")
    return PerLayerClipping.splitting(clip, n_tensors)


__all__ = ["CLIPPINGS", "AfterStepPart", "Claim", "Mechanism", "NoOptions", "clipping_for"]
