"""A sweep on a real Ray cluster started with `ray start --head`, in which privbench is not installed.

The cluster runs in its own temp dir with a clean environment (no PYTHONPATH), so its workers can
import privbench only from what the sweep ships: Ray's `runtime_env` (`py_modules` for a driver
joining with `--address`, the job's `--working-dir` for `ray job submit`). It is stopped whatever the
test does. Not with `ray stop`, which kills every Ray process on the machine (other users' clusters
too): `ray start` runs in a session of its own, which every process of the cluster inherits (Ray
changes their process group, not their session), and exactly that session's processes are stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
GRID = {"name": "remote", "seeds": [0, 1], "grid": {"dataset": ["digits"], "model": ["mlp"],
                                                   "mechanism": ["nonprivate"]},
        "train": {"epochs": 1, "batch_size": 64, "lr": 0.5, "max_train_examples": 64},
        "audit": {"enabled": False}, "resources": {"cpus": 1, "gpus": 0}}


def clean_env() -> dict[str, str]:
    """The environment of a node without privbench: no PYTHONPATH, no privbench settings."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("PRIVBENCH_", "RAY_"))}
    # Ray >= 2.5x turns token authentication on when ~/.ray/auth_token exists; this loopback-only
    # throwaway cluster runs without it, explicitly, so that the test does not depend on that file.
    return env | {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def ray_cli() -> list[str]:
    return [sys.executable, "-m", "ray.scripts.scripts"]


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def stop_session(sid: int, grace_s: float = 30.0) -> None:
    """SIGTERM every process of session `sid`, SIGKILL what is left after `grace_s`, and wait for them."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        for pid in session_pids(sid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.2)  # polling for the processes to be gone, with a deadline
        if not session_pids(sid):
            return


@pytest.fixture(scope="module")
def head() -> Iterator[dict[str, object]]:
    """`ray start --head` on free ports with a dedicated temp dir; its session's processes stopped afterwards."""
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths have a length limit
    port, dashboard = free_port(), free_port()
    env = clean_env()
    cmd = [*ray_cli(), "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.1",
           "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard), "--include-dashboard", "true",
           "--num-cpus", "2", "--num-gpus", "0", "--temp-dir", str(temp),
           "--ray-client-server-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
           "--disable-usage-stats"]
    starter = subprocess.Popen(cmd, cwd=temp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # its pid is the cluster's session id
    try:
        out, errors = starter.communicate(timeout=240)
        assert starter.returncode == 0, out[-3000:] + errors[-3000:]
        yield {"address": f"127.0.0.1:{port}", "dashboard": f"http://127.0.0.1:{dashboard}", "temp": temp,
               "env": env}
    finally:
        stop_session(starter.pid)
        shutil.rmtree(temp, ignore_errors=True)


def finished_trials(store: Path) -> list[dict]:
    result = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "status", "remote", "--store", store,
                             "--json"], env=os.environ | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return [t for t in json.loads(result.stdout)["trials"] if t["status"] == "finished"]


def test_a_driver_joining_a_cluster_ships_privbench_to_its_workers(head, tmp_path):
    """Driver on this machine (privbench importable here only), trials on the cluster's workers."""
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    store = tmp_path / "store"
    run = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "run", grid, "--store", store,
                          "--address", head["address"]], cwd=tmp_path,
                         env=head["env"] | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert len(finished_trials(store)) == 2
    shipped = list(Path(head["temp"]).glob("session_*/runtime_resources/py_modules_files/*"))
    assert shipped, "no py_modules were unpacked on the cluster"


def test_ray_job_submit_runs_a_sweep_on_the_head(head, tmp_path):
    """`ray job submit --working-dir <checkout> -- python -m orchestrator sweep run ...` against the
    head's job server; the store is a path the head can reach."""
    with urllib.request.urlopen(f"{head['dashboard']}/api/version", timeout=30) as response:
        assert response.status == 200  # the job server answers
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    store = tmp_path / "store"
    submit = subprocess.run([*ray_cli(), "job", "submit", "--address", head["dashboard"], "--working-dir", str(ROOT),
                             "--", "python", "-m", "orchestrator", "sweep", "run", str(grid), "--store", str(store)],
                            cwd=tmp_path, env=head["env"], capture_output=True, text=True, timeout=600)
    assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
    assert "succeeded" in submit.stdout.lower(), submit.stdout[-3000:]
    assert len(finished_trials(store)) == 2
