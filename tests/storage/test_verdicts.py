"""Holm's step-down correction of a sweep's audit verdicts (storage/verdicts.py), against its definition."""

from __future__ import annotations

import numpy as np
import pytest

from storage.verdicts import holm, sweep_claim_statuses


def holm_rejections(p: list[float], alpha: float) -> set[int]:
    """Holm (1979) as stated: walk the sorted p-values, reject while p_(j) <= alpha / (m - j + 1), stop at the first
    that is not."""
    out: set[int] = set()
    for rank, i in enumerate(sorted(range(len(p)), key=p.__getitem__)):
        if p[i] > alpha / (len(p) - rank):
            break
        out.add(i)
    return out


def test_adjusted_p_values_of_a_worked_example():
    # sorted: 0.005 * 4 = 0.02, 0.01 * 3 = 0.03, 0.03 * 2 = 0.06, 0.04 * 1 = 0.04 -> running max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([]) == [] and holm([0.2]) == [0.2] and holm([0.6, 0.7]) == [1.0, 1.0]
    with pytest.raises(ValueError, match="p-value"):
        holm([0.1, 1.5])


def test_adjusted_p_values_reject_exactly_what_the_step_down_procedure_rejects():
    rng = np.random.default_rng(7)
    for _ in range(200):
        m = int(rng.integers(1, 30))
        p = list(np.where(rng.random(m) < 0.3, rng.random(m) * 1e-3, rng.random(m)))
        adjusted = holm(p)
        for alpha in (0.001, 0.01, 0.05):
            assert {i for i, a in enumerate(adjusted) if a <= alpha} == holm_rejections(p, alpha)
        assert all(a >= q for a, q in zip(adjusted, p, strict=True))  # never below the raw p-value


def record(key: str, p: float | None, status: str, without: str = "ok", sweep: str = "s",
           significance: float = 0.001) -> dict:
    privacy = {"claim_status": status}
    if p is not None:
        privacy |= {"audit_step_p_value": p, "audit_step_significance": significance,
                    "claim_status_without_step": without}
    return {"sweep": sweep, "trial_key": key, "status": "finished", "privacy": privacy}


def test_sweep_statuses_correct_each_sweep_on_its_own():
    records = [record(f"a{i}", 0.5, "ok") for i in range(99)] + [record("a99", 0.0008, "violated")]
    records += [record("b0", 0.0008, "violated", sweep="t"), record("b1", 0.3, "ok", sweep="t")]
    records += [record("c0", 1e-9, "violated", without="overclaimed", sweep="u"), record("c1", None, "uncertified")]
    statuses = sweep_claim_statuses(records)
    assert statuses[:99] == ["ok"] * 99
    assert statuses[99] == "ok"  # 0.0008 * 100 > 0.001: a chance finding among 100 audits
    assert statuses[100:102] == ["ok", "ok"]  # 2 * 0.0008 > 0.001 as well
    assert statuses[102:] == ["violated", "uncertified"]  # a real refutation stays; no p-value: kept as recorded


def test_a_violation_outside_the_step_audit_is_kept():
    """`claim_status_without_step` carries the run-level verdicts (audited epsilon above the claim): Holm clears
    only what the step audit said."""
    statuses = sweep_claim_statuses([record("a", 0.0009, "violated", without="violated"),
                                     record("b", 0.4, "ok")])
    assert statuses == ["violated", "ok"]
