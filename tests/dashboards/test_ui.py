"""`privbench ui` serves the MLflow REST API on the store, with the sweep's experiment in it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import start_ray


@pytest.fixture
def recorded_store(cli, write_grid, store):
    start_ray()
    grid = write_grid({"name": "uisweep", "grid": {"dataset": ["digits"], "model": ["mlp"],
                                                   "mechanism": ["nonprivate"]}})
    assert cli("sweep", "run", grid, "--store", store).exit_code == 0
    return store


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ui_answers_the_mlflow_rest_api(recorded_store):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "orchestrator", "ui", "--store", str(recorded_store),
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search"
    body = json.dumps({"max_results": 100}).encode()
    try:
        deadline, answer = time.monotonic() + 120, None
        while answer is None:
            assert server.poll() is None, "the UI server exited"
            assert time.monotonic() < deadline, "the UI did not answer within 120 s"
            try:
                req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
                answer = json.load(urllib.request.urlopen(req, timeout=5))
            except OSError:
                time.sleep(0.2)
        assert "uisweep" in [e["name"] for e in answer["experiments"]]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_ui_on_a_missing_store_exits_2(cli, tmp_path):
    result = cli("ui", "--store", tmp_path / "nothing-here")
    assert result.exit_code == 2 and "no privbench store" in result.output
