"""mechanisms/framework/integrity/findings.py: the checks' vocabulary, and how findings become a record's fields
and a trial's verdict."""

from __future__ import annotations

from pathlib import Path

from mechanisms.framework import integrity
from mechanisms.framework.integrity import trust
from mechanisms.framework.integrity.findings import Finding, certify, record_fields, unique

PASSED, CLIP = Finding("noise_stream", True), Finding("clip_range", False, "the bound left [0.1, 10] at step 3")


def test_a_check_passes_only_when_every_finding_of_it_passed_and_each_failure_is_said():
    again = Finding("clip_range", True)
    fields = record_fields([PASSED, CLIP, again])
    assert fields == {"integrity_checks": {"noise_stream": True, "clip_range": False},
                      "integrity_failed": ["clip_range: the bound left [0.1, 10] at step 3"]}
    assert certify([PASSED, again]) is None
    assert certify([CLIP, Finding("hooks", False, "after_step returned 1")]) == (
        "clip_range: the bound left [0.1, 10] at step 3; hooks: after_step returned 1")


def test_a_finding_reached_twice_counts_once_and_round_trips():
    assert unique([CLIP, PASSED, Finding.from_dict(CLIP.to_dict()), Finding("clip_range", False, "other")]) == [
        CLIP, PASSED, Finding("clip_range", False, "other")]
    assert Finding.from_dict({"check": "hooks", "passed": 1, "reason": None}) == Finding("hooks", True, "")


def test_the_docs_checks_table_mirrors_checks():
    table = (Path(trust.HOME) / "docs" / "plugins.md").read_text()
    assert {"row_independence", "model_state"} <= set(integrity.CHECKS)
    for name, what in integrity.CHECKS.items():
        assert f"| `{name}` | {what} |" in table, name
