"""Only rows whose claim is `ok` are ranked, bolded, marked Pareto or drawn as contenders, in every output
(issue 48, 1): a sweep where `dpsgd-shuffle-rdp` claims epsilon 2, is certified at 8.11 and has the best
accuracy. Before, LaTeX set it in bold as the "best private accuracy", and the claimed view ranked it first."""

from __future__ import annotations

import re

from rich.console import Console

from dashboards import figures
from dashboards.latex import best_utility
from dashboards.leaderboard import rows
from dashboards.render import render, rich_tables
from dashboards.report import report
from dashboards.summary import summary
from tests.dashboards.test_latex import body_rows, tabulars
from tests.dashboards.test_leaderboard import record

WINNER = "dpsgd-shuffle-rdp"
HONEST = ["dpsgd-gdp", "dpsgd"]  # the ok rows, in rank order: certified 1.98 before 2.0


def overclaimed_winner() -> list[dict]:
    recs = []
    for seed in (0, 1):
        recs.append(record("nonprivate", None, seed, 0.90 + seed / 100))
        recs.append(record("dpsgd", 2.0, seed, 0.70 + seed / 100, certified=2.0, claimed=2.0))
        recs.append(record("dpsgd-gdp", 2.0, seed, 0.72 + seed / 100, certified=1.98, claimed=2.0))
        recs.append(record(WINNER, 2.0, seed, 0.758 + seed / 100, certified=8.11, claimed=2.0, claim="overclaimed"))
    return [dict(r, sweep="oc", curves={}) for r in recs]


def order(names: list[str]) -> list[str]:
    """The mechanisms in the order an output shows them (each once)."""
    return [n for n in dict.fromkeys(names) if n in (*HONEST, WINNER, "nonprivate")]


def test_the_overclaimed_winner_is_ranked_after_the_ok_rows_and_highlighted_nowhere():
    recs = overclaimed_winner()
    expected = [*HONEST, "nonprivate", WINNER]
    for view in ("certified", "claimed"):
        board = rows(recs, view=view)
        assert [r.mechanism for r in board] == expected, view
        assert {r.mechanism for r in board if r.pareto} == {"dpsgd-gdp"}, view
    board = rows(recs)
    # terminal
    (table,), _ = rich_tables(board, "oc", "all")
    console = Console(width=300, record=True)
    console.print(table)
    lines = console.export_text().splitlines()
    assert order([ln.split()[0] for ln in lines if ln.strip()]) == expected
    winner_line = next(ln for ln in lines if ln.split() and ln.split()[0] == WINNER)
    assert "overclaimed" in winner_line and "*" not in winner_line
    # markdown and HTML: the same order, the Pareto mark on the best ok row only
    md = [[c.strip() for c in ln.strip("|").split("|")] for ln in render(board, "markdown", columns="all")
          .splitlines()[2:]]
    assert order([cells[2] for cells in md]) == expected
    pareto = [cells[2] for cells in md if cells[-1] == "*"]
    assert pareto == ["dpsgd-gdp"]
    page = render(board, "html", columns="all")
    assert order(re.findall(r"<td>([\w-]+)</td>", page)) == expected
    # LaTeX: bold on the best ok row, never on the overclaimed one, whose status is in words
    text = render(board, "latex", width="double")
    assert [board[i].mechanism for i in best_utility(board)] == ["dpsgd-gdp"]
    (tab,) = tabulars(text)
    latex_rows = {re.sub(r"\\texttt\{(.*)\}", r"\1", cells[0]).replace(r"\-", "-"): " & ".join(cells)
                  for cells in body_rows(tab)}
    assert list(latex_rows) == expected
    assert r"\textbf" in latex_rows["dpsgd-gdp"] and r"\textbf" not in latex_rows[WINNER]
    assert "overclaimed" in latex_rows[WINNER] or "over." in latex_rows[WINNER]
    assert "among rows with status ok" in text
    # the report: its tables in that order, no emphasis on the winner
    html = report(recs, ["oc"])
    table = html[html.index("<table"):html.index("</table>")]
    assert order(re.findall(r"<td>([\w-]+)</td>", table)) == expected
    assert "ranked first" in html
    # the figure: the overclaimed line dashed and thinner, its status in words in the legend
    fig = figures.privacy_utility(recs)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert f"{WINNER} (overclaimed)" in legend and "dpsgd-gdp" in legend
    colour = figures.mechanism_colours(recs)
    styles = {line.get_linestyle() for line in fig.axes[0].lines
              if line.get_color() == colour[WINNER] and line.get_marker() == "o" and line.get_mfc() != "white"}
    assert styles == {"--"}
    # the MLflow summary (the experiment's description): the ok rows first
    md = summary(recs, board)
    assert order(re.findall(r"&ensp;([\w-]+)&ensp;", md)) == expected
