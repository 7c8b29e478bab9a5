"""Shared fixtures: tiny grids on real workloads, a fresh store per test, the CLI in-process."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

TINY = {
    "name": "tiny",
    "seeds": [0],
    "delta": 1e-5,
    "sigma": 1.0,
    "grid": {"dataset": ["digits"], "model": ["mlp"], "mechanism": ["nonprivate", "dpsgd"]},
    "train": {"epochs": 1, "batch_size": 64, "lr": 0.5},
    "resources": {"cpus": 1, "gpus": "auto"},
}


@pytest.fixture
def write_grid(tmp_path: Path):
    def write(overrides: dict[str, Any] | None = None, text: str | None = None, name: str = "grid.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text if text is not None else yaml.safe_dump(TINY | (overrides or {})))
        return path

    return write


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def cli():
    from orchestrator.cli import app

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    return invoke


def parse_json(output: str) -> Any:
    return json.loads(output)


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance (2 CPUs, no dashboard) for one test module, shut down after it."""
    import ray

    ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()
