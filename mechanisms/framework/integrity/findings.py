"""The vocabulary of the integrity checks: what each check verifies (`CHECKS`), a check's outcome (`Finding`), and
how findings become a record's fields and a trial's verdict. It decides nothing itself: the checks live in
`guard` (measured while the step runs) and `verdict` (judged from the outside), and `trust` says whose code is
whose."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

# check name -> what it verifies (the record's `integrity_checks` keys; docs/plugins.md shows this table)
CHECKS: dict[str, str] = {
    "contract": "the mechanism runs privbench's template methods on privbench's Parts (no override of a method "
                "privbench runs itself)",
    "step_code": "the private step's code (optimizer, clipping engine, noise and release parts) is privbench's, "
                 "Opacus' or torch's, before the first step and after the last",
    "hooks": "the mechanism's hooks keep their contract (after_step returns nothing; update_state returns only "
             "entries of the state)",
    "clip_range": "the clip bound in force stays in the clipper's declared range at every step (a state that "
                  "leaves it is clamped, and the clamp recorded)",
    "plan_parameters": "the clipping engine's and the optimizer's bounds, the noise part, sigma and the batch "
                       "normalisation stay the plan's at every step",
    "noise_stream": "the noise comes from privbench's generator and its stream continues from step to step "
                    "(no reseed, no rewind, no other draw in between)",
    "observers": "only privbench's own release observers see the releases",
    "model_update": "the parameters change only by the optimizer's update from the released (noised) gradient: "
                    "a shadow recomputes it on random coordinates of every tensor",
    "row_independence": "changing one example of a real batch moves no other example's output or per-example "
                        "gradient through the model and the loss (measured before training and on a few random "
                        "steps; a dependence names the first module where the rows mix)",
    "model_state": "the model's state that the optimizer does not train (buffers such as running statistics, frozen "
                   "parameters) stays as it was: checked on random coordinates after every step and whole after "
                   "training",
    "state_replay": "the state trajectory, recomputed from the recorded releases alone by a fresh mechanism in "
                    "another process, equals the one training used",
    # the neighbouring-data checks of the plan-time code (workers/neighbours.py): run again on a neighbouring
    # training set (one record replaced, N kept), before training
    "neighbour_plan": "the plan, the claim with its extras and the privacy spec are identical on a neighbouring "
                      "training set (the mechanism's plan hooks and anything they load through privbench)",
    "neighbour_model": "the model's initial state under the trial's seed (every parameter, buffer and tensor) and "
                       "what its builder records are identical on a neighbouring training set",
    "neighbour_rows": "the dataset's per-record transform, run by privbench on a neighbouring training set, "
                      "changes only the replaced record's rows (its unit's, when the dataset declares units); a "
                      "loader without one is not checked, and not certified",
    "row_measures": "the training rows hold no copies or one-pixel shifts of another record's rows, and no "
                    "standardisation fitted on the training split (mean 0 and standard deviation 1 exactly)",
}



@dataclasses.dataclass(frozen=True)
class Finding:
    """The outcome of one check: its name (a key of CHECKS, or an audit's), whether it passed, and, when it
    failed (or could not run), why, in words a researcher understands."""

    check: str
    passed: bool
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "passed": self.passed, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        return cls(str(data["check"]), bool(data["passed"]), str(data.get("reason") or ""))


def certify(findings: Iterable[Finding]) -> str | None:
    """What stops the run from being certified, in words (None: nothing; every check passed)."""
    failed = [f"{f.check}: {f.reason}" for f in findings if not f.passed]
    return "; ".join(failed) if failed else None


def record_fields(findings: Iterable[Finding]) -> dict[str, Any]:
    """The record's integrity fields (storage/schema.py declares them): every check run and whether it passed,
    and each failure's reason."""
    findings = list(findings)
    checks: dict[str, bool] = {}
    for f in findings:
        checks[f.check] = checks.get(f.check, True) and f.passed
    return {"integrity_checks": checks, "integrity_failed": [f"{f.check}: {f.reason}" for f in findings
                                                              if not f.passed]}


def unique(findings: Iterable[Finding]) -> list[Finding]:
    """`findings` without repeats, in their order: a finding is its check, verdict and reason (by identity, not
    by a substring of another's words), so one reached by two phases counts once."""
    return list(dict.fromkeys(findings))


__all__ = ["CHECKS", "Finding", "certify", "record_fields", "unique"]
