"""`leaderboard --format latex`: a booktabs tabular a paper can \\input (structure checked here, compiled
with pdflatex in the slow test)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from dashboards.leaderboard import rows
from dashboards.render import latex_escape, render
from tests.dashboards.test_leaderboard import RECORDS, record

BOARD_RECORDS = RECORDS + [record("dp_forward&50%", 1.0, 0, 0.70, certified=None, claimed=1.0, claim="uncertified")]


def body_rows(text: str) -> list[str]:
    lines = text.splitlines()
    start, end = lines.index(r"\midrule"), lines.index(r"\bottomrule")
    return [ln for ln in lines[start + 1:end] if ln not in (r"\midrule",) and not ln.startswith(r"\multicolumn")]


def test_latex_is_booktabs_with_math_utilities_right_aligned_numbers_and_escaped_names():
    text = render(rows(BOARD_RECORDS), "latex")
    assert "±" not in text and "\\toprule" in text and "\\bottomrule" in text
    spec = re.search(r"\\begin\{tabular\}\{([lrc]+)\}", text).group(1)
    # The default columns are the compact core set (a paper column's width); mechanism and status left,
    # every numeric column right. `--columns all` gives every displayed column.
    assert spec == "lrrrrlr"
    wide = render(rows(BOARD_RECORDS), "latex", columns="all")
    assert re.search(r"\\begin\{tabular\}\{([lrc]+)\}", wide).group(1) == "lrrrrrrrrrrrlrrrrrr"
    header = text.splitlines()[text.splitlines().index(r"\toprule") + 1]
    assert header.endswith(r"\\") and header.count("&") == len(spec) - 1
    body = body_rows(text)
    assert len(body) == 4
    for line in body:
        assert line.endswith(r"\\") and line.count("&") - line.count(r"\&") == len(spec) - 1
        assert line.count("$") % 2 == 0  # every math span closed
    assert r"$0.8100 \pm 0.0141$" in text  # dpsgd: 0.80 and 0.82 over two seeds
    assert r"\texttt{dp\_forward\&50\%}" in text


def test_best_private_utility_per_target_epsilon_is_bold_and_only_it():
    text = render(rows(BOARD_RECORDS), "latex")
    bold = [ln for ln in body_rows(text) if r"\mathbf" in ln]
    assert len(bold) == 1 and "gredp" in bold[0]  # 0.855 beats dpsgd's 0.81 and dp_forward's 0.70 at eps 1
    # A lone private mechanism at its epsilon is that epsilon's best (the quickstart's case: docs/commands.md
    # promises a bold cell per epsilon); the non-private reference never is.
    alone = body_rows(render(rows([r for r in RECORDS if r["config"]["mechanism"] != "gredp"]), "latex"))
    assert [("dpsgd" in ln) for ln in alone if r"\mathbf" in ln] == [True]
    assert not any(r"\mathbf" in ln for ln in alone if "nonprivate" in ln)


def test_escape_covers_latex_specials():
    assert latex_escape("a_b&c%d$e#f{g}h~i^j\\k") == (
        r"a\_b\&c\%d\$e\#f\{g\}h\textasciitilde{}i\textasciicircum{}j\textbackslash{}k")


def test_float_wraps_the_shrunk_tabular():
    text = render(rows(BOARD_RECORDS), "latex", float_env="table*")
    lines = text.splitlines()
    assert lines[1:3] == [r"\begin{table*}[t]", r"\centering"] and lines[-1] == r"\end{table*}"
    assert r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%" in lines  # no indent in a float
    with pytest.raises(ValueError, match="unknown float"):
        render(rows(BOARD_RECORDS), "latex", float_env="figure")


@pytest.mark.slow
@pytest.mark.parametrize(("columns", "float_env"), [("core", "none"), ("all", "none"), ("all", "table*"),
                                                    ("privacy,audit", "table")])
def test_latex_table_compiles_with_pdflatex_in_a_two_column_paper_without_overfull_boxes(tmp_path, columns,
                                                                                         float_env):
    """Debian's texlive-latex-recommended (scripts/setup.sh installs it) provides pdflatex, booktabs and
    graphicx. The default table, and the widest one, fit a column of a two-column article."""
    assert shutil.which("pdflatex"), "pdflatex missing: apt-get install texlive-latex-recommended"
    (tmp_path / "table.tex").write_text(render(rows(BOARD_RECORDS), "latex", columns=columns, float_env=float_env))
    (tmp_path / "paper.tex").write_text("\\documentclass[twocolumn]{article}\n\\usepackage{booktabs}\n"
                                        "\\usepackage{graphicx}\n\\begin{document}\nSome text.\n\n"
                                        "\\input{table}\n\nMore text.\n\\end{document}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert (tmp_path / "paper.pdf").stat().st_size > 1000
    log = (tmp_path / "paper.log").read_text(errors="replace")
    assert "Undefined control sequence" not in log and "Missing $" not in log
    assert "Overfull" not in log, [ln for ln in log.splitlines() if "Overfull" in ln]
