"""Integrity: whether what ran is what privbench planned, accounted and audits, checked from the outside.

privbench trusts nothing a mechanism's code says about itself. Python cannot be sandboxed, so the contract
narrows what a mechanism's hooks can reach (they get copies of the released values, the state and the plan:
never the optimizer, the clipping engine, the model, the noise generator or the clipped sums), and the checks
here catch what gets past it. This package is the one place that answers "is this privbench's own, trusted
code?" (`trust`, its only definition) and "what stops this run from being certified?" (`verify`, the one entry
point a trial's verdict reads: every finding of every phase, once each). Its modules, each with one job:

- `findings`: the checks' names (`CHECKS`), their outcome (`Finding`: check, passed, reason in words), and the
  record's fields and verdict (`record_fields`, `certify`);
- `trust`: privbench's own code, and the code the private step may run;
- `guard`: what is measured while the step runs, on the device (`StepGuard`, `ModelShadow`, `StateWatch`,
  `StateTrace`);
- `model_checks`: whether rows stay independent through the model and the loss (a validator of known mixers,
  Opacus-style, with its `fix`, and a probe measured on the real model before training and on a few steps);
- `verdict`: what is judged from the outside (`contract_findings`, `plan_for`, `step_findings`, `replay_state`,
  `verify`). It stands above the mechanism contract and the private step (which run `guard`), so it is imported
  as `mechanisms.framework.integrity.verdict`, not from here.

A failed check makes the trial `uncertified`, never `ok`, and the record lists every check and every failure
(`integrity_checks`, `integrity_failed`). The audits (canaries, noise-scale and independence tests) add their
findings through the same type.

The checks, what each measures, and how (docs/plugins.md, "What privbench enforces"):
"""

from __future__ import annotations

from mechanisms.framework.integrity.findings import CHECKS, Finding, certify, record_fields, unique
from mechanisms.framework.integrity.guard import (
    SHADOW_COORDINATES,
    ModelShadow,
    StateTrace,
    StepGuard,
    apply_state,
    copied,
    decode,
    encode,
)
from mechanisms.framework.integrity.trust import OWN_PACKAGES, foreign_code, own_class, own_module, own_part, own_path

__doc__ += "\n".join(f"- `{name}`: {what}." for name, what in CHECKS.items()) + "\n"

__all__ = ["CHECKS", "OWN_PACKAGES", "SHADOW_COORDINATES", "Finding", "ModelShadow", "StateTrace", "StepGuard",
           "apply_state", "certify", "copied", "decode", "encode", "foreign_code", "own_class", "own_module",
           "own_part", "own_path", "record_fields", "unique"]
