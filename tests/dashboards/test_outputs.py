"""What a user sees: a leaderboard that fits the terminal, `--columns`, paper-ready figure files, and
one-line errors (issue 21's terminal and figure items; issue 23 #7, #16, #20)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dashboards.leaderboard import rows
from dashboards.render import render
from tests.dashboards.test_leaderboard import RECORDS, record

ROOT = Path(__file__).resolve().parents[2]


def privbench(*args, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    """The real program in a subprocess: rich measures the width from COLUMNS, as in a terminal."""
    return subprocess.run([sys.executable, "-m", "orchestrator", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, **kwargs)


def invoke(*args):
    from orchestrator.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("columns", [80, 120])
def test_default_leaderboard_fits_the_terminal_with_no_cut_cell(figure_store, columns):
    done = privbench("leaderboard", "figs", "figs-b", "--store", figure_store, env={"COLUMNS": str(columns)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "…" not in done.stdout and max(len(ln) for ln in lines) <= columns
    body = [ln.split() for ln in lines if ln.strip().startswith(("dpsgd", "gredp", "nonprivate"))
            and ": violated by its audits: " not in ln]  # those lines say under the table why a row is violated
    assert len(body) == 5 + 2  # every row on one line: nothing wrapped
    # mechanism, target, mean ± std, certified, audited, status, step x, runs: no cell cut or wrapped; figs-b's
    # rows are one run each (mean alone, no ± std)
    assert sorted(cells.count("±") for cells in body) == [0, 0] + [1] * 5
    text = " ".join(lines)
    for header in ("mechanism", "utility", "certified", "audited", "status", "step x", "runs"):
        assert header in text


def test_piped_leaderboard_keeps_whole_headers_and_columns_select_groups(figure_store):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "leaderboard", "figs", "--store", str(figure_store),
                           "--columns", "all"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=env | {"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "…" not in done.stdout
    words = done.stdout.split()  # a header may stand on two lines (`MIA` over `AUC`), never split in a word
    for header in ("ceiling", "MIA AUC", "mu claimed/audited", "sigma", "peak MB", "ex/s", "pareto"):
        assert all(w in words for w in header.split()), header
    rows_ = [ln for ln in done.stdout.splitlines() if ln.strip().startswith(("dpsgd", "gredp", "nonprivate"))]
    assert len(rows_) == 5 and all("±" in ln for ln in rows_)  # one line per row: nothing folded
    md = invoke("leaderboard", "figs", "--store", figure_store, "--format", "markdown", "--columns", "audit,overhead")
    header = md.stdout.splitlines()[0]
    assert "eps curve" in header and "peak MB" in header and "eps claimed" not in header and "utility" in header
    bad = invoke("leaderboard", "figs", "--store", figure_store, "--columns", "fancy")
    assert bad.exit_code == 2 and "unknown column group or column 'fancy'" in bad.output


def test_markdown_escapes_html_in_names_as_the_html_outputs_do():
    """Issue 23 #7: a name is data; a Markdown viewer would render `<script>` raw."""
    hostile = [record("hf:<script>alert(1)</script>|x", 1.0, 0, 0.8, certified=1.0, claimed=1.0)]
    md = render(rows(RECORDS + hostile), "markdown")
    assert "<script>" not in md and "&lt;script&gt;alert(1)&lt;/script&gt;\\|x" in md
    assert all(line.count(" | ") == md.splitlines()[0].count(" | ") for line in md.splitlines()[2:])


def test_leaderboard_on_a_sweep_whose_trials_all_failed_says_so(tmp_path):
    """Issue 23 #20: not "unknown metric 'accuracy'; the records have: wall_s"."""
    from storage.location import resolve
    from storage.store import Store

    configs = [{"trial_key": f"k{i}", "dataset": "digits", "model": "mlp", "mechanism": "dpsgd", "epsilon": 1.0,
                "seed": i} for i in range(3)]
    st = Store(resolve(tmp_path / "store"), create=True)
    st.open_sweep("broken", "yaml", configs)
    for i, cfg in enumerate(configs):
        st.record({"sweep": "broken", "trial_key": cfg["trial_key"], "status": "failed", "config": cfg,
                   "metrics": {"wall_s": 0.1}, "error": f"ValueError: bad learning rate {i}\nsecond line"})
    st.close()
    for command in ("leaderboard", "report", "plot"):
        out = tmp_path / {"leaderboard": "t.md", "report": "r.html", "plot": "f.pdf"}[command]
        result = invoke(command, "broken", "--store", tmp_path / "store", "--out", out)
        assert result.exit_code == 1 and not out.exists()
        assert "all 3 trials failed: first error ValueError: bad learning rate" in result.output
        assert "unknown metric" not in result.output and "second line" not in result.output


