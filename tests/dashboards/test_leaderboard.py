"""Leaderboard aggregation on hand-made records: means, worst status, ratios, nulls, Pareto front."""

from __future__ import annotations

import pytest

from dashboards.leaderboard import rows
from dashboards.render import render


def record(mechanism, eps, seed, acc, *, certified=None, claimed=None, status="finished", claim="ok", step=0.1,
           mem=10.0):
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
    record("nonprivate", None, 0, 0.90, step=0.1, mem=10), record("nonprivate", None, 1, 0.92, step=0.1, mem=10),
    record("dpsgd", 1.0, 0, 0.80, certified=1.0, claimed=1.0, step=0.2, mem=30),
    record("dpsgd", 1.0, 1, 0.82, certified=1.0, claimed=1.0, step=0.2, mem=30),
    record("gredp", 1.0, 0, 0.85, certified=1.9, claimed=1.0, claim="violated", step=0.22),
    record("gredp", 1.0, 1, 0.86, certified=1.9, claimed=1.0, claim="overclaimed", step=0.22),
    record("gredp", 1.0, 2, None, status="failed"),
]


def test_rows_aggregate_over_seeds():
    board = {r.mechanism: r for r in rows(RECORDS)}
    dp = board["dpsgd"]
    assert dp.utility_mean == pytest.approx(0.81) and dp.utility_std == pytest.approx(0.01414, rel=1e-3)
    assert dp.step_time_ratio == pytest.approx(2.0) and dp.peak_memory_ratio == pytest.approx(3.0)
    assert dp.n_finished == 2 and dp.n_failed == 0
    g = board["gredp"]
    assert g.claim_status == "violated" and g.n_failed == 1 and g.n_finished == 2
    non = board["nonprivate"]
    assert non.epsilon_certified is None and non.claim_status is None and non.step_time_ratio == 1.0


def test_certified_view_ranks_by_certified_epsilon_and_marks_the_pareto_front():
    certified = [r.mechanism for r in rows(RECORDS, view="certified")]
    assert certified == ["dpsgd", "gredp", "nonprivate"]
    claimed = rows(RECORDS, view="claimed")
    assert [r.mechanism for r in claimed][:2] == ["gredp", "dpsgd"]  # equal claimed eps: higher utility first
    front = {r.mechanism for r in rows(RECORDS) if r.pareto}
    assert front == {"dpsgd", "gredp", "nonprivate"}
    front_claimed = {r.mechanism for r in claimed if r.pareto}
    assert "dpsgd" not in front_claimed  # under the claims gredp looks strictly better


def test_no_baseline_means_null_ratios():
    board = rows([r for r in RECORDS if r["config"]["mechanism"] != "nonprivate"])
    assert all(r.step_time_ratio is None and r.peak_memory_ratio is None for r in board)


@pytest.mark.parametrize("fmt", ["csv", "markdown", "latex", "json", "html"])
def test_every_format_renders(fmt):
    text = render(rows(RECORDS), fmt, title="t")
    assert "gredp" in text and "dpsgd" in text


def test_report_is_self_contained_html_with_a_plot_per_group():
    import xml.etree.ElementTree as ET

    from dashboards.report import report, scatter

    page = report(rows(RECORDS), "s")
    assert page.startswith("<!doctype html>") and "<svg" in page and "http" not in page.replace(
        "http://www.w3.org/2000/svg", "")
    svg = ET.fromstring(scatter(rows(RECORDS), "d / m"))
    circles = [c for c in svg.iter() if c.tag.endswith("circle")]
    assert len(circles) == 4  # dpsgd and gredp, each at its certified and claimed epsilon
