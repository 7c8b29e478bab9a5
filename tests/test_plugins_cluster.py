"""`privbench sweep run` of the example plugin (tests/plugins/ext_mech) on a real Ray cluster started with
`ray start --head`, whose workers cannot import the plugin by path:

(a) installed (`pip install --no-deps --target`) where the cluster's nodes and the driver find it, as a
    package installed on every node: privbench finds it through its entry points, nothing else;
(b) not installed at all: the grid names its modules under `plugins:`, the driver imports them from
    beside the grid file and ships them through Ray's runtime_env with privbench itself.

Each runs a private trial (the plugin's mechanism, model and dataset) and a nonprivate one to `finished`,
with claimed, certified and audited epsilons. No privbench file names the plugin.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.orchestrator.test_remote_cluster import clean_env, ray_cli, stop_session
from tests.servers import free_port
from tests.test_plugins import PLUGIN, ROOT, install

pytestmark = pytest.mark.slow
GRID = {"name": "ext", "seeds": [0],
        "grid": {"dataset": ["ext-blobs"], "model": ["ext-linear"], "mechanism": ["dpsgd-tightclip", "nonprivate"],
                 "epsilon": [4.0]},
        "train": {"epochs": 2, "batch_size": 50, "lr": 0.5},
        "audit": {"mode": "both", "samples": 2000, "dim": 64}, "resources": {"cpus": 1, "gpus": 0}}


@contextmanager
def ray_head(env: dict[str, str]) -> Iterator[str]:
    """`ray start --head` on free loopback ports with its own temp dir; its session stopped afterwards."""
    temp = Path(tempfile.mkdtemp(prefix="rp", dir="/tmp"))
    port = free_port()
    cmd = [*ray_cli(), "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.1",
           "--include-dashboard", "false", "--num-cpus", "2", "--num-gpus", "0", "--temp-dir", str(temp),
           "--ray-client-server-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
           "--disable-usage-stats"]
    starter = subprocess.Popen(cmd, cwd=temp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, errors = starter.communicate(timeout=240)
        assert starter.returncode == 0, out[-3000:] + errors[-3000:]
        yield f"127.0.0.1:{port}"
    finally:
        stop_session(starter.pid)
        shutil.rmtree(temp, ignore_errors=True)


def run_sweep(grid: Path, store: Path, address: str, env: dict[str, str]) -> list[dict]:
    run = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "run", grid, "--store", store,
                          "--address", address], cwd=grid.parent, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    status = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "status", "ext", "--store", store,
                             "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert status.returncode == 0, status.stderr
    return json.loads(status.stdout)["trials"]


def check(trials: list[dict], store: Path, env: dict[str, str]) -> None:
    assert sorted(t["status"] for t in trials) == ["finished", "finished"], trials
    export = store.parent / "export.json"
    result = subprocess.run([sys.executable, "-m", "orchestrator", "export", "ext", "--store", store, "--out",
                             export], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (private,) = [r for r in json.loads(export.read_text()) if r["config"]["mechanism"] == "dpsgd-tightclip"]
    privacy = private["privacy"]
    assert privacy["epsilon_claimed"] == pytest.approx(4.0, rel=1e-2)
    assert privacy["epsilon_certified"] <= 4.0 + 1e-9
    assert privacy["epsilon_audited"] is not None and privacy["epsilon_audited_step"] is not None
    assert privacy["parts"]["clip_bound"] == pytest.approx(0.5)  # the plugin's clipping: C / 2 (C = 1)
    assert private["environment"]["node_id"]  # ran in a Ray worker of the cluster the driver joined


def test_an_installed_plugin_runs_on_the_cluster(tmp_path):
    site = install(tmp_path / "site")
    env = clean_env() | {"PYTHONPATH": str(site)}  # the plugin is installed on the node, privbench is not
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    store = tmp_path / "store"
    driver = env | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    with ray_head(env) as address:
        trials = run_sweep(grid, store, address, driver)
    check(trials, store, driver)


def test_a_plugins_module_is_shipped_to_the_cluster(tmp_path):
    shutil.copytree(PLUGIN / "ext_mech", tmp_path / "ext_mech")  # beside the grid, installed nowhere
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID | {"plugins": ["ext_mech.mechanisms", "ext_mech.models",
                                                       "ext_mech.datasets"]}))
    store = tmp_path / "store"
    driver = clean_env() | {"PYTHONPATH": str(ROOT)}
    with ray_head(clean_env()) as address:
        trials = run_sweep(grid, store, address, driver)
    check(trials, store, driver)
