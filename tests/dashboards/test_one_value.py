"""One value per quantity (issues 41 and 48): the terminal, markdown, HTML, LaTeX, the report's tables and
sentences, the figures and the MLflow params and descriptions write each number of one store in the one format
its schema field gives, and the figures speak the tables' units, symbols and colours. Hand-made records whose
paired step-time ratio (1.64) differs from the ratio of step times across trials (1.46), as in the store where
the figure said 1.46 and the tables 1.64."""

from __future__ import annotations

import re

from dashboards import figures
from dashboards.leaderboard import rows
from dashboards.render import display, render, rich_tables
from dashboards.report import report
from storage.mlflow_view import display_params, trial_summary
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
                r["privacy"] |= {"epsilon_audited": audited + seed / 1000, "mu_claimed": 1.8841, "mu_audited": 1.8302,
                                 "epsilon_audited_curve": 2.1916 * eps / 8, "audit_ceiling": 1.4604 * eps / 8 + 0.004,
                                 "mia_auc": 0.5312, "audit_time_ratio": 1.4449}
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


def plain(cell: str) -> str:
    """A LaTeX cell's text: bold, `\\rlap` / `\\phantom` alignment and `\\pm` left out."""
    cell = re.sub(r"\\phantom\{[^}]*\}", "", cell).replace(r"${}\pm{}$", "")
    return re.sub(r"\\(textbf|rlap|texttt)\{|\}|\\-", "", cell).strip()


QUANTITIES = ("utility", "eps claimed", "eps certified", "eps audited", "eps curve", "ceiling", "MIA AUC", "audit x",
              "mu claimed/audited", "step x")


def test_every_output_writes_each_quantity_one_way():
    """Issue 48, 2: one store rendered every way; each output shows each quantity's number as the markdown
    does. Before, the LaTeX table and figures wrote the utility in % and the other outputs as a fraction, a
    curve bound of 2.1916 read 2.191 in the tables and 2.1 on the MLflow run page, a ceiling 1.460 in the
    tables and 1.5 in the report, a certified 8.00 as 8 in the verdicts figure."""
    recs = store()
    board = rows(recs)
    md = markdown_cells(render(board, "markdown", columns="all"))
    private = {k: v for k, v in md.items() if k[0] != "nonprivate"}
    assert md[("dpsgd", "8")]["eps curve"] == "2.19" and md[("dpsgd", "1")]["ceiling"] == "0.19"
    assert md[("dpsgd", "8")]["utility"] == "88.5 ± 0.7" and md[("dpsgd", "1")]["eps certified"] == "1.01"
    # the terminal
    (table,), _ = rich_tables(board, "t", "all")
    headers = [h for h, _ in display(board, "all", leave_out=("dataset", "model"))]
    for r, row in zip(board, zip(*(c.cells for c in table.columns), strict=True), strict=True):
        shown = dict(zip(headers, map(str, row), strict=True))
        expected = md[(r.mechanism, shown["eps target"])]
        assert {q: shown[q] for q in QUANTITIES} == {q: expected[q] for q in QUANTITIES}, r.mechanism
    # HTML: the leaderboard page and the report's tables
    for page in (render(board, "html", columns="all"), report(recs, ["s"])):
        for cells in private.values():
            for q in QUANTITIES:
                assert f"<td>{cells[q]}</td>" in page, q
    # LaTeX: every quantity's cell as in the markdown (the utility's mean and `± std` are two cells)
    latex: dict[tuple[str, str], set[str]] = {}
    for columns in ("core", "audit", "privacy"):
        for part in tabulars(render(board, "latex", columns=columns, width="double")):
            for cells in body_rows(part):
                key = (plain(cells[0]), "-" if cells[1] == "--" else cells[1])
                latex.setdefault(key, set()).update({plain(c) for c in cells})
                if columns == "core":
                    latex[key].add(f"{plain(cells[2])} ± {plain(cells[3])}")
    for key, cells in private.items():
        assert {q: cells[q] for q in QUANTITIES if cells[q] in latex[key]} == {
            q: cells[q] for q in QUANTITIES}, key
    # the report's sentences
    page = report(recs, ["s"])
    for cells in private.values():
        assert f"sound bound ({cells['eps certified']}) and the audited lower bound ({cells['eps audited']})" in page
        assert f"reaches {cells['ceiling']} on" in page and f"AUC {cells['MIA AUC']}" in page
        assert f"cost {cells['audit x']}x" in page
    # the figures: the verdicts cells and the privacy-utility ticks write epsilons as the tables do
    verdict_texts = {t.get_text() for ax in figures.verdicts(recs).axes for t in ax.texts}
    for cells in private.values():
        assert f"{cells['status']}\n{cells['eps claimed']} / {cells['eps certified']}" in verdict_texts
    ticks = {t.get_text() for t in figures.privacy_utility(recs).axes[0].get_xticklabels()}
    assert ticks and ticks <= {c[q] for c in private.values() for q in ("eps claimed", "eps certified")}
    # MLflow: a trial's params (the runs table) and its run page's description, against a one-seed board
    one = [r for r in recs if r["config"]["seed"] == 0]
    md_one = markdown_cells(render(rows(one), "markdown", columns="all"))
    for r in one:
        cells = md_one[(r["config"]["mechanism"], str(r["config"]["epsilon"] or "-").removesuffix(".0"))]
        params = display_params(r)  # named by the schema's short headers, which the runs table shows whole
        assert params["acc."] == cells["utility"]
        for q, name in (("eps certified", "eps cert."), ("eps audited", "eps aud."), ("status", "status")):
            assert params[name] == cells[q], q
        description = trial_summary(r)
        for q in ("eps curve", "ceiling", "MIA AUC", "eps claimed"):
            if cells[q] != "-":
                assert f"**{cells[q]}" in description, (q, description)
    # the overhead figure's bars: each mechanism's mean of its trials' paired ratios, the leaderboard's step x
    fig = figures.overhead(recs)
    bars = sorted(round(line.get_ydata()[0], 6) for line in fig.axes[0].lines if line.get_linewidth() == 2)
    assert bars == sorted(round(r.step_time_ratio, 6) for r in board)


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
    assert not set("*`|_") & set(text.splitlines()[0])  # the line the experiments list shows raw (issue 48, 4)
    table = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert table[1].startswith("|---")
    for line in table[:1] + table[2:]:
        cells = line.strip("|").split(" | ")
        assert all(c.strip().startswith(PAD) and c.strip().endswith(PAD) for c in cells), line


