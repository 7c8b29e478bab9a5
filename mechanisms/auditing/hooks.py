"""What the one-step audit asks of a mechanism, through the hooks `Mechanism` declares.

`claimed_step_tradeoff` (the claim for one un-subsampled step), `audit_cases` (worst-case neighbours beyond
the Dirac canary), `audit_coordinatewise` and `privatize_step` are `Mechanism` methods with their
guarantees stated there (mechanisms/framework/mechanism.py). This module adds what the auditor derives from them:
the mechanism's own plan for one step (cached, through the contract check: `integrity.verdict.plan_for`); the
claim rebuilt from a plan (`claimed_profile`) lives in `auditing.profile`, below the mechanism contract.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from dp_accounting import NeighboringRelation

from mechanisms.auditing import tradeoff
from mechanisms.auditing.cases import AuditCase, dirac_case
from mechanisms.auditing.profile import step_options, step_spec
from mechanisms.framework.integrity.verdict import plan_for
from mechanisms.parts.clipping import PerLayerClipping

if TYPE_CHECKING:
    from mechanisms.framework.mechanism import Mechanism
    from mechanisms.parts.plan import Parts, PrivacyPlan, PrivacySpec

def step_plan(mechanism: Mechanism, setting: PrivacySpec) -> PrivacyPlan:
    """The mechanism's own plan for the step `setting` states (`profile.step_spec`): claimed and certified
    epsilon, or sigma for its target epsilon.

    Only the options the mechanism declares reach its plan (audits pass auditor-side keys such as
    `tensor_sizes` to `privatize_step`); `batch_size` among them sets the step's batch (`step_spec`).

    Cached per (mechanism, numbers, options) when the options are hashable: a PLD accountant call
    costs ~0.2 s, far more than sampling and bounding a 20,000-sample audit.
    """
    batch, options, items = step_options(mechanism, setting.options)
    if items is None:
        return plan_for(mechanism, step_spec(setting.sigma, setting.delta, epsilon=setting.epsilon, clip=setting.clip,
                                             options=options, batch_size=batch))
    return _cached_plan(mechanism, setting.sigma, setting.delta, setting.epsilon, setting.clip, items, batch)


@functools.lru_cache(maxsize=256)
def _cached_plan(mechanism: Mechanism, sigma: float | None, delta: float, epsilon: float | None, clip: float,
                 items: tuple[tuple[str, Any], ...], batch_size: int | None = None) -> PrivacyPlan:
    return plan_for(mechanism, step_spec(sigma, delta, epsilon=epsilon, clip=clip, options=dict(items),
                                         batch_size=batch_size))


def claimed_step_tradeoff(mechanism: Mechanism, sigma: float, *, clip: float = 1.0,
                          options: Mapping[str, Any] | None = None) -> tradeoff.TradeOff | None:
    """The curve the mechanism claims for one step (its `claimed_step_tradeoff` hook)."""
    return mechanism.claimed_step_tradeoff(sigma, dict(options or {}))


def audit_cases(mechanism: Mechanism, dim: int, clip: float, seed: int,
                options: Mapping[str, Any] | None = None, sigma: float | None = None) -> Sequence[AuditCase]:
    """The Dirac case every mechanism gets, then the mechanism's own worst cases, in the step's release layout.

    With `sigma`, the cases are built from the mechanism's one-step parts: the Dirac canary has the norm the
    clipper allows (one spike per tensor under per-layer clipping, given `tensor_sizes` in the options),
    and a step with other releases (`Parts.releases`) gets their columns after the gradient's: the canary
    example moves each by its sensitivity, and the projection weighs each coordinate by the inverse of its
    noise variance, so that all releases are tested jointly with the likelihood-ratio statistic.
    """
    options = dict(options or {})
    rng = np.random.default_rng([seed, 0xCA5E])
    parts = None
    if sigma is not None and mechanism.private:
        parts = mechanism.audit_parts(sigma, clip, dim, mechanism.audit_options(options),
                                      tensor_sizes=options.get("tensor_sizes"), batch_size=options.get("batch_size"))
    norm, blocks = _gradient_canary(parts, clip, options.get("tensor_sizes"))
    cases = [dirac_case(dim, norm, rng, block_bounds=blocks)]
    cases.extend(mechanism.audit_cases(dim, clip, rng, options))
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise ValueError(f"audit case names must be unique, got {names}")
    if parts is not None and parts.releases:
        cases = [with_releases(case, parts, sigma) for case in cases]  # type: ignore[arg-type]
    return cases


def _gradient_canary(parts: Parts | None, clip: float, tensor_sizes: Sequence[int] | None,
                     ) -> tuple[float, tuple[tuple[int, float], ...] | None]:
    """(the canary's norm, the per-tensor bounds) for `dirac_case`: the clipper's largest bound."""
    if parts is None:
        return clip, None
    clipper = parts.clipper
    if isinstance(clipper, PerLayerClipping) and tensor_sizes and len(tensor_sizes) == len(clipper.clips):
        return clipper.bound, tuple(zip(tensor_sizes, clipper.clips, strict=True))
    return parts.audit_bound, None


def with_releases(case: AuditCase, parts: Parts, sigma: float) -> AuditCase:
    """`case` over the step's whole release layout: the gradient's columns, then each other release's (base 0,
    moved by its add-or-remove sensitivity by the canary example), weighted by inverse noise variances."""
    gradient_std = sigma * getattr(parts.noise, "std_per_sigma", 1.0)
    canary, base, weights = [case.canary], [case.base], [np.full(case.dim, 1.0 / gradient_std**2)]
    for release in parts.releases:
        step = release.sensitivity(NeighboringRelation.ADD_OR_REMOVE_ONE) / np.sqrt(release.width)
        canary.append(np.full(release.width, step))
        base.append(np.zeros(release.width))
        weights.append(np.full(release.width, 1.0 / release.noise_std(sigma) ** 2))
    statistic = case.statistic
    if statistic is not None:  # a mechanism's own statistic reads the gradient's columns
        statistic = _on_columns(statistic, case.dim)
    return dataclasses.replace(case, canary=np.concatenate(canary), base=np.concatenate(base), statistic=statistic,
                               layout=(case.dim, *(r.width for r in parts.releases)), weights=np.concatenate(weights))


def _on_columns(statistic: Any, width: int) -> Any:
    return lambda released: statistic(np.asarray(released)[:, :width])
