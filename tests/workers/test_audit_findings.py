"""The run's audit findings are words that drive the verdict: above the ceiling, a failed noise check, a guard
that sets a reading aside (recorded, never silent). Direct calls on made-up observations: no training."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mechanisms.auditing import noise_checks
from mechanisms.auditing.dirac_canaries import CanaryObservations
from mechanisms.framework.claims import claim_status
from workers.audit import OneRunResult, audit_integrity_findings, family_fields, one_run_fields
from workers.config import AuditConfig

SIGMA, RATE, STEPS = 1.2, 0.05, 200


@dataclasses.dataclass
class Plan:
    """The claim of DP-SGD at (SIGMA, RATE, STEPS), about 3.4 at delta 1e-5, rounded up."""

    epsilon_claimed: float = 3.5
    epsilon_certified: float = 3.5


def observations(residuals: np.ndarray, *, separated: bool = False) -> CanaryObservations:
    """600 canaries, half included; scores either separated (a leaky run) or not; the excluded canaries'
    residual series `residuals` (steps, canaries) summarised, and its moments."""
    rng = np.random.default_rng(0)
    included = np.arange(600) % 2 == 0
    scores = rng.standard_normal(600) + (8.0 * included if separated else 0.0)
    sq = residuals**2
    moments = np.array([sq.size, sq.sum(), (sq * sq).sum()], dtype=float)
    return CanaryObservations("lr", scores, scores, included, moments, None, residuals.shape[0], 0.0,
                              noise_checks.summarize(residuals))


def fields(obs: CanaryObservations, cfg: AuditConfig | None = None, **result) -> dict:
    return family_fields(OneRunResult(obs, (SIGMA, RATE, STEPS), **result), cfg or AuditConfig(mode="one-run"),
                         Plan(), 1e-5)


def test_correct_noise_gives_no_finding():
    out = fields(observations(SIGMA * np.random.default_rng(1).standard_normal((STEPS, 300))))
    assert out["audit_run_violated"] is False and "audit_findings" not in out
    assert "scale" in out["audit_noise_checks"] and "lag 1" in out["audit_noise_checks"]


def test_reused_noise_is_a_violation_in_words():
    y = np.repeat(SIGMA * np.random.default_rng(2).standard_normal((1, 300)), STEPS, axis=0)
    out = fields(observations(y))
    assert out["audit_run_violated"] is True
    assert "noise repeats across steps" in out["audit_violations"]
    assert any("repeats" in words for words in out["audit_findings"])
    assert claim_status(2.0, 2.0, 0.0, audit_violated=out["audit_run_violated"]) == "violated"
    assert len(out["audit_violations"]) == len(out["audit_findings"])  # one label per finding
    checks = {f.check: f for f in audit_integrity_findings(out)}
    assert checks["audit_noise"].passed is False and "repeats" in checks["audit_noise"].reason
    assert checks["audit_push"].passed


def test_a_guard_that_sets_a_low_noise_reading_aside_records_it():
    """Noise at half the declared scale and far from Gaussian (a two-point law): no epsilon is read off it, and
    the record says what was set aside; the noise checks still call it."""
    rng = np.random.default_rng(3)
    y = 0.5 * SIGMA * rng.choice([-1.0, 1.0], size=(STEPS, 300))
    out = fields(observations(y))
    assert out["epsilon_audited_noise"] is None
    assert "kurtosis" in out["audit_noise_discarded"] and "significantly below" in out["audit_noise_discarded"]
    assert "noise below declared" in out["audit_violations"] and out["audit_run_violated"] is True
    older = dataclasses.replace(observations(y), noise_summary=None)  # a stored run from before the checks
    out = fields(older)
    assert out["audit_violations"] == ["noise below declared"] and out["audit_run_violated"] is True


def test_audited_above_the_ceiling_beyond_its_noise_is_violated_in_words():
    obs = dataclasses.replace(observations(SIGMA * np.random.default_rng(4).standard_normal((STEPS, 300)),
                                           separated=True), guess_counts=(50, 100, 200))
    cfg = AuditConfig(mode="one-run", family_bounds=False)
    out = one_run_fields(OneRunResult(obs, (SIGMA, RATE, STEPS), ceiling=(0.3, 0.3, 0.3, 0.05)), cfg, Plan(), 1e-5)
    assert out["epsilon_audited"] > 0.3 + 4 * 0.05 and out["audit_above_ceiling"] is True
    assert out["audit_violations"] == ["above ceiling"] and out["audit_run_violated"] is True
    assert "above the ceiling 0.3" in out["audit_findings"][0]
    out = one_run_fields(OneRunResult(obs, (SIGMA, RATE, STEPS), ceiling=(50.0, 50.0, 50.0, 0.05)), cfg, Plan(),
                         1e-5)
    assert out["audit_above_ceiling"] is False and "audit_findings" not in out


def test_the_leaderboard_says_why_in_words():
    from dashboards.leaderboard import rows
    from dashboards.render import render

    def record(seed: int, privacy: dict) -> dict:
        return {"sweep": "s", "status": "finished", "config": {"dataset": "d", "model": "m", "mechanism": "x",
                                                               "epsilon": 2.0, "seed": seed, "train": {}},
                "metrics": {"accuracy": 0.5}, "privacy": {"private": True, "epsilon_claimed": 2.0,
                                                          "epsilon_certified": 2.0} | privacy}

    board = rows([record(0, {"claim_status": "ok"}),
                  record(1, {"claim_status": "violated", "audit_above_ceiling": True,
                             "audit_violations": ["above ceiling", "noise repeats across steps"]})])
    assert board[0].claim_status == "violated"
    assert board[0].audit_violation == "above ceiling, noise repeats across steps"
    text = render(board, "markdown")
    assert "| violation |" in text.replace(" violation |", " violation |") and "noise repeats across steps" in text
    assert "violated!" not in text
    old = rows([record(0, {"claim_status": "ok", "audit_above_ceiling": True})])  # a store older than the words
    assert old[0].audit_violation == "above ceiling"


@pytest.mark.parametrize("bad", [0.5, 2.0])
def test_noise_scale_in_records_is_in_the_plans_units(bad):
    """The checks compare with the plan's sigma: half of it is a finding, twice it is not."""
    out = fields(observations(bad * SIGMA * np.random.default_rng(5).standard_normal((STEPS, 300))))
    assert out["audit_run_violated"] is (bad < 1)


def test_the_reports_verdict_sentence_names_the_findings():
    import dataclasses as dc

    from dashboards.leaderboard import LeaderboardRow
    from dashboards.report import verdict_sentence

    fields = {f.name: None for f in dc.fields(LeaderboardRow) if f.default is dc.MISSING}
    row = LeaderboardRow(**fields | {"dataset": "d", "model": "m", "mechanism": "x", "metric": "accuracy",
                                      "n_finished": 1, "n_failed": 0, "claim_status": "violated",
                                      "epsilon_claimed": 2.0, "epsilon_certified": 2.0, "epsilon_audited": 0.5},
                         audit_violation="canaries pushed beyond the bound")
    assert "the run's audits found: canaries pushed beyond the bound" in verdict_sentence(row)
