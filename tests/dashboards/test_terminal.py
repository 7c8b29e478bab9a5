"""Terminal tables as a person sees them: the real program on a pseudo-terminal of 80 and 120 columns
(rich reads the width from the terminal, no COLUMNS), every `--columns` group. No line is wider than the
terminal, no cell is wrapped or cut (every cell of the Markdown table appears whole), and a selection too
wide for the terminal folds into stacked tables that repeat the key columns. Also: `sweep status` keeps
the trial key whole, ASCII-only output, no trailing spaces when piped, and `wrote FILE` for every --out."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from storage.schema import shown, utility_field

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
GROUPS = ("core", "privacy", "audit", "overhead", "all")


def on_terminal(columns: int, *args: str) -> list[str]:
    """The program's output lines on a pseudo-terminal `columns` wide, colours removed."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {
        "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}
    child = pexpect.spawn(sys.executable, ["-m", "orchestrator", *args], cwd=str(ROOT), env=env,
                          dimensions=(200, columns), encoding="utf-8", timeout=300)
    text = child.read()
    child.close()
    assert child.exitstatus == 0, text[-2000:]
    return [ANSI.sub("", line) for line in text.replace("\r\n", "\n").split("\n")]


def markdown_cells(store: Path, columns: str) -> list[list[str]]:
    done = subprocess.run([sys.executable, "-m", "orchestrator", "leaderboard", "figs", "--store", str(store),
                           "--format", "markdown", "--columns", columns], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, [c.strip() for c in ln.strip("|").split("|")], strict=True)) for ln in lines[1:]]


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("columns", GROUPS)
def test_leaderboard_on_a_terminal_never_splits_a_cell(figure_store, width, columns):
    lines = on_terminal(width, "leaderboard", "figs", "--store", str(figure_store), "--columns", columns)
    assert max(len(ln) for ln in lines) <= width
    assert "…" not in "\n".join(lines)
    rows = markdown_cells(figure_store, columns)
    body = [ln for ln in lines if ln.startswith((" dpsgd", " gredp", " nonprivate"))]
    parts = sum(1 for ln in lines if ln.lstrip().startswith("mechanism"))
    assert len(body) == len(rows) * parts  # one line per row in every part: nothing wrapped
    for row in rows:
        mine = [ln for ln in body if ln.split()[0] == row["mechanism"] and ln.split()[1] == row["eps target"]]
        assert len(mine) == parts, (row, mine)
        shown = "  ".join(mine)
        for header, cell in row.items():
            if header == "violation":  # in words under the table, not a column (sentences would fold it)
                assert cell == "-" or any(ln.startswith(f"{row['mechanism']} eps {row['eps target']}: violated by")
                                          and cell in ln for ln in lines), (row, lines)
            elif header not in ("dataset", "model") and cell:
                assert re.search(rf"(^|\s){re.escape(cell.replace('&#x27;', chr(39)))}(\s|$)", shown), (header, cell,
                                                                                                      mine)
    if parts > 1:
        assert any(ln.startswith(f"(folded into {parts} tables to fit {width} columns") for ln in lines)
    if columns == "core":
        assert parts == 1  # the default fits 80 columns in one table


@pytest.mark.parametrize("width", [80, 120])
def test_sweep_status_keeps_the_trial_key_and_numbers_whole(figure_store, width):
    import json

    done = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "status", "figs", "--store",
                           str(figure_store), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    trials = json.loads(done.stdout)["trials"]
    lines = on_terminal(width, "sweep", "status", "figs", "--store", str(figure_store))
    assert max(len(ln) for ln in lines) <= width
    for t in trials:
        (line,) = [ln for ln in lines if t["trial_key"] in ln.split()]
        assert t["status"] in line.split() and shown(t["accuracy"], utility_field("accuracy")) in line.split()
        assert str(t["seed"]) in line.split()


def test_ascii_only_output_spells_plus_minus_and_never_raises(figure_store, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "ascii"}
    for args in (["leaderboard", "figs"], ["leaderboard", "figs", "--format", "markdown", "--columns", "all"],
                 ["sweep", "status", "figs"], ["plot", "figs", "--out", str(tmp_path / "f.pdf")]):
        done = subprocess.run([sys.executable, "-m", "orchestrator", *args, "--store", str(figure_store)], cwd=ROOT,
                              capture_output=True, timeout=300, env=env)
        assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
        done.stdout.decode("ascii")  # nothing but ASCII
        if args[0] == "leaderboard":
            assert b"+-" in done.stdout


def test_piped_output_has_no_trailing_spaces(figure_store):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONPATH": str(ROOT)}
    for args in (["leaderboard", "figs", "--columns", "all"], ["leaderboard", "figs"], ["sweep", "status", "figs"],
                 ["sweep", "list"]):
        done = subprocess.run([sys.executable, "-m", "orchestrator", *args, "--store", str(figure_store)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() and not [ln for ln in done.stdout.splitlines() if ln != ln.rstrip()], done.stdout


def test_every_command_that_writes_a_file_says_so(figure_store, tmp_path):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    runner = CliRunner()
    for args, name in ((["export", "figs", "--format", "csv"], "e.csv"), (["export", "figs"], "e.json"),
                       (["leaderboard", "figs", "--format", "latex"], "t.tex"), (["leaderboard", "figs"], "t.md"),
                       (["plot", "figs"], "f.pdf"), (["report", "figs"], "r.html")):
        target = tmp_path / name
        result = runner.invoke(app, [*args, "--store", str(figure_store), "--out", str(target)],
                               catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert result.stdout.strip().splitlines() == [f"wrote {target}"] and target.stat().st_size > 100
