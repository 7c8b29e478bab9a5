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


RAY_OPTIONS = {"address": "local", "num_cpus": 2, "include_dashboard": False, "logging_level": "ERROR",
               "log_to_driver": False}


def start_ray() -> None:
    """The test session's local Ray (2 CPUs, no dashboard), started if none is running."""
    import ray

    if not ray.is_initialized():
        ray.init(**RAY_OPTIONS)


@pytest.fixture
def local_ray():
    """A local Ray shared by every test that runs a sweep in-process: its start costs seconds, so it is started
    once per session (per xdist worker) and again only after a test that needed a Ray of its own (a GPU, shipped
    plugins) shut it down. The sweeps' stores are each test's own, so nothing but the workers is shared."""
    start_ray()
    yield


SHARED_SESSION_FIXTURES = ("figure_store", "pg")  # built once per session: a store of real sweeps, a PostgreSQL


@pytest.hookimpl(wrapper=True)  # around every other implementation: pytest-xdist reads the groups from the marks
def pytest_collection_modifyitems(config, items):
    """The suite runs on every core (`-n auto` in pyproject.toml: on 2 cores the serial suite kept one idle). Tests
    that use an expensive session fixture run in one worker (`--dist loadgroup`), so it is built once, not per
    worker."""
    for item in items:
        shared = [name for name in SHARED_SESSION_FIXTURES if name in getattr(item, "fixturenames", ())]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
    return (yield)


def pytest_configure(config):
    """In an xdist worker, torch computes on one thread: the workers already share the cores, and two workers
    with a thread per core each only contend (it runs before any test module imports torch)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_xdist_auto_num_workers(config):
    """Workers for `-n auto`: one per core, at most 4 (each worker holds its own Ray, torch and MLflow)."""
    return max(1, min(os.cpu_count() or 1, 4))


def pytest_sessionfinish(session, exitstatus):
    """Leave no Ray behind: the session's shared instance ends with the session."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
