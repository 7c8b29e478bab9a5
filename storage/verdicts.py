"""A sweep's audit verdicts, corrected together: Holm's step-down procedure over its step audits' p-values.

Each trial's step audit is a test of "the mechanism's one-step claim holds" at privbench's audit
significance (`audit_step_significance` in the record, 0.1% by default). Over a sweep of 100 trials of a
correct mechanism, 100 such tests call one `violated` with probability up to 10%. Holm (1979) keeps the
probability that ANY audit of the sweep calls a correct claim violated (the family-wise error) at that
same significance, whatever the dependence between the audits, and refutes no fewer claims than
Bonferroni. The trial's own record keeps its single-test verdict (`claim_status`); the leaderboard and
report show the sweep's (`sweep_claim_statuses`).

A leaf module: no privbench or third-party import, so the dashboards (which import only `storage`) use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the order given: reject hypothesis i at family-wise rate a iff adjusted[i] <= a.

    Sorted ascending, p_(j) is multiplied by (m - j + 1) and the running maximum taken (step-down), capped at 1.
    """
    m = len(p_values)
    for p in p_values:
        if not 0 <= p <= 1:
            raise ValueError(f"a p-value lies in [0, 1], got {p}")
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def sweep_claim_statuses(records: Sequence[Mapping[str, Any]]) -> list[str | None]:
    """Each record's claim status with its step-audit verdict taken from Holm over its sweep's audits.

    A record whose privacy section has `audit_step_p_value` (and `claim_status_without_step`, the verdict
    of everything but the step audit) is `violated` when its Holm-adjusted p-value is at most the sweep's
    significance (the smallest `audit_step_significance` among its audits), else it keeps the rest's
    verdict. Holm only raises p-values, so this can clear a single-test `violated`, never add one.
    Records without a p-value (no step audit, older stores) keep their `claim_status`.
    """
    statuses: list[str | None] = [(r.get("privacy") or {}).get("claim_status") for r in records]
    families: dict[Any, list[int]] = {}
    for i, r in enumerate(records):
        privacy = r.get("privacy") or {}
        if r.get("status") == "finished" and privacy.get("audit_step_p_value") is not None \
                and "claim_status_without_step" in privacy:
            families.setdefault(r.get("sweep"), []).append(i)
    for members in families.values():
        privacy = [records[i]["privacy"] for i in members]
        alpha = min(float(p["audit_step_significance"]) for p in privacy)
        adjusted = holm([float(p["audit_step_p_value"]) for p in privacy])
        for i, p, adj in zip(members, privacy, adjusted, strict=True):
            statuses[i] = "violated" if adj <= alpha else p["claim_status_without_step"]
    return statuses
