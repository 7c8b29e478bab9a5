"""A piped sweep says when each trial starts, not only when it ends (issue 41: a piped `sweep run` printed
nothing for the 1.5 minutes before its first trial finished). The driver's own progress callback, on a console
that is not a terminal, as `privbench sweep run ... | tee log` gives it."""

from __future__ import annotations

import io
import re

from rich.console import Console

from orchestrator import sweep_cli
from orchestrator.runner import load_grid

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
                                  "metrics": {"accuracy": 0.8}, "privacy": {"epsilon_certified": 1.0}}, "run")
    return seen, buf.getvalue()


def test_a_piped_sweep_prints_a_line_when_each_trial_starts(monkeypatch, tmp_path):
    seen, text = run_callbacks(monkeypatch, tmp_path, terminal=False)
    assert "dpsgd digits/mlp eps=1 seed=0: started" in seen[0]
    assert "dpsgd digits/mlp eps=1 seed=1: started" in seen[1]
    lines = text.splitlines()
    assert lines.index("  dpsgd digits/mlp eps=1 seed=0: started") < lines.index(
        "  dpsgd digits/mlp eps=1 seed=0: done acc 0.8000 eps 1")


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
