"""Leaderboard aggregation on hand-made records: means, worst status, ratios, nulls, Pareto front."""

from __future__ import annotations

import pytest

from dashboards.leaderboard import rows
from dashboards.render import render


def record(mechanism, eps, seed, acc, *, certified=None, claimed=None, status="finished", claim="ok", step=0.1,
           mem=100.0):
    return {
        "status": status,
        "config": {"dataset": "d", "model": "m", "mechanism": mechanism, "epsilon": eps, "seed": seed,
                   "train": {"batch_size": 64}},
        "metrics": {} if status == "failed" else {"accuracy": acc, "step_time_s": step, "peak_memory_mb": mem,
                                                  "examples_per_s": 100.0, "wall_s": 5.0},
        "privacy": {} if mechanism == "nonprivate" else {
            "delta": 1e-5, "epsilon_claimed": claimed, "epsilon_certified": certified, "claim_status": claim,
            "sigma": 1.0, "accountant": "pld", "sampler": "poisson"},
    }


RECORDS = [
    record("nonprivate", None, 0, 0.90, step=0.1, mem=100), record("nonprivate", None, 1, 0.92, step=0.1, mem=100),
    record("dpsgd", 1.0, 0, 0.80, certified=1.0, claimed=1.0, step=0.2, mem=300),
    record("dpsgd", 1.0, 1, 0.82, certified=1.0, claimed=1.0, step=0.2, mem=300),
    record("gredp", 1.0, 0, 0.85, certified=1.9, claimed=1.0, claim="violated", step=0.22),
    record("gredp", 1.0, 1, 0.86, certified=1.9, claimed=1.0, claim="overclaimed", step=0.22),
    record("gredp", 1.0, 2, None, status="failed"),
]


def test_rows_aggregate_over_seeds():
    board = {r.mechanism: r for r in rows(RECORDS)}
    dp = board["dpsgd"]
    assert dp.utility_mean == pytest.approx(0.81) and dp.utility_std == pytest.approx(0.01414, rel=1e-3)
    assert dp.step_time_ratio is None and dp.peak_memory_ratio == pytest.approx(3.0)  # no paired step measurement
    assert dp.n_finished == 2 and dp.n_failed == 0
    g = board["gredp"]
    assert g.claim_status == "violated" and g.n_failed == 1 and g.n_finished == 2
    non = board["nonprivate"]
    assert non.epsilon_certified is None and non.claim_status is None and non.step_time_ratio == 1.0


def test_certified_view_ranks_by_certified_epsilon_and_marks_the_pareto_front():
    certified = [r.mechanism for r in rows(RECORDS, view="certified")]
    assert certified == ["dpsgd", "nonprivate", "gredp"]  # ok rows, the reference, then the rest
    claimed = rows(RECORDS, view="claimed")
    # equal claimed eps and gredp's utility is higher, but its claim is violated: the ok row ranks first
    assert [r.mechanism for r in claimed] == ["dpsgd", "nonprivate", "gredp"]
    front = {r.mechanism for r in rows(RECORDS) if r.pareto}
    assert front == {"dpsgd"}  # the Pareto front is drawn among ok rows only
    assert {r.mechanism for r in claimed if r.pareto} == {"dpsgd"}


def test_no_baseline_means_null_ratios():
    board = rows([r for r in RECORDS if r["config"]["mechanism"] != "nonprivate"])
    assert all(r.step_time_ratio is None and r.peak_memory_ratio is None for r in board)


def test_memory_ratio_is_null_over_a_near_zero_baseline_but_megabytes_stay():
    """A 20k-parameter CNN's non-private step needs ~1 MB extra: a ratio against it is noise (was "297x")."""
    small = [record("nonprivate", None, 0, 0.9, mem=1.0), record("dpsgd", 1.0, 0, 0.8, certified=1.0, claimed=1.0,
                                                                  mem=297.0)]
    dp = next(r for r in rows(small) if r.mechanism == "dpsgd")
    assert dp.peak_memory_ratio is None and dp.peak_memory_mb == pytest.approx(297.0)
    assert dp.step_time_ratio is None  # not measured in the trial: no step x
    table = render(rows(small), "markdown", columns="overhead")
    assert "297" in table and "297x" not in table


