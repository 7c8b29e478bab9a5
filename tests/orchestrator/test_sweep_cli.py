"""A piped sweep says when each trial starts, not only when it ends (issue 41: a piped `sweep run` printed
nothing for the 1.5 minutes before its first trial finished). The driver's own progress callback, on a console
that is not a terminal, as `privbench sweep run ... | tee log` gives it. Its numbers, and `sweep status`'s, are
written as the leaderboard writes them (issue 48: `acc 0.7604` where every other output printed 76.0)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from orchestrator import grid, sweep_cli
from orchestrator.runner import load_grid
from storage.location import resolve
from storage.store import Store

GRID = ("name: piped\nseeds: [0, 1]\ngrid: {dataset: [digits], model: [mlp], mechanism: [dpsgd], epsilon: [1]}\n"
        "train: {epochs: 1}\n")


def run_callbacks(monkeypatch, tmp_path, terminal: bool) -> tuple[list[str], str]:
    (tmp_path / "g.yaml").write_text(GRID)
    spec = load_grid(tmp_path / "g.yaml")
    buf = io.StringIO()
    monkeypatch.setattr(sweep_cli, "err", Console(file=buf, force_terminal=terminal, width=120))
    seen = []
    with sweep_cli.RichProgress() as progress:
        progress.on_sweep_start(spec, spec.trials, 2, str(tmp_path / "store"))
        for config in spec.trials:
            progress.on_trial_start(config)
            seen.append(buf.getvalue())  # what the pipe holds once the trial is under way
        first = spec.trials[0]
        progress.on_trial_result({"trial_key": first.trial_key, "status": "finished", "config": first.to_dict(),
                                  "metrics": {"accuracy": 0.76044}, "privacy": {"epsilon_certified": 1.0012}}, "run")
    return seen, buf.getvalue()


def test_a_piped_sweep_prints_a_line_when_each_trial_starts(monkeypatch, tmp_path):
    seen, text = run_callbacks(monkeypatch, tmp_path, terminal=False)
    assert "dpsgd digits/mlp eps=1 seed=0: started" in seen[0]
    assert "dpsgd digits/mlp eps=1 seed=1: started" in seen[1]
    lines = text.splitlines()
    assert lines.index("  dpsgd digits/mlp eps=1 seed=0: started") < lines.index(
        "  dpsgd digits/mlp eps=1 seed=0: done acc 76.0% eps 1.01")  # in %; the upper bound rounded up


def test_a_terminal_shows_starting_trials_as_bars_not_lines(monkeypatch, tmp_path):
    _, text = run_callbacks(monkeypatch, tmp_path, terminal=True)
    assert ": started" not in text and "starting" in text


def test_an_80_column_terminal_shows_every_number_of_a_long_trial_label(monkeypatch, tmp_path):
    """The bar shrinks before the steps, the epoch, the loss and the time are cut (they read "585/…" and "0:00:…"
    on 80 columns, under the quickstart's longest label); on a wide terminal the bar keeps its 40 columns."""
    grid = GRID.replace("[digits]", "[fashion-mnist]").replace("[mlp]", "[cnn-small]").replace("[1]", "[8]")
    (tmp_path / "g.yaml").write_text(grid)
    spec = load_grid(tmp_path / "g.yaml")
    for width in (80, 160):
        buf = io.StringIO()
        monkeypatch.setattr(sweep_cli, "err", Console(file=buf, force_terminal=True, width=width, color_system=None))
        with sweep_cli.RichProgress() as progress:
            progress.on_sweep_start(spec, spec.trials, 2, str(tmp_path / "store"))
            config = spec.trials[1]
            progress.on_trial_start(config)
            progress.on_trial_progress(config.trial_key, 585, 585, {"epoch": 5, "loss": 0.597})
            progress.progress.refresh()
        frames = re.split(r"[\r\n]", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue()))
        line = [row for row in frames if config.label in row][-1]  # the last frame drawn
        assert "585/585 epoch 5 loss 0.597 0:00:0" in line and "…" not in line, line
        assert ("━" * 40 in line) == (width == 160), line


def test_sweep_status_writes_accuracy_and_epsilon_as_the_leaderboard_does(monkeypatch, tmp_path, cli):
    """A store written as the driver writes it (no Ray): the accuracy column reads 76.0 (the schema's percent
    and places), not the record's fraction 0.7604; the target epsilon as every table writes it."""
    spec = grid.parse(GRID.replace("epsilon: [1]", "epsilon: [1.5]"))
    st = Store(resolve(tmp_path / "store"), create=True)
    st.open_sweep(spec.name, spec.text, [t.to_dict() for t in spec.trials], key_of=grid.stored_key)
    for cfg, acc in zip((t.to_dict() for t in spec.trials), (0.76044, 0.8), strict=True):
        assert st.claim(spec.name, cfg["trial_key"])
        st.record({"sweep": spec.name, "trial_key": cfg["trial_key"], "status": "finished", "config": cfg,
                   "metrics": {"accuracy": acc, "wall_s": 1.0}})
    st.release(spec.name)
    st.close()
    monkeypatch.setenv("COLUMNS", "120")
    result = cli("sweep", "status", "piped", "--store", tmp_path / "store")
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if "dpsgd" in line]
    assert sorted(row[-3:] for row in rows) == [["1.5", "0", "76.0"], ["1.5", "1", "80.0"]], result.output
