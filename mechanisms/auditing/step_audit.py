"""The mechanism-level audit: one privatisation step, two neighbouring inputs, many samples per side.

Protocol (per case): split each side's scores in halves; on the first half pick up to three
thresholds, the one maximising the Eq. 45 epsilon, the one maximising mu, and the one furthest
below the claimed curve; on the second half bound each threshold's (alpha, beta) from above with
Clopper-Pearson. Bonferroni over every bound of every case makes all statements hold together at
1 - significance (`SIGNIFICANCE`, 0.1%, unless the caller says otherwise), so

- `epsilon_audited` (max Eq. 45 over evaluated points, at the delta in use) is a lower bound on
  the step's epsilon at that delta,
- `mu_audited` (max Phi^-1(1 - alpha_ub) - Phi^-1(beta_ub)) is a lower bound on its GDP mu,
- `violated` (some (alpha_ub, beta_ub) strictly below the claimed curve) is a refutation of the claim,

each wrong with probability at most `significance` together. A whole curve is compared, not one
epsilon: a point can lie below G_mu while its Eq. 45 epsilon is still below the claimed epsilon.

`p_value` is the smallest significance at which the same thresholds would refute the claim
(`violated` is exactly `p_value <= significance`): a correct mechanism gets p <= s with probability
at most s, so the p-values of many audits can be combined (Holm over a sweep: storage/verdicts.py).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mechanisms.auditing import hooks, tradeoff
from mechanisms.auditing.binomial import clopper_pearson_upper
from mechanisms.auditing.canary import CanaryScores, roc_counts
from mechanisms.auditing.cases import AuditCase
from mechanisms.auditing.sampling import choose_path, sample_scores
from mechanisms.framework.claims import AUDIT_SIGNIFICANCE, claim_status

if TYPE_CHECKING:
    from mechanisms.framework.mechanism import Mechanism
    from mechanisms.parts.plan import PrivacySpec

SIGNIFICANCE = AUDIT_SIGNIFICANCE  # 0.1%: privbench's one audit significance (mechanisms/framework/claims.py says why)
ROLES = ("epsilon", "mu", "claim")


@dataclasses.dataclass(frozen=True)
class Point:
    """One threshold evaluated on held-out samples."""

    role: str  # what it was chosen for on the first half
    threshold: float
    alpha: float  # held-out point estimates
    beta: float
    alpha_ub: float  # Clopper-Pearson upper bounds
    beta_ub: float
    epsilon: float  # Eq. 45 at (alpha_ub, beta_ub)
    mu: float
    below_claim: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaseResult:
    case: str
    path: str
    samples: int  # per side
    epsilon_audited: float
    mu_audited: float
    violated: bool
    points: tuple[Point, ...]
    p_value: float = 1.0  # of this case alone, Bonferroni over its points' bounds (see `claim_p_value`)

    def as_record(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "points"},
                "points": [dataclasses.asdict(p) for p in self.points]}


def _bounds(held_in: np.ndarray, held_out: np.ndarray, thresholds: np.ndarray,
            significance: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    fp = held_out.size - np.searchsorted(np.sort(held_out), thresholds, side="left")
    fn = np.searchsorted(np.sort(held_in), thresholds, side="left")
    return (fp / held_out.size, fn / held_in.size, clopper_pearson_upper(fp, held_out.size, significance),
            clopper_pearson_upper(fn, held_in.size, significance))


def _below_at(claim: tradeoff.TradeOff, fp: int, n_out: int, fn: int, n_in: int, s: float) -> bool:
    alpha_ub, beta_ub = clopper_pearson_upper(fp, n_out, s), clopper_pearson_upper(fn, n_in, s)
    return bool(tradeoff.lies_below(claim, alpha_ub, beta_ub))


def claim_p_value(claim: tradeoff.TradeOff, fp: int, n_out: int, fn: int, n_in: int, known: float,
                  floor: float = 1e-300, rel_tol: float = 1e-3) -> float:
    """The smallest per-bound significance s at which one held-out point lies below the claimed curve.

    Below at s means Clopper-Pearson upper bounds at s on both error rates lie strictly under the curve;
    the bounds shrink as s grows and the curve is non-increasing, so "below at s" is monotone in s and a
    bisection (on log s) finds the threshold. If the claim holds, being below at s needs one of the two
    bounds to fail, probability <= 2 s: 2 s* is a p-value of the point. `known` is the significance the
    audit already used (its verdict), so the bracket starts there and the result agrees with the verdict
    exactly; the rejected end of the bracket is returned (never below the true threshold). 0.5 when the
    point is not below even at s = 0.5 (no evidence), `floor` when it is below there already.
    """
    lo, hi = (floor, known) if _below_at(claim, fp, n_out, fn, n_in, known) else (known, 0.5)
    if hi == 0.5 and not _below_at(claim, fp, n_out, fn, n_in, hi):
        return 0.5
    if lo == floor and _below_at(claim, fp, n_out, fn, n_in, floor):
        return floor
    while math.log(hi / lo) > rel_tol:
        mid = math.exp((math.log(lo) + math.log(hi)) / 2)  # lo * hi underflows near the floor
        if _below_at(claim, fp, n_out, fn, n_in, mid):
            hi = mid
        else:
            lo = mid
    return hi


def held_out_test(scores: CanaryScores, *, delta: float, claim: tradeoff.TradeOff | None,
                  significance_per_bound: float, rng: np.random.Generator, case: str = "case",
                  path: str = "full", bounds: int = 2 * len(ROLES)) -> CaseResult:
    """Choose thresholds on one half of each side, bound their error rates on the other half.

    `significance_per_bound` is the failure probability of each one-sided Clopper-Pearson bound;
    the caller divides its budget by the number of bounds (2 per point, `len(ROLES)` points per case),
    and passes that number as `bounds`: the case's p-value is `bounds` times the smallest per-bound
    significance at which a point lies below the claim (capped at 1).
    """
    split = []
    for side in (scores.held_in, scores.held_out):
        perm = rng.permutation(side.size)
        split.append((side[perm[: side.size // 2]], side[perm[side.size // 2:]]))
    (in_1, in_2), (out_1, out_2) = split
    if min(in_1.size, in_2.size, out_1.size, out_2.size) < 1:
        raise ValueError("need at least 2 scores per side")

    thresholds, _, _ = roc_counts(in_1, out_1)
    _, _, a_ub, b_ub = _bounds(in_1, out_1, thresholds, significance_per_bound)
    pick = {"epsilon": int(np.argmax(tradeoff.epsilon_from_errors(a_ub, b_ub, delta))),
            "mu": int(np.argmax(tradeoff.mu_from_errors(a_ub, b_ub)))}
    if claim is not None:
        pick["claim"] = int(np.argmax(claim(a_ub) - b_ub))

    chosen = np.array([thresholds[i] for i in pick.values()])
    a, b, a2, b2 = _bounds(in_2, out_2, chosen, significance_per_bound)
    eps = tradeoff.epsilon_from_errors(a2, b2, delta)
    mu = tradeoff.mu_from_errors(a2, b2)
    below = tradeoff.lies_below(claim, a2, b2) if claim is not None else np.zeros(len(chosen), bool)
    p_value = 1.0
    if claim is not None:
        n_out, n_in = out_2.size, in_2.size
        s_star = min(claim_p_value(claim, int(round(a[k] * n_out)), n_out, int(round(b[k] * n_in)), n_in,
                                   significance_per_bound) for k in range(len(chosen)))
        p_value = min(1.0, bounds * s_star)
    points = tuple(Point(role, float(chosen[k]), float(a[k]), float(b[k]), float(a2[k]), float(b2[k]),
                         float(eps[k]), float(mu[k]), bool(below[k])) for k, role in enumerate(pick))
    return CaseResult(case=case, path=path, samples=min(scores.held_in.size, scores.held_out.size),
                      epsilon_audited=float(eps.max()), mu_audited=float(mu.max()),
                      violated=bool(below.any()), points=points, p_value=p_value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepAudit:
    """A mechanism-level audit. epsilon_claimed/certified are those of ONE un-subsampled step."""

    mechanism: str
    sigma: float
    clip: float
    delta: float
    dim: int
    samples: int  # per side and per case
    seed: int
    significance: float
    claimed_curve: str | None
    epsilon_claimed: float | None
    epsilon_certified: float | None
    epsilon_audited: float
    mu_claimed: float | None
    mu_audited: float
    violated: bool
    p_value: float  # of the verdict: violated == (p_value <= significance); 1.0 when there is no claim
    claim_status: str | None
    cases: tuple[CaseResult, ...]
    wall_s: float
    scope: str = "one privatisation step: sample_rate 1, steps 1, sensitivity clip"

    def as_record(self) -> dict[str, Any]:
        """JSON-ready (the audit's own keys first); non-finite numbers become None."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["cases"] = [c.as_record() for c in self.cases]
        return _finite(out)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def audit_step(module: Mechanism, setting: PrivacySpec, *, samples: int = 20_000, dim: int = 1_000, seed: int = 0,
               significance: float = SIGNIFICANCE, path: str = "auto", workers: int | None = None,
               cases: Sequence[AuditCase] | None = None) -> StepAudit:
    """Audit one step of `module`: claim, certificate and an empirical lower bound side by side.

    `setting` is the step's privacy setting (`profile.step_spec`: its sigma, delta, clip and the mechanism's
    options, auditor-side keys such as `tensor_sizes` among them), checked where it was made; it must have a
    sigma. `cases` overrides the mechanism's cases (Dirac + its `audit_cases` hook). `path`: `auto` uses
    the support-only path where it is exact (see sampling.py), `full` forces whole rows.
    """
    if setting.sigma is None:
        raise ValueError("the audited step needs a sigma; its setting has none (a target epsilon is planned first)")
    sigma, delta, clip, options = setting.sigma, setting.delta, setting.clip, dict(setting.options)
    if samples < 4:
        raise ValueError(f"samples must be >= 4, got {samples}")
    if not 0 < significance < 0.5:
        raise ValueError(f"significance must lie in (0, 0.5), got {significance}")
    start = time.perf_counter()
    plan = hooks.step_plan(module, dataclasses.replace(setting, epsilon=None))  # the step at its sigma
    claim = hooks.claimed_step_tradeoff(module, sigma, clip=clip, options=options)
    cases = list(cases) if cases is not None else list(hooks.audit_cases(module, dim, clip, seed, options, sigma))
    bounds = 2 * len(ROLES) * len(cases)
    per_bound = significance / bounds
    coordinatewise = module.audit_coordinatewise
    rng = np.random.default_rng([seed, 0x5117])
    results = []
    for i, case in enumerate(cases):
        case_path = choose_path(case, coordinatewise, path)
        scores = sample_scores(module, case, sigma=sigma, clip=clip, samples=samples, seed=seed,
                               case_index=i, path=case_path, workers=workers, options=options)
        results.append(held_out_test(scores, delta=delta, claim=claim, significance_per_bound=per_bound,
                                     rng=rng, case=case.name, path=case_path, bounds=bounds))
    eps_audited = max(r.epsilon_audited for r in results)
    violated = any(r.violated for r in results)
    p_value = min(r.p_value for r in results)
    if violated:  # the bisection starts at the bound used, so only rounding could put p a hair above it
        p_value = min(p_value, significance)
    eps_claimed = plan.epsilon_claimed
    mu_claimed = claim.mu if claim is not None and claim.mu is not None else (
        tradeoff.gaussian_mu(eps_claimed, delta) if eps_claimed is not None and math.isfinite(eps_claimed)
        else None)
    status = claim_status(eps_claimed, plan.epsilon_certified, eps_audited, audit_violated=violated,
                          private=module.private)
    return StepAudit(
        mechanism=module.ID, sigma=float(sigma), clip=float(clip), delta=float(delta), dim=int(cases[0].dim),
        samples=int(samples), seed=int(seed), significance=float(significance),
        claimed_curve=claim.label if claim is not None else None, epsilon_claimed=eps_claimed,
        epsilon_certified=plan.epsilon_certified, epsilon_audited=eps_audited, mu_claimed=mu_claimed,
        mu_audited=max(r.mu_audited for r in results), violated=violated,
        p_value=p_value, claim_status=status,
        cases=tuple(results), wall_s=time.perf_counter() - start,
    )
