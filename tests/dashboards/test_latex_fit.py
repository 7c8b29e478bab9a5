"""Every LaTeX table privbench writes, compiled with pdflatex in a two-column paper of each venue, at both
widths, with every column group, bare and in a float: no Overfull or Underfull box, no text below 8 pt.

Text sizes are read from the PDF itself (uncompressed: each `Tf` operator sets the size of the text after
it), so a superscript or a table shrunk by any means would show. Slow: about 20 pdflatex runs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dashboards.leaderboard import rows
from dashboards.render import render
from dashboards.venues import VENUES
from tests.dashboards.test_latex import BOARD_RECORDS
from tests.dashboards.test_leaderboard import RECORDS, record

# A two-column document of each venue: the classes themselves where TeX Live has them, else their page
# geometry (checked below against the venue's numbers) and body size in the standard classes.
PREAMBLES = {
    "article": r"\documentclass[twocolumn]{article}",
    "acm": r"\documentclass[twocolumn,9pt]{extarticle}" "\n"
           r"\usepackage[letterpaper,textwidth=506.295pt,columnsep=24pt]{geometry}",
    "ieee": r"\documentclass[twocolumn]{article}" "\n"
            r"\usepackage[letterpaper,textwidth=516pt,columnsep=12pt]{geometry}",
}
COLUMN_SETS = ("core", "privacy", "audit", "overhead", "all")
TEX_POINTS_PER_PDF_POINT = 72.27 / 72


def stress_records() -> list[dict]:
    """Long names, every status, an infinite bound, an audit above its ceiling, large throughputs, two datasets
    and a failed trial."""
    recs = list(BOARD_RECORDS)
    for seed in (0, 1):
        r = record("shuffled-dpsgd", 8.0, seed, 0.61 + seed / 100, certified=float("inf"), claimed=8.0,
                   claim="overclaimed")
        r["metrics"]["examples_per_s"] = 15912.7
        r["privacy"] |= {"audit_above_ceiling": seed == 1, "audit_ceiling": 3.5, "epsilon_audited": 4.2}
        recs.append(r)
    other = [dict(r, config=r["config"] | {"dataset": "fashion-mnist", "model": "cnn-small"}) for r in RECORDS]
    return recs + other


def compile_tables(tmp_path: Path, venue: str, width: str, boards: dict[str, list]) -> tuple[str, float]:
    """pdflatex on one document holding every table of `boards` at `width`; (its log, smallest text in pt)."""
    assert shutil.which("pdflatex"), "pdflatex missing: apt-get install texlive-latex-recommended"
    body = []
    for name, board in boards.items():
        for columns in COLUMN_SETS:
            for float_env in ("none", "table*" if width == "double" else "table"):
                stem = f"{name}-{columns}-{float_env.strip('*')}"
                table = render(board, "latex", columns=columns, float_env=float_env, width=width, venue_name=venue,
                               caption=f"{name}, {columns}" if float_env != "none" else None)
                if float_env == "none" and width == "double":  # a bare table of text width goes in a table*
                    table = "\\begin{table*}[p]\n" + table + "\\end{table*}\n"
                (tmp_path / f"{stem}.tex").write_text(table)
                body.append(f"Text before the table.\n\n\\input{{{stem}}}\n\nText after it.\n\\clearpage")
    (tmp_path / "paper.tex").write_text(  # ragged bottom: a bare table taller than a column breaks between parts
        "\\pdfcompresslevel=0\\pdfobjcompresslevel=0\n" + PREAMBLES[venue] + "\n\\usepackage{booktabs}\n"
        "\\raggedbottom\n"
        "\\begin{document}\n\\typeout{WIDTHS \\the\\columnwidth\\space\\the\\textwidth}\n"
        + "\n".join(body) + "\n\\end{document}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    log = (tmp_path / "paper.log").read_text(errors="replace")
    assert done.returncode == 0, done.stdout[-3000:]
    column, text = re.search(r"WIDTHS ([\d.]+)pt ([\d.]+)pt", log).groups()
    assert (float(column), float(text)) == pytest.approx((VENUES[venue].column_pt, VENUES[venue].text_pt), abs=0.01)
    sizes = [float(s) for s in re.findall(rb"/F\d+ ([\d.]+) Tf", (tmp_path / "paper.pdf").read_bytes())]
    return log, min(sizes) * TEX_POINTS_PER_PDF_POINT


@pytest.fixture(scope="module")
def boards(figure_store) -> dict[str, list]:
    from storage.store import Store

    store = Store(str(figure_store))
    real = rows(store.records("figs") + store.records("figs-b"))
    return {"stress": rows(stress_records()), "sweeps": real}


@pytest.mark.slow
@pytest.mark.parametrize("width", ["single", "double"])
@pytest.mark.parametrize("venue", sorted(VENUES))
def test_every_table_compiles_without_bad_boxes_or_small_text(tmp_path, boards, venue, width, capsys):
    log, smallest = compile_tables(tmp_path, venue, width, boards)
    bad = [ln for ln in log.splitlines() if ln.startswith(("Overfull", "Underfull"))]
    assert not bad, bad
    assert "Undefined control sequence" not in log and "Missing $" not in log and "Float too large" not in log
    with capsys.disabled():
        print(f"\n{venue} {width}: {len(COLUMN_SETS) * 2 * len(boards)} tables, smallest text {smallest:.2f} pt")
    assert smallest >= 8 - 0.01


def longest_names_board() -> list:
    """The eight widest registered mechanism names (the longest among them; eight, so that the float's height
    does not grow with the registry: the test is about widths) on the registry's widest dataset and model (in
    the italic of the block title), two seeds, target epsilon 1 and 8, audited, every status."""
    from dashboards.latex import text
    from mechanisms.framework import registry
    from workers.datasets import contract as datasets
    from workers.models import contract as models

    def widest(names: list[str]) -> str:
        return max(names, key=lambda n: text(n, "cmti").width(10))

    dataset, model = widest(datasets.names()), widest(models.names())
    recs = []
    widest_mechanisms = sorted(registry.names(), key=lambda n: -text(n).width(10))[:8]
    for i, mechanism in enumerate(sorted(widest_mechanisms)):
        for eps in (None,) if mechanism == "nonprivate" else (1.0, 8.0):
            for seed in (0, 1):
                r = record(mechanism, eps, seed, 0.8 + seed / 100, certified=eps and eps * 1.0137, claimed=eps,
                           claim=("ok", "overclaimed", "violated", "uncertified")[i % 4])
                r["config"] |= {"dataset": dataset, "model": model}
                r["metrics"]["examples_per_s"] = 15912.7
                if eps:
                    r["privacy"] |= {"epsilon_audited": 0.1234, "audit_ceiling": 3.5, "mu_claimed": 0.917,
                                     "mu_audited": 0.884}
                recs.append(r)
    assert max(map(len, registry.names())) >= len("dpsgd-shuffle-rdp")
    return rows(recs)


def test_the_longest_registered_names_fit_single_and_double_width(tmp_path):
    """In `\\documentclass[twocolumn,10pt]{article}`: the core and the full selection, bare and in a float, at
    one column's and at the text's width: no Overfull box (the issue saw 25.96 pt, 35.25 pt with all columns)."""
    assert shutil.which("pdflatex"), "pdflatex missing: apt-get install texlive-latex-recommended"
    board, body = longest_names_board(), []
    for width, float_env in (("single", "table"), ("double", "table*")):
        for columns in ("core", "all"):
            for env in ("none", float_env):
                table = render(board, "latex", columns=columns, width=width, float_env=env,
                               caption=f"{columns} at {width} width" if env != "none" else None)
                if env == "none" and width == "double":
                    table = "\\begin{table*}[p]\n" + table + "\\end{table*}\n"
                body.append(f"Text before.\n\n{table}\nText after.\n\\clearpage")
    (tmp_path / "paper.tex").write_text("\\documentclass[twocolumn,10pt]{article}\n\\usepackage{booktabs}\n"
                                        "\\raggedbottom\n\\begin{document}\n" + "\n".join(body) + "\n\\end{document}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    log = (tmp_path / "paper.log").read_text(errors="replace")
    assert done.returncode == 0, done.stdout[-3000:]
    assert re.findall(r"Overfull \\hbox \(([\d.]+)pt", log) == []
    assert "Float too large" not in log
