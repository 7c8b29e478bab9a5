"""One value per quantity (issue 41): the terminal, markdown, LaTeX, the HTML report and the overhead figure
show each number of one store from the same field with the same rounding rule, and the figures speak the tables'
units, symbols and colours. Hand-made records whose paired step-time ratio (1.64) differs from the ratio of
step times across trials (1.46), as in the store where the figure said 1.46 and the tables 1.64."""

from __future__ import annotations

import re

from dashboards import figures
from dashboards.leaderboard import rows
from dashboards.render import display, render, rich_tables
from dashboards.report import report
from tests.dashboards.test_latex import body_rows, tabulars
from tests.dashboards.test_leaderboard import record


def store() -> list[dict]:
    recs = []
    for seed in (0, 1):
        recs.append(dict(record("nonprivate", None, seed, 0.95, step=0.100), sweep="s", curves={}))
        for eps, audited, ratio in ((1.0, 0.0123, 1.64), (8.0, 2.1917, 1.70)):
            for mech in ("dpsgd", "dpsgd-gdp"):
                r = record(mech, eps, seed, 0.80 + seed / 100 + eps / 100, certified=eps * 1.0049, claimed=eps,
                           step=0.146)
                r["metrics"]["step_time_ratio"] = ratio + seed / 100
                r["privacy"] |= {"epsilon_audited": audited + seed / 1000, "mu_claimed": 1.8841, "mu_audited": 1.8302}
                recs.append(dict(r, sweep="s", curves={"test_accuracy": [0.5, 0.7]}))
    return recs


def markdown_cells(text: str) -> dict[tuple[str, str], dict[str, str]]:
    lines = text.splitlines()
    header = [h.strip() for h in lines[0].strip("|").split("|")]
    out = {}
    for line in lines[2:]:
        cells = dict(zip(header, [c.strip() for c in line.strip("|").split("|")], strict=True))
        out[(cells["mechanism"], cells["eps target"])] = cells
    return out


def test_every_output_shows_the_same_numbers():
    recs = store()
    board = rows(recs)
    md = markdown_cells(render(board, "markdown", columns="all"))
    # the terminal: one table per dataset/model, decimals over the whole leaderboard
    (table,), _ = rich_tables(board, "t", "all", scope=board)
    terminal = {(r.mechanism, str(row[1])): [str(c) for c in row]
                for r, row in zip(board, zip(*(c.cells for c in table.columns), strict=True), strict=True)}
    headers = [h for h, _ in display(board, "all", leave_out=("dataset", "model"))]
    for (mech, eps), cells in md.items():
        shown = dict(zip(headers, terminal[(mech, eps)], strict=True))
        for h in ("eps certified", "eps audited", "step x", "mu claimed/audited"):
            assert shown[h] == cells[h], (mech, eps, h)
    # LaTeX: the same digits (core columns: mechanism, target, mean, +- std, certified, audited, status, step x)
    (latex,) = tabulars(render(board, "latex", width="double"))
    for cells in body_rows(latex):
        mech, eps = re.sub(r"\\texttt\{(.*)\}", r"\1", cells[0]).replace(r"\-", "-"), cells[1]
        row = md[(mech, "-" if eps == "--" else eps)]
        assert [cells[4], cells[5], cells[7]] == [
            "--" if row[h] == "-" else row[h] for h in ("eps certified", "eps audited", "step x")]
    assert md[("dpsgd", "8")]["eps audited"] == "2.192" and md[("dpsgd", "1")]["eps audited"] == "0.013"
    assert md[("dpsgd", "1")]["step x"] == "1.64"  # the trials' own paired ratios (1.64, 1.65), not 1.46
    # the report: its tables are the markdown's, its sentences round as the tables do
    page = report(recs, ["s"])
    for (mech, _), cells in md.items():
        if mech != "nonprivate":
            assert f"<td>{cells['eps certified']}</td>" in page
    assert "sound bound (8.04)" in page and "audited lower bound (2.192)" not in page
    # the overhead figure's bars: each mechanism's mean of its trials' paired ratios, the leaderboard's step x
    fig = figures.overhead(recs)
    step_axis = fig.axes[0]
    bars = sorted(round(line.get_ydata()[0], 6) for line in step_axis.lines if line.get_linewidth() == 2)
    expected = sorted(round(r.step_time_ratio, 6) for r in board)
    assert bars == expected


def test_figures_speak_the_tables_units_symbols_and_colours():
    recs = store()
    pu = figures.privacy_utility(recs)
    assert pu.axes[0].get_ylabel() == "accuracy (%)" and r"$\varepsilon$" in pu.axes[0].get_xlabel()
    ys = [y for line in pu.axes[0].lines for y in line.get_ydata()]
    assert max(ys) > 50  # in %, as the tables
    assert not re.search(r"(?<!var)epsilon", " ".join(t.get_text() for t in pu.legends[0].get_texts()))
    curves = figures.curves(recs)
    assert curves.axes[0].get_ylabel() == "test accuracy (%)"
    colours = figures.mechanism_colours(recs)
    assert colours["nonprivate"] == figures.NONPRIVATE_COLOUR and len(set(colours.values())) == 3
    for fig in (pu, curves, figures.overhead(recs)):  # a mechanism's colour is the same in every figure
        drawn = {line.get_color() for ax in fig.axes for line in ax.lines} | {
            line.get_markeredgecolor() for ax in fig.axes for line in ax.lines}
        assert colours["dpsgd"] in drawn and colours["dpsgd-gdp"] in drawn
    over = figures.overhead(recs)
    eps_colours = {h.get_markeredgecolor() for h in over.legends[0].legend_handles}
    assert eps_colours == {"0"}  # epsilons by marker, not by a colour that means a mechanism elsewhere


def test_a_verdicts_figure_where_every_verdict_is_ok_is_left_out_with_one_line():
    recs = [r for r in store() if r["config"]["mechanism"] != "dpsgd-gdp"]
    assert figures.uninformative("verdicts", recs)
    page = report(recs, ["s"])
    assert "id='fig-verdicts'" not in page and page.count("every verdict is ok") == 1
    mixed = store()
    mixed[2]["privacy"]["claim_status"] = "overclaimed"
    assert figures.uninformative("verdicts", mixed) is None and "id='fig-verdicts'" in report(mixed, ["s"])


def test_the_report_opens_on_the_leaderboard():
    page = report(store(), ["s"])
    assert page.index("<h2>Leaderboard</h2>") < page.index("<figure") and page.index("<table") < page.index("<svg")


def test_the_mlflow_summary_pads_its_cells():
    """MLflow's Markdown tables have no cell padding: `0.8357 ± 0.0008` beside `1` read `0.8357 ± 0.00081`."""
    from dashboards.summary import PAD, summary

    recs = store()
    text = summary(recs, rows(recs))
    table = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert table[1].startswith("|---")
    for line in table[:1] + table[2:]:
        cells = line.strip("|").split(" | ")
        assert all(c.strip().startswith(PAD) and c.strip().endswith(PAD) for c in cells), line
