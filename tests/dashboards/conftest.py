"""A real small store shared by the dashboard tests: one sweep run through the CLI on real Ray and
MLflow (digits, an MLP, non-private / DP-SGD / GReDP at two epsilons, two seeds, two epochs), plus a
second one-seed sweep for the several-sweeps views. Made once per session: it takes about a minute."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import start_ray

FIGURE_GRID = {
    "name": "figs",
    "seeds": [0, 1],
    "delta": 1e-5,
    "grid": {"dataset": ["digits"], "model": ["mlp"], "mechanism": ["nonprivate", "dpsgd", "gredp"],
             "epsilon": [1, 8]},
    "train": {"epochs": 2, "batch_size": 64, "lr": 0.5},
    "audit": {"mode": "both", "samples": 2000, "dim": 100, "canaries": 200},
    "resources": {"cpus": 1, "gpus": "auto"},
}
SECOND_GRID = FIGURE_GRID | {"name": "figs-b", "seeds": [0],
                             "grid": FIGURE_GRID["grid"] | {"mechanism": ["nonprivate", "dpsgd"], "epsilon": [8]}}


@pytest.fixture(scope="session")
def figure_store(tmp_path_factory) -> Path:
    from orchestrator.cli import app

    root = tmp_path_factory.mktemp("figstore")
    store = root / "store"
    runner = CliRunner()
    start_ray()
    for grid in (FIGURE_GRID, SECOND_GRID):
        path = root / f"{grid['name']}.yaml"
        path.write_text(yaml.safe_dump(grid))
        result = runner.invoke(app, ["sweep", "run", str(path), "--store", str(store)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    return store
