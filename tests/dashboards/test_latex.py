"""`leaderboard --format latex`: booktabs tables that fit a venue's width by design (never `\\resizebox`),
numbers aligned on the decimal point with the schema's digits, a legend for abbreviations, captions and
labels. Compiled with pdflatex in tests/dashboards/test_latex_fit.py (slow)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dashboards.latex import PACKAGES, layout
from dashboards.leaderboard import rows
from dashboards.render import latex_escape, render
from dashboards.venues import VENUES
from tests.dashboards.test_leaderboard import RECORDS, record

ROOT = Path(__file__).resolve().parents[2]
BOARD_RECORDS = RECORDS + [record("dp_forward&50%", 1.0, 0, 0.70, certified=None, claimed=1.0, claim="uncertified")]


def tabulars(text: str) -> list[list[str]]:
    """The lines of each tabular (outer ones; header cells may nest a one-column tabular)."""
    out, current = [], None
    for line in text.splitlines():
        if line.startswith((r"\begin{tabular}{@{}", r"\begin{tabular*}")):
            current = []
        if current is not None:
            current.append(line)
        if line in (r"\end{tabular}", r"\end{tabular*}") and current is not None:
            out.append(current)
            current = None
    return out


def body_rows(lines: list[str]) -> list[list[str]]:
    start, end = lines.index(r"\midrule"), lines.index(r"\bottomrule")
    return [ln.removesuffix(r" \\").split(" & ") for ln in lines[start + 1:end]
            if ln != r"\midrule" and not ln.startswith(r"\multicolumn")]


def test_latex_is_booktabs_never_resized_and_names_the_one_package_it_needs():
    text = render(rows(BOARD_RECORDS), "latex")
    assert "resizebox" not in text and "graphicx" not in text and "±" not in text
    assert PACKAGES == ("booktabs",)
    first, second = text.splitlines()[:2]
    assert first.startswith("% privbench leaderboard for LaTeX's two-column article") and "229.5 pt" in first
    assert second == r"% Needs \usepackage{booktabs}."
    (table,) = tabulars(text)  # the core columns fit one column of the default venue
    spec = re.match(r"\\begin\{tabular\}\{@\{\}(.*)@\{\}\}", table[0]).group(1)
    assert spec == "lrr@{}lrrlr"  # mechanism, target, mean, +- std, certified, audited, status, step x
    for cells in body_rows(table):
        assert len(cells) == 8 and all(c.count("$") % 2 == 0 for c in cells)
    assert r"\texttt{dp\_forward\&50\%}" in text
    assert r"${}\pm{}$" in text and r"\fontsize{" in text and r"\setlength{\tabcolsep}" in text


def test_numbers_share_decimals_per_column_and_bounds_round_the_safe_way():
    """Aligned on the decimal point: every number of a column has its decimals; a certified epsilon of
    1.0049 shows as 1.01 (never under-reported), an audited lower bound of 0.318 as 0.31."""
    recs = [record("nonprivate", None, 0, 0.9), record("nonprivate", None, 1, 0.91),
            record("dpsgd", 1.0, 0, 0.8, certified=1.0049, claimed=1.0),
            record("dpsgd", 8.0, 0, 0.85, certified=7.9994247, claimed=8.0)]
    recs[2]["privacy"]["epsilon_audited"] = 0.318
    recs[3]["privacy"]["epsilon_audited"] = 2.5
    (table,) = tabulars(render(rows(recs), "latex"))
    cells = body_rows(table)
    certified = [r[4] for r in cells if r[4] != "--"]
    audited = [r[5] for r in cells if r[5] != "--"]
    assert certified == ["1.01", "8.00"] and audited == ["0.31", "2.50"]
    assert [r[1] for r in cells] == ["1", "8", "--"]  # the targets as the grid gave them
    wide = [r for r in rows(recs) if r.mechanism == "dpsgd"]
    wide = [r.__class__(**{**r.__dict__, "examples_per_s": x}) for r, x in zip(wide, (9230.4, 15912.7), strict=True)]
    text = render(wide, "latex", columns="overhead", width="double")
    assert "9230" in text and "15913" in text and "e+0" not in text and r"\times 10" not in text


def test_bold_best_utility_keeps_the_decimal_point_aligned():
    text = render(rows(BOARD_RECORDS), "latex")
    bold = [ln for ln in text.splitlines() if r"\textbf" in ln]
    # gredp's 85.5 is violated and dp_forward's 70.0 uncertified: the best ok row at eps 1 is dpsgd's 81.0
    assert len(bold) == 1 and "dpsgd" in bold[0]
    assert r"\textbf{81}\rlap{\textbf{.0}}\phantom{.0}" in bold[0]  # bold figures, normal width after the point
    alone = render(rows([r for r in RECORDS if r["config"]["mechanism"] != "gredp"]), "latex")
    assert r"\textbf" not in alone and "bold:" not in alone  # one private mechanism: best of nothing, no bold


def test_one_run_shows_no_spread():
    """A single run has no standard deviation: `85.0` alone, never `85.0 ± 0.0`."""
    one = [r for r in RECORDS if r["config"]["seed"] == 0]
    (table,) = tabulars(render(rows(one), "latex"))
    assert all(cells[3] == "" for cells in body_rows(table))
    (table,) = tabulars(render(rows(RECORDS), "latex"))
    assert all(cells[3].startswith(r"${}\pm{}$") for cells in body_rows(table))


def test_a_label_needs_a_caption():
    with pytest.raises(ValueError, match="--label needs --caption"):
        render(rows(RECORDS), "latex", float_env="table", label="tab:lb")


def legends(text: str) -> list[str]:
    """Each part's legend box: its width (points) and its text."""
    return re.findall(r"^\\noindent\\parbox\[t\]\{([\d.]+)pt\}\{\\raggedright (.*)\\par\}$", text, re.M)