def test_several_sweeps_stay_apart_and_get_a_sweep_column():
    a = [dict(r, sweep="A") for r in RECORDS]
    b = [dict(r, sweep="B") for r in RECORDS if r["config"]["mechanism"] != "gredp"]
    board = rows(a + b)
    dp = [r for r in board if r.mechanism == "dpsgd"]
    assert sorted(r.sweep for r in dp) == ["A", "B"] and all(r.n_finished == 2 for r in dp)
    assert all(r.peak_memory_ratio == pytest.approx(3.0) for r in dp)  # each against its own sweep's baseline
    header = render(board, "markdown").splitlines()[0]
    assert header.startswith("| sweep | dataset")
    assert render(rows(a), "markdown").splitlines()[0].startswith("| dataset")


@pytest.mark.parametrize("fmt", ["csv", "markdown", "latex", "json", "html"])
def test_every_format_renders(fmt):
    text = render(rows(RECORDS), fmt, title="t")
    assert "gredp" in text and "dpsgd" in text


def test_report_is_self_contained_html_with_figures_verdicts_and_grid():
    import re

    from dashboards.report import report

    records = [dict(r, sweep="s", curves={"train_loss": [1.0, 0.5]}) for r in RECORDS]
    page = report(records, ["s"], {"s": "name: s\nseeds: [0, 1]\n"})
    assert page.startswith("<!doctype html>") and page.count("<svg") == 4
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page)  # nothing loaded from elsewhere
    assert "violated. An experiment refutes the claim" in page and "seeds: [0, 1]" in page


AUDIT = {"epsilon_audited": 0.4, "epsilon_audited_steinke": 0.3, "epsilon_audited_fdp": 0.4,
         "epsilon_audited_curve": 0.9, "epsilon_audited_noise": 0.97,
         "audit_ceiling": 0.5, "mia_auc": 0.52, "mia_tpr_at_0_1pct_fpr": 0.002, "audit_s": 3.0,
         "audit_time_ratio": 1.05}


def audited(seed, **changes):
    r = record("dpsgd", 1.0, seed, 0.8, certified=1.0, claimed=1.0)
    r["privacy"] |= AUDIT | changes
    return r


def test_audit_fields_become_columns_lower_bounds_max_the_rest_mean_over_seeds():
    board = rows([audited(0), audited(1, epsilon_audited_steinke=0.35, epsilon_audited_curve=0.7, audit_ceiling=0.7,
                                      mia_auc=0.56, audit_time_ratio=1.15, **{"mia_tpr_at_0_1pct_fpr": 0.004})])
    (r,) = board
    assert r.epsilon_audited_steinke == pytest.approx(0.35) and r.epsilon_audited_fdp == pytest.approx(0.4)
    assert r.epsilon_audited_curve == pytest.approx(0.9)  # the strongest evidence over seeds, as epsilon_audited
    assert r.audit_ceiling == pytest.approx(0.6) and r.mia_auc == pytest.approx(0.54)
    assert r.mia_tpr_at_0_1pct_fpr == pytest.approx(0.003) and r.audit_time_ratio == pytest.approx(1.1)
    assert r.audit_s == pytest.approx(3.0)
    md = render(board, "markdown", columns="all").splitlines()
    header = [h.strip() for h in md[0].strip("|").split("|")]
    cells = dict(zip(header, [c.strip() for c in md[2].strip("|").split("|")], strict=True))
    # each quantity with its decimals, as every output writes it (one format per quantity)
    assert cells["eps audited"] == "0.40" and cells["eps curve"] == "0.90" and cells["ceiling"] == "0.60"
    assert cells["MIA AUC"] == "0.54" and cells["audit x"] == "1.10" and cells["eps noise"] == "0.97"
    csv = render(board, "csv").splitlines()
    for column in ("epsilon_audited_steinke", "epsilon_audited_fdp", "audit_ceiling", "mia_auc",
                   "mia_tpr_at_0_1pct_fpr", "audit_s", "audit_time_ratio"):
        assert column in csv[0].split(",")
    tex = render(board, "latex", columns="audit")
    assert ("ceiling" in tex or "ceil.: ceiling" in tex) and "MIA" in tex and "AUC" in tex and "($\\times$)" in tex
    assert " 1.10 " in tex and " 0.90 " in tex  # audit x, eps curve: their quantities' decimals
    page = render(board, "html", columns="all")
    assert "<th>MIA AUC</th>" in page and "<td>0.54</td>" in page


def test_rows_without_audits_show_dashes_not_numbers():
    (r,) = [x for x in rows(RECORDS) if x.mechanism == "dpsgd"]
    assert r.audit_ceiling is None and r.mia_auc is None and r.audit_time_ratio is None
    line = render([r], "markdown", columns="audit").splitlines()[2]
    assert line.count("| - ") >= 5