def test_plot_onto_an_unwritable_file_is_one_line_and_exit_2(figure_store, tmp_path):
    """Issue 23 #16. The suite runs as root, so the write permission is taken away with setpriv."""
    assert shutil.which("setpriv"), "setpriv (util-linux) missing"
    target = tmp_path / "locked.pdf"
    target.write_bytes(b"")
    target.chmod(0o444)
    done = subprocess.run(["setpriv", "--inh-caps=-dac_override", "--bounding-set=-dac_override",
                           sys.executable, "-m", "orchestrator", "plot", "figs", "--store", str(figure_store),
                           "--out", str(target)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: cannot write {target}: Permission denied"]
    assert target.read_bytes() == b""


def test_pdf_figures_embed_no_type3_font_at_paper_widths(figure_store, tmp_path):
    """IEEE's and ACM's checks reject Type 3 fonts; `--size` gives the default venue's column and text widths."""
    assert shutil.which("pdffonts"), "pdffonts missing: scripts/setup.sh installs poppler-utils"
    for kind in ("privacy-utility", "overhead", "curves", "verdicts"):
        for size, inches in (("single", 229.5 / 72.27), ("double", 469 / 72.27)):  # the article's widths
            out = tmp_path / f"{kind}-{size}.pdf"
            assert invoke("plot", "figs", "--kind", kind, "--size", size, "--out", out,
                          "--store", figure_store).exit_code == 0
            fonts = subprocess.run(["pdffonts", str(out)], capture_output=True, text=True, check=True).stdout
            rows_ = fonts.splitlines()[2:]
            assert rows_ and not any("Type 3" in r for r in rows_), fonts
            assert all("TrueType" in r for r in rows_), fonts
            info = subprocess.run(["pdfinfo", str(out)], capture_output=True, text=True, check=True).stdout
            width = float(next(ln for ln in info.splitlines() if ln.startswith("Page size")).split()[2])
            assert width == pytest.approx(inches * 72, abs=1)
    bad = invoke("plot", "figs", "--size", "poster", "--out", tmp_path / "x.pdf", "--store", figure_store)
    assert bad.exit_code == 2 and "unknown size 'poster'" in bad.output


def test_pgf_works_with_a_tex_engine_and_is_one_line_without(figure_store, tmp_path):
    from dashboards.figures import tex_engine

    out = tmp_path / "fig.pgf"
    bare = {"PATH": str(Path(sys.executable).parent)}  # python, but no TeX
    done = privbench("plot", "figs", "--out", out, "--store", figure_store, env=bare)
    assert done.returncode == 2 and not out.exists()
    assert done.stderr.strip().splitlines() == [
        "error: --out .pgf needs a TeX engine (xelatex, lualatex or pdflatex) on PATH; use .pdf or .svg otherwise"]
    assert tex_engine(), "no TeX engine: scripts/setup.sh installs texlive-latex-recommended (pdflatex)"
    result = invoke("plot", "figs", "--out", out, "--store", figure_store)
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("%% Creator: Matplotlib, PGF backend") and "\\begin{pgfpicture}" in text


def test_the_sweep_runs_figures_are_png_and_an_all_ok_verdicts_figure_is_left_out(figure_store):
    """`sweep run` attaches PNGs for MLflow's artifact viewer (the PDFs for papers come from `privbench plot`,
    checked above), and leaves out the verdicts figure when every verdict is `ok`, as the report does."""
    from dashboards.figures import KINDS
    from dashboards.summary import sweep_files
    from storage.store import Store

    records = Store(str(figure_store)).records("figs")
    files = sweep_files(records)
    header = files["leaderboard.md"].splitlines()[0]
    assert set(render([], "markdown", columns="all").splitlines()[0].split(" | ")) <= set(header.split(" | "))
    figures = {name for name in files if name.startswith("figures/")}
    assert figures == {f"figures/{kind}.png" for kind in KINDS}  # GReDP is violated in figs: verdicts tell
    assert all(files[name].startswith(b"\x89PNG") for name in figures)
    all_ok = [r for r in records if r["config"]["mechanism"] != "gredp"]
    assert {r["privacy"]["claim_status"] for r in all_ok if (r["privacy"] or {}).get("private")} == {"ok"}
    kept = sweep_files(all_ok)
    assert "figures/verdicts.png" not in kept and "figures/curves.png" in kept


def test_plan_accelerator_and_analysis_seconds_show_in_the_overhead_columns_when_recorded():
    timed = [dict(r, metrics=r["metrics"] | {"plan_s": 0.5 + r["config"]["seed"], "accelerator_s": 2.0,
                                             "analysis_s": 1.0}) for r in RECORDS]
    header = render(rows(timed), "markdown", columns="overhead").splitlines()[0]
    assert "| plan s | accel s | analysis s |" in header
    (dp,) = [r for r in rows(timed) if r.mechanism == "dpsgd"]
    assert dp.plan_s == pytest.approx(1.0)  # mean over the two seeds
    assert "plan s" not in render(rows(timed), "markdown").splitlines()[0]  # not a core column
    assert "plan s" not in render(rows(RECORDS), "markdown", columns="overhead").splitlines()[0]  # older records