def test_a_split_table_is_one_numbered_table_continued_with_each_part_explained_under_it():
    """Issue 48, 5: a split float became four numbered tables (Table 1-4), and part 1's abbreviations were
    explained only under the last part."""
    text = render(rows(BOARD_RECORDS), "latex", columns="all", float_env="table", caption="Results", label="tab:r")
    parts = len(tabulars(text))
    assert parts > 1
    captions = re.findall(r"\\caption\{(.*)\}", text)
    assert captions == ["Results"] + ["Results (continued)"] * (parts - 1)
    assert text.count(r"\addtocounter{table}{-1}") == parts - 1  # the later parts keep the first one's number
    assert re.findall(r"\\label\{(.*)\}", text) == ["tab:r"]
    boxes = legends(text)
    assert len(boxes) == parts and all("mech.: mechanism" in legend for _, legend in boxes)
    for part, (_, legend) in zip(tabulars(text), boxes, strict=True):
        assert ("status" in part[2]) == ("viol.: violated" in legend)  # a part explains its own abbreviations
    widths = set(re.findall(r"\\begin\{tabular\*\}\{([\d.]+pt)\}\{@\{\\extracolsep\{\\fill\}\}", text))
    assert len(widths) == 1 and text.count(r"\begin{tabular*}") == parts


def test_legend_abbreviations_do_not_break():
    text = render(rows(BOARD_RECORDS), "latex", columns="all")
    legend = " ".join(legend for _, legend in legends(text))
    assert r"$\varepsilon$~cert.: $\varepsilon$~certified" in legend and r"$\varepsilon$ cert." not in legend


def test_abbreviations_are_explained_in_a_legend_line():
    text = render(rows(BOARD_RECORDS), "latex")
    ((_, legend),) = legends(text)
    header = tabulars(text)[0][2]
    for short, full in (("mech.", "mechanism"), (r"$\varepsilon$~cert.", r"$\varepsilon$~certified")):
        if short.replace("~", " ") in header:
            assert f"{short}: {full}" in legend
    assert "uncert.: uncertified" in legend and "viol.: violated" in legend
    assert r"($\times$): relative to non-private" in legend and "bold: best private accuracy" in legend


def test_units_go_in_headers():
    text = render(rows(RECORDS), "latex", columns="overhead", width="double")
    for unit in (r"(\%)", r"($\times$)", "(MB)", "(ex/s)"):
        assert unit in text


def test_all_columns_split_into_stacked_tables_that_repeat_the_key_columns():
    board = rows(BOARD_RECORDS)
    parts = tabulars(render(board, "latex", columns="all"))
    assert len(parts) > 1
    for part in parts:
        head = part[2]
        assert head.startswith(("mech. & ", "mechanism & ")) and "tgt." in head.split(" & ")[1] + head
    double = tabulars(render(board, "latex", columns="all", width="double"))
    assert len(double) < len(parts)  # twice the width, fewer parts