def test_report_says_why_a_run_level_family_bound_violated_and_what_the_audit_cost():
    from dashboards.report import report

    r = audited(0, epsilon_audited_noise=1.46, claim_status="violated")
    r["privacy"] |= {"epsilon_certified": 1.5}
    page = report([dict(r, sweep="s", curves={}), dict(RECORDS[0], sweep="s", curves={})], ["s"])
    assert "the noise the run really added gives 1.46;" in page  # a lower bound, as the table writes it
    assert "DP-SGD&#x27;s own curves" not in page  # 0.9 is below the claim of 1: not a reason
    assert "(ceiling)" in page and "AUC 0.52" in page and "1.05x the training time" in page


def test_step_x_is_the_trials_paired_measurement_or_nothing():
    """Issue 48, 7: `step x` is each trial's own paired measurement (mean over seeds, the widest 95% interval);
    a private row without one shows none, never the ratio of its trials' median step to non-private's (here
    2.0, a different quantity: before, such rows read 2.0 beside paired rows' 1.6)."""
    paired = []
    for seed, (ratio, low, high) in enumerate(((1.6, 1.5, 1.7), (1.7, 1.55, 1.9))):
        r = record("dpsgd", 1.0, seed, 0.8, certified=1.0, claimed=1.0, step=0.2)
        r["metrics"] |= {"step_time_ratio": ratio, "step_time_ratio_low": low, "step_time_ratio_high": high}
        paired.append(r)
    unpaired = [record("gredp", 1.0, seed, 0.8, certified=1.0, claimed=1.0, step=0.2) for seed in (0, 1)]
    reference = [record("nonprivate", None, seed, 0.9, step=0.1) for seed in (0, 1)]
    board = {r.mechanism: r for r in rows(paired + unpaired + reference)}
    dp = board["dpsgd"]
    assert dp.step_time_ratio == pytest.approx(1.65)
    assert (dp.step_time_ratio_low, dp.step_time_ratio_high) == (1.5, 1.9)  # the widest over seeds
    assert board["gredp"].step_time_ratio is None and board["nonprivate"].step_time_ratio == 1.0
    cells = {line.split("|")[3].strip(): line for line in render(list(board.values()), "markdown").splitlines()[2:]}
    assert "| 1.65 |" in cells["dpsgd"] and "2.00" not in cells["gredp"]
    from dashboards.report import report

    page = report([dict(r, sweep="s", curves={}) for r in paired + unpaired + reference], ["s"])
    assert "<td>1.65 (1.50-1.90)</td>" in page and "<td>not measured</td>" in page
    board = list(board.values())
    overhead, core = render(board, "latex", columns="overhead"), render(board, "latex")
    assert "1.65 &  (1.50--1.90)" in overhead and "95\\% interval" in overhead  # the spread where it matters
    assert "1.50" not in core


def test_a_report_of_a_sweep_without_audits_says_nothing_about_audits():
    """Issue 48, 5: with `audit: {mode: off}` the report said "the audited lower bound (none) are both at most"
    and "the audits cost 1.4x the training time"."""
    from dashboards.report import report

    recs = [dict(r, sweep="s", curves={}) for r in RECORDS[:4]]
    for r in recs:
        r["privacy"]["audit_time_ratio"] = 1.4  # the forward passes' time, no audit result
    page = report(recs, ["s"])
    assert "sound bound (1.00) is at most the claimed epsilon 1.00." in page
    for said in ("audited lower bound", "audits cost", "(none)", "<b>ceiling</b>"):
        assert said not in page, said


def test_a_two_sweep_title_breaks_between_phrases_at_80_columns():
    """Issue 48, 5: at 80 columns a two-sweep board's title wrapped mid-phrase at its table's width (`... / digits
    / mlp (accuracy,` over `certified view)`)."""
    from rich.console import Console

    from dashboards.render import rich_tables

    title = "quickstart + second-sweep second-sweep / digits / mlp (accuracy, certified view)"
    tables, _ = rich_tables(rows(RECORDS), title, "core", 80)
    console = Console(width=80, record=True)
    console.print(tables[0])
    lines = [ln.strip() for ln in console.export_text().splitlines()[:3]]
    assert lines[:2] == ["quickstart + second-sweep second-sweep / digits / mlp", "(accuracy, certified view)"]
