"""A store copied to a colleague works: artifact locations are relative to the store, so after the store is
copied elsewhere and the original deleted, every read command and the UI (artifacts included) work on the
copy, and no file of the copy names the original folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from tests.conftest import TINY, start_ray
from tests.dashboards.test_ui import free_port

ROOT = Path(__file__).resolve().parents[2]


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, (args, result.output)
    return result


def test_a_copied_store_works_after_the_original_is_deleted(tmp_path):
    original, copy = tmp_path / "mine" / "store", tmp_path / "colleague" / "store"
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(TINY | {"name": "moving", "audit": {"mode": "off"}}))
    start_ray()
    invoke("sweep", "run", grid, "--store", original)
    shutil.copytree(original, copy)
    shutil.rmtree(tmp_path / "mine")
    for path in copy.rglob("*"):  # nothing in the copy points at where the store was made
        if path.is_file():
            assert str(original).encode() not in path.read_bytes(), path

    out = tmp_path / "out"
    out.mkdir()
    invoke("sweep", "list", "--store", copy)
    assert "finished" in invoke("sweep", "status", "--store", copy).stdout
    for fmt in ("table", "csv", "markdown", "latex", "json", "html"):
        assert "dpsgd" in invoke("leaderboard", "--store", copy, "--format", fmt).stdout
    invoke("report", "--store", copy, "--out", out / "report.html")
    for kind in ("privacy-utility", "overhead", "curves", "verdicts"):
        invoke("plot", "--store", copy, "--kind", kind, "--out", out / f"{kind}.pdf")
    for fmt in ("csv", "json"):
        invoke("export", "--store", copy, "--format", fmt, "--out", out / f"export.{fmt}")

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "orchestrator", "ui", "--store", str(copy), "--port",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"

    def call(path: str, body: dict | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as answer:
            return answer.read()

    try:
        deadline = time.monotonic() + 120
        while True:  # the front answers at once; MLflow behind it within seconds
            assert server.poll() is None and time.monotonic() < deadline, "the UI did not come up"
            try:
                exp = json.loads(call("/api/2.0/mlflow/experiments/get-by-name?experiment_name=moving"))
                break
            except OSError:
                time.sleep(0.25)
        runs = json.loads(call("/api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment"]["experiment_id"]]}))
        assert len(runs["runs"]) == 3  # two trials and the sweep's run
        for run in runs["runs"]:
            run_id = run["info"]["run_id"]
            assert run["info"]["artifact_uri"].startswith("mlflow-artifacts:/moving/")
            listed = json.loads(call(f"/api/2.0/mlflow/artifacts/list?run_id={run_id}"))
            names = {f["path"] for f in listed.get("files", [])}
            wanted = "summary.md" if "privbench.sweep_run" in {t["key"] for t in run["data"]["tags"]} else "result.json"
            assert wanted in names, (wanted, names)
            body = call("/get-artifact?" + urllib.parse.urlencode({"path": wanted, "run_uuid": run_id}))
            assert (b"moving" in body) if wanted == "summary.md" else json.loads(body)["sweep"] == "moving"
        assert b"<script>" in call("/")  # the UI's page itself comes through the front
    finally:
        server.terminate()
        server.wait(timeout=30)