def test_a_mechanism_has_one_colour_in_every_sweep_and_verdicts_have_their_own():
    """Issue 48, 3: `dpsgd` was blue in the quickstart's figures and green in a second sweep's (colours went by
    the sorted names present), and the verdicts figure's `ok` and `overclaimed` were colours mechanisms had."""
    from pathlib import Path

    import yaml

    from mechanisms.framework import registry

    def sweep(mechanisms: list[str]) -> list[dict]:
        return [record(m, None if m == "nonprivate" else 1.0, 0, 0.8, certified=1.0, claimed=1.0) for m in mechanisms]

    first = figures.mechanism_colours(sweep(["nonprivate", "dpsgd", "gredp"]))
    second = figures.mechanism_colours(sweep(["nonprivate", "dp-bandmf-4", "dpsgd", "dpsgd-gdp"]))
    assert first["dpsgd"] == second["dpsgd"] == figures.mechanism_colour("dpsgd")
    assert first["nonprivate"] == second["nonprivate"] == figures.NONPRIVATE_COLOUR
    assert figures.mechanism_colour("my-plugin") == figures.mechanism_colour("my-plugin") in figures.PALETTE
    # verdict colours: a set no mechanism has
    mechanism_colours = set(figures.PALETTE) | set(figures.BUILT_IN_COLOURS.values()) | {figures.NONPRIVATE_COLOUR}
    assert not set(figures.STATUS_COLOURS.values()) & mechanism_colours
    # every built-in private mechanism has its colour; those one example grid compares never share one
    assert {n for n in registry.names() if n != "nonprivate"} <= set(figures.BUILT_IN_COLOURS)
    for path in sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml")):
        names = [m for m in (yaml.safe_load(path.read_text()).get("grid") or {}).get("mechanism", [])
                 if m != "nonprivate"]
        assert len({figures.mechanism_colour(m) for m in names}) == len(names), path.name
    # the verdicts figure's cells take verdict colours only
    recs = store()
    recs[2]["privacy"]["claim_status"] = "overclaimed"
    from matplotlib.colors import to_hex

    cells = {to_hex(p.get_facecolor()) for ax in figures.verdicts(recs).axes for p in ax.patches}
    assert cells and cells <= {c.lower() for c in figures.STATUS_COLOURS.values()}
