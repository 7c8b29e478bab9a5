"""Privacy auditing: empirical lower bounds that can prove a privacy claim false.

- `tradeoff`: claims as curves (G_mu, f_{eps,delta}), Eq. 45, GDP conversions.
- `canary`: `CanaryScoreAuditor`, scores in, estimates out (mirrors jax_privacy's auditor).
- `one_run`: Steinke, Nasr & Jagielski (2023) and f-DP (Mahloujifar et al. 2024) one-run estimators.
- `white_box`: likelihood-ratio scores of gradient canaries, planned guesses, the ceiling, simulation.
- `step_audit`: `audit_step`, the mechanism-level audit behind `privbench audit`.
- `dirac_canaries`: `DiracCanaries`, white-box gradient canaries inside an Opacus training run.
- `hooks`: what a mechanism module provides to be audited (`claimed_step_tradeoff`, `audit_cases`,
  `Mechanism.audit_coordinatewise`).

NumPy/SciPy only (torch is imported by `dirac_canaries` when it is attached to an optimizer).
"""

from mechanisms.auditing.canary import (
    Bonferroni,
    CanaryScoreAuditor,
    CanaryScores,
    Explicit,
    Split,
    epsilon_lower_bound,
)
from mechanisms.auditing.cases import AuditCase, dirac_case
from mechanisms.auditing.dirac_canaries import DiracCanaries, OneRunEstimate
from mechanisms.auditing.profile import step_spec
from mechanisms.auditing.step_audit import StepAudit, audit_step
from mechanisms.auditing.tradeoff import ApproxDP, Envelope, Gaussian, TradeOff

__all__ = [
    "ApproxDP", "AuditCase", "Bonferroni", "CanaryScoreAuditor", "CanaryScores", "DiracCanaries",
    "Envelope", "Explicit", "Gaussian", "OneRunEstimate", "Split", "StepAudit", "TradeOff", "audit_step",
    "dirac_case", "epsilon_lower_bound", "step_spec",
]
