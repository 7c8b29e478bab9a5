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

IEEETRAN = r"\documentclass[conference]{IEEEtran}"  # the class itself, as an IEEE paper starts (setup.sh installs it)
# A two-column document of each venue: the classes themselves where setup.sh installs them, else their page
# geometry (checked below against the venue's numbers) and body size in the standard classes.
PREAMBLES = {
    "article": r"\documentclass[twocolumn]{article}",
    "acm": r"\documentclass[twocolumn,9pt]{extarticle}" "\n"
           r"\usepackage[letterpaper,textwidth=506.295pt,columnsep=24pt]{geometry}",
    "ieee": IEEETRAN,
}
# The smallest text a venue's tables may hold, in pt: 8, but IEEEtran sets captions in small caps (Times'
# capitals at 80%: "(continued)" at 6.4 pt), which the class, not the table, decides.
SMALLEST = {"ieee": 8 * 0.8}
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


def kpsewhich(name: str) -> str:
    """Where TeX finds file `name` ('' when it does not)."""
    assert shutil.which("kpsewhich"), "kpsewhich missing: apt-get install texlive-latex-recommended"
    return subprocess.run(["kpsewhich", name], capture_output=True, text=True, timeout=60).stdout.strip()


def measured(table: str, stem: str) -> str:
    """TeX that typesets each of the table's tabulars (a split table has one per part) in its font, in a box
    that is never shipped out, and writes its width to the log: `TABULAR stem 245.1pt`."""
    font = re.search(r"\\fontsize\{[\d.]+\}\{[\d.]+\}\\selectfont\\setlength\{\\tabcolsep\}\{[\d.]+pt\}", table)[0]
    parts = re.findall(r"^\\begin\{tabular\*?\}.*?^\\end\{tabular\*?\}$", table, re.M | re.S)
    assert parts, table[:500]
    return "".join(f"\\setbox0\\hbox{{{font}%\n{part}}}\\typeout{{TABULAR {stem} \\the\\wd0}}\n" for part in parts)


def compile_tables(tmp_path: Path, venue: str, width: str, boards: dict[str, list]) -> tuple[str, float]:
    """pdflatex on one document holding every table of `boards` at `width`; (its log, smallest text in pt).
    The log holds each tabular's width (`measured`)."""
    assert shutil.which("pdflatex"), "pdflatex missing: apt-get install texlive-latex-recommended"
    for name in ("IEEEtran.cls", "ptmr7t.tfm") if venue == "ieee" else ():  # the class and its Times: fail, never skip
        assert kpsewhich(name), f"{name} missing: scripts/setup.sh installs it (texlive-publishers, -fonts-recommended)"
    tmp_path.mkdir(parents=True, exist_ok=True)
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
                body.append(f"{measured(table, stem)}Text before the table.\n\n\\input{{{stem}}}\n\nText after it."
                            "\n\\clearpage")
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
    assert smallest >= SMALLEST.get(venue, 8) - 0.01


def test_tables_for_ieee_compile_in_the_real_ieeetran_class(tmp_path):
    """`--venue ieee` was tested only by imitating IEEEtran's page in `article` (issue 48, 5); scripts/setup.sh
    installs the class and its Times fonts, so every column set at both widths, bare and in a float, with the
    longest registered names and the stress rows, is compiled in `\\documentclass[conference]{IEEEtran}`: the
    class's own column and text widths are the venue's, no Overfull or Underfull box, every tabular no wider
    than the column (or text) it is made for, and the text set in Times. A machine without the class fails
    here, naming what setup.sh installs (never a skip: the venue would go untested unseen)."""
    boards = {"stress": rows(stress_records()), "longest": longest_names_board()}
    for width in ("single", "double"):
        log, smallest = compile_tables(tmp_path / width, "ieee", width, boards)
        assert re.search(r"Document Class: IEEEtran", log), log[:2000]
        bad = [ln for ln in log.splitlines() if ln.startswith(("Overfull", "Underfull"))]
        assert not bad, (width, bad)
        assert "Undefined control sequence" not in log and "Float too large" not in log
        tabulars = re.findall(r"^TABULAR (\S+) ([\d.]+)pt$", log, re.M)
        # every table of the document measured: a split table's parts each once
        assert {stem for stem, _ in tabulars} == {f"{b}-{c}-{f}" for b in boards for c in COLUMN_SETS
                                                  for f in ("none", "table")}
        too_wide = [(stem, pt) for stem, pt in tabulars if float(pt) > VENUES["ieee"].width_pt(width) + 0.01]
        assert not too_wide, (width, too_wide)
        fonts = set(re.findall(rb"/BaseFont\s*/[A-Z]{6}\+([\w-]+)", (tmp_path / width / "paper.pdf").read_bytes()))
        assert any(f.startswith((b"NimbusRomNo9L", b"Times")) for f in fonts), fonts  # IEEEtran's Times
        assert smallest >= SMALLEST["ieee"] - 0.01


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
