"""Figures and `privbench plot` on a real small store (tests/dashboards/conftest.py)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from typer.testing import CliRunner

from dashboards import figures
from dashboards.leaderboard import rows
from storage.store import Store


@pytest.fixture(scope="module")
def records(figure_store):
    return Store(str(figure_store)).records("figs")


def invoke(*args):
    from orchestrator.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_figures_leave_pyplot_alone(records):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    for kind in figures.KINDS:
        assert isinstance(figures.build(kind, records), Figure)
    assert plt.get_fignums() == before


def test_privacy_utility_draws_lines_claims_audits_and_the_nonprivate_band(records):
    fig = figures.privacy_utility(records)
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and ax.get_title() == "digits / mlp"
    private = [r for r in rows(records) if r.mechanism != "nonprivate"]
    assert len(private) == 4
    assert len(ax.containers) == 2  # one errorbar line per mechanism (dpsgd, gredp)
    hollow = [ln for ln in ax.get_lines() if ln.get_markerfacecolor() == "white" and len(ln.get_xdata()) == 1]
    assert len(hollow) == len(private)
    gredp = [r for r in private if r.mechanism == "gredp"]
    assert all(r.epsilon_certified > 1.3 * r.epsilon_claimed for r in gredp)  # the gap the figure must show
    assert any(p.get_facecolor()[:3] == pytest.approx((0.85, 0.85, 0.85)) for p in ax.patches)  # non-private band
    audited = [ln for ln in ax.get_lines() if ln.get_linewidth() == 6]
    assert len(audited) == sum(r.epsilon_audited is not None for r in private) > 0
    for container in ax.containers:  # error bars over the two seeds
        assert any(seg.get_segments() for seg in container.lines[2])


def test_overhead_curves_and_verdicts_have_their_content(records):
    fig = figures.overhead(records)
    t, m = fig.axes
    assert [x.get_text() for x in t.get_xticklabels()] == ["dpsgd", "gredp", "nonprivate"]
    assert m.get_ylabel() == "extra peak memory (MB)"
    # Split by epsilon (a legend names them), dataset / model in the titles, no trial clipped at the top.
    (legend,) = fig.legends
    assert [x.get_text() for x in legend.get_texts()] == ["non-private", r"$\varepsilon$ 1", r"$\varepsilon$ 8"]
    assert t.get_title() == m.get_title() == "digits / mlp" and t.get_ylabel() == r"step time ($\times$ non-private)"
    for ax in (t, m):
        top = max(max(ln.get_ydata()) for ln in ax.get_lines() if len(ln.get_ydata()))
        assert ax.get_ylim()[1] >= 1.1 * top
    assert not m.containers  # memory: each trial's own peak, no mean +- std bar
    curves_fig = figures.curves(records)
    curve_axes = curves_fig.axes
    assert len({(a.get_title(), a.get_ylabel()) for a in curve_axes}) == len(curve_axes)  # each panel named
    (shared,) = curves_fig.legends
    assert not any(a.get_legend() for a in curve_axes) and len(shared.get_texts()) == 5
    styles = {(ln.get_color(), ln.get_linestyle()) for ln in curve_axes[0].get_lines()}
    assert len(styles) == 5  # mechanism by colour, epsilon by line style: every line tells apart
    assert [a.get_ylabel() for a in curve_axes] == ["training loss", "test accuracy (%)"]  # in %, as the tables
    assert all(len(a.get_lines()) == 5 for a in curve_axes)  # nonprivate + 2 mechanisms x 2 epsilons
    assert all(len(a.get_lines()[0].get_xdata()) == 2 for a in curve_axes)  # two epochs
    assert sum(isinstance(c, PolyCollection) for c in curve_axes[0].collections) == 5
    (grid,) = figures.verdicts(records).axes
    cells = [p for p in grid.patches]
    assert len(cells) == 4
    labels = {t.get_text().split("\n")[0] for t in grid.texts}
    statuses = {r.claim_status for r in rows(records) if r.mechanism != "nonprivate"}
    assert labels == statuses and "ok" in statuses and statuses & {"overclaimed", "violated"}
    colours = {tuple(round(c, 3) for c in p.get_facecolor()[:3]) for p in cells}
    assert len(colours) == len(statuses)


@pytest.mark.parametrize("kind", figures.KINDS)
def test_plot_command_writes_pdf_svg_and_png(figure_store, tmp_path, kind):
    from matplotlib.image import imread

    for suffix in ("pdf", "svg", "png"):
        out = tmp_path / f"{kind}.{suffix}"
        result = invoke("plot", "figs", "--kind", kind, "--out", out, "--store", figure_store)
        assert result.exit_code == 0, result.output
        assert out.stat().st_size > 2000
    assert (tmp_path / f"{kind}.pdf").read_bytes().startswith(b"%PDF")
    svg = ET.parse(tmp_path / f"{kind}.svg").getroot()
    assert svg.tag.endswith("svg") and len(list(svg.iter())) > 100
    pixels = imread(tmp_path / f"{kind}.png")
    assert pixels[..., :3].std() > 0.05  # drawn, not blank


def test_plot_rejects_unknown_kinds_and_formats(figure_store, tmp_path):
    bad_kind = invoke("plot", "figs", "--kind", "pie", "--out", tmp_path / "f.pdf", "--store", figure_store)
    bad_fmt = invoke("plot", "figs", "--out", tmp_path / "f.jpg", "--store", figure_store)
    assert bad_kind.exit_code == 2 and "unknown figure kind" in bad_kind.output
    assert bad_fmt.exit_code == 2 and "unsupported figure format" in bad_fmt.output
    assert not (tmp_path / "f.pdf").exists() and not (tmp_path / "f.jpg").exists()


def test_leaderboard_and_plot_over_two_sweeps(figure_store, tmp_path):
    board = json.loads(invoke("leaderboard", "figs", "figs-b", "--store", figure_store, "--format", "json").stdout)
    assert {r["sweep"] for r in board} == {"figs", "figs-b"}
    assert len([r for r in board if r["mechanism"] == "dpsgd" and r["epsilon_target"] == 8]) == 2
    table = invoke("leaderboard", "figs", "figs-b", "--store", figure_store, "--format", "markdown").stdout
    assert table.startswith("| sweep |")
    result = invoke("plot", "figs", "figs-b", "--kind", "privacy-utility", "--out", tmp_path / "two.svg",
                    "--store", figure_store)
    assert result.exit_code == 0 and "dpsgd (figs-b)" in (tmp_path / "two.svg").read_text()
    unknown = invoke("leaderboard", "figs", "nope", "--store", figure_store)
    assert unknown.exit_code == 2 and "unknown sweep 'nope'" in unknown.output