def test_float_caption_label_and_width_follow_the_options():
    board = rows(BOARD_RECORDS)
    text = render(board, "latex", float_env="table*", caption=r"Accuracy at $\varepsilon$", label="tab:lb")
    lines = text.splitlines()
    assert lines[2:6] == [r"\begin{table*}[t]", r"\centering", r"\caption{Accuracy at $\varepsilon$}",
                          r"\label{tab:lb}"]
    assert lines[-1] == r"\end{table*}" and "double width 469 pt" in lines[0]
    assert "single width 229.5 pt" in render(board, "latex", float_env="table").splitlines()[0]
    assert "252 pt" in render(board, "latex", venue_name="ieee").splitlines()[0]
    assert "width 300 pt" in render(board, "latex", width=300).splitlines()[0]
    with pytest.raises(ValueError, match="unknown float"):
        render(board, "latex", float_env="figure")
    with pytest.raises(ValueError, match="need a float"):
        render(board, "latex", caption="x")
    with pytest.raises(ValueError, match="unknown width"):
        render(board, "latex", width="triple")


def test_layout_prefers_one_table_at_the_largest_size_that_fits():
    from dashboards.latex import columns
    from dashboards.render import display

    board = rows(BOARD_RECORDS)
    headers = [h for h, _ in display(board, "core") if h != "runs"]
    cols = columns(board, headers, "accuracy", set())
    wide = layout({False: cols, True: cols}, 2000.0, VENUES["article"], [])
    assert (wide.size, wide.abbreviated, wide.separation, len(wide.parts)) == (10, False, 6.0, 1)
    narrow = layout({False: cols, True: cols}, 150.0, VENUES["article"], [])
    assert narrow.size == 8 and len(narrow.parts) > 1
    assert all(p[0].header == "mechanism" and p[1].header == "eps target" for p in narrow.parts)


def test_escape_covers_latex_specials():
    assert latex_escape("a_b&c%d$e#f{g}h~i^j\\k") == (
        r"a\_b\&c\%d\$e\#f\{g\}h\textasciitilde{}i\textasciicircum{}j\textbackslash{}k")


def test_glyph_widths_are_what_the_tfm_files_say():
    """dashboards/tex_metrics.py is generated from TeX's font metrics (scripts/tex_metrics.py)."""
    done = subprocess.run([sys.executable, "scripts/tex_metrics.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_venues_name_their_sizes():
    assert VENUES["article"].column_pt == 229.5 and VENUES["article"].text_pt == 469.0
    assert VENUES["acm"].width_in("double") == pytest.approx(7.0, abs=0.01)
    assert VENUES["ieee"].width_in("single") == pytest.approx(3.49, abs=0.01)


def test_single_columns_are_selectable():
    """A paper's table: accuracy with the claimed, certified and audited epsilon, nothing else."""
    from storage import schema

    assert schema.select("utility,eps claimed,epsilon_certified,eps audited") == (
        "utility", "eps claimed", "eps certified", "eps audited")
    assert schema.select("audit") == ("core", "audit")
    with pytest.raises(ValueError, match="unknown column group or column 'eps claim'"):
        schema.select("eps claim")
    text = render(rows(BOARD_RECORDS), "latex", columns="utility,eps claimed,eps certified,eps audited")
    (table,) = tabulars(text)
    assert table[0] == r"\begin{tabular}{@{}lrr@{}lrrr@{}}"  # mechanism, target, mean, +- std, three epsilons
    markdown = render(rows(BOARD_RECORDS), "markdown", columns="eps claimed,utility")
    assert markdown.splitlines()[0] == "| dataset | model | mechanism | eps target | utility | eps claimed |"


def test_the_legend_is_no_wider_than_its_table_and_a_bare_table_is_a_paragraph_of_its_own():
    """Issue 48, 5: a `table*` legend ran the full text width beside a narrower table, a bare table's legend
    broke across columns, and a bare table input right after a line of text was set inside its paragraph."""
    for float_env, columns in (("table*", "all"), ("none", "privacy,audit"), ("none", "core")):
        text = render(rows(BOARD_RECORDS), "latex", columns=columns, float_env=float_env)
        boxes = legends(text)
        assert boxes, (float_env, columns)
        page = float(re.search(r"width ([\d.]+) pt", text.splitlines()[0]).group(1))  # the column or text width
        starred = re.findall(r"\\begin\{tabular\*\}\{([\d.]+)pt\}", text)
        for width, _ in boxes:  # an unbreakable box as wide as its table, less than the page's width
            assert float(width) == float(starred[0]) if starred else float(width) < page - 1
        if float_env == "none":
            body = text.split("\n", 2)[2]  # after the two comment lines
            assert body.startswith("\\par\\medskip\n") and body.rstrip().endswith("\\medskip")
