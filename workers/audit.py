"""The audits a trial runs (grid key `audit`), turned into the privacy fields of its result record.

Two audits answer two different questions, so their numbers are kept apart:
- `step`: the mechanism-level audit of ONE un-subsampled privatisation step at the trial's sigma. Its
  verdict (a measured error pair strictly below the claimed one-step curve) falsifies the per-step claim
  a paper's analysis is built on, so it can make the trial `violated`. Its epsilon is NOT a lower bound
  on the whole run's epsilon (subsampling and composition change the threat model), so it is reported as
  `epsilon_audited_step` and never compared with the run-level claim.
- `one-run`: Steinke, Nasr & Jagielski (2023) Dirac gradient canaries inside the real training run; its
  bound is a run-level lower bound and fills `epsilon_audited`.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

MODES = ("step", "one-run", "both", "off")


@dataclasses.dataclass(frozen=True)
class AuditConfig:
    mode: str = "step"
    samples: int = 20_000
    dim: int = 1_000
    canaries: int = 1_000
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"audit mode must be one of {MODES}, got {self.mode!r}")
        if self.samples < 4 or self.dim < 1 or self.canaries < 1:
            raise ValueError("audit samples must be >= 4, dim and canaries >= 1")

    @property
    def step(self) -> bool:
        return self.enabled and self.mode in ("step", "both")

    @property
    def one_run(self) -> bool:
        return self.enabled and self.mode in ("one-run", "both")


def step_audit(mechanism: ModuleType, plan: Any, clip: float, cfg: AuditConfig, options: dict[str, Any],
               seed: int, workers: int) -> dict[str, Any]:
    """Fields for the record; empty when the mechanism has no noise to audit."""
    if plan.sigma is None or not hasattr(mechanism, "privatize_step"):
        return {}
    from mechanisms.auditing import audit_step

    audit = audit_step(mechanism, plan.sigma, samples=cfg.samples, delta=plan.delta, dim=cfg.dim, clip=clip,
                       seed=seed, workers=workers, options=options)
    return {"epsilon_audited_step": audit.epsilon_audited, "mu_audited": audit.mu_audited,
            "mu_claimed": audit.mu_claimed, "audit_step_violated": audit.violated,
            "audit_step_curve": audit.claimed_curve, "audit_step_s": audit.wall_s}


class OneRun:
    """Attach Dirac canaries to the private optimizer (if it is an Opacus one), estimate afterwards."""

    def __init__(self, cfg: AuditConfig, sample_rate: float, seed: int) -> None:
        self.cfg, self.sample_rate, self.seed = cfg, sample_rate, seed
        self.canaries: Any = None
        self.skipped: str | None = None

    def attach(self, optimizer: Any) -> None:
        if not hasattr(optimizer, "summed_grad_fields") and not hasattr(optimizer, "add_noise"):
            self.skipped = "the mechanism has no Opacus private optimizer to carry gradient canaries"
            return
        from mechanisms.auditing import DiracCanaries

        n_params = sum(p.numel() for p in optimizer.params)
        self.canaries = DiracCanaries.attach_to(optimizer, min(self.cfg.canaries, n_params),
                                                sample_rate=self.sample_rate, seed=self.seed)

    def fields(self, delta: float) -> dict[str, Any]:
        if self.canaries is None:
            return {"audit_one_run_skipped": self.skipped} if self.skipped else {}
        estimate = self.canaries.estimate(delta)
        return {"epsilon_audited": estimate.epsilon, "audit_canaries": estimate.canaries,
                "audit_one_run_s": estimate.overhead_s}
