"""A driver told to stop, and a driver whose helpers die (issue 31, items 23 and 26): SIGTERM is handled like
Ctrl-C (what arrived is recorded, the leases given back, one line, exit 143; not Ray's crash dump and exit
134), and a progress board that dies turns the bars off, not the sweep."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from tests.conftest import TINY
from tests.orchestrator.test_driver_kill import finished_count
from tests.orchestrator.test_submit import trial_runs

ROOT = Path(__file__).resolve().parents[2]


@ray.remote(num_cpus=0)
class DyingBoard:
    """A progress board whose actor dies the first time the driver reads it (its node lost, say)."""

    def update(self, *args) -> None:
        pass

    def forget(self, key: str) -> None:
        pass

    def snapshot(self) -> dict:
        ray.actor.exit_actor()


def test_a_progress_board_that_dies_does_not_stop_the_sweep(local_ray, monkeypatch):
    import yaml

    from orchestrator import grid, submit
    from orchestrator.cluster import resolve_gpus

    monkeypatch.setattr(submit, "ProgressBoard", DyingBoard)
    spec = grid.parse(yaml.safe_dump(TINY | {"seeds": [0, 1], "grid": TINY["grid"] | {"mechanism": ["nonprivate"]}}))
    records, polls = [], []
    submit.run_all(resolve_gpus(list(spec.trials), 0.0), max_concurrent=1, retries=0, on_start=lambda c: True,
                   on_result=records.append, on_progress=polls.append, poll_s=0.01)
    assert [r["status"] for r in records] == ["finished", "finished"] and polls == [], [r.get("error") for r in records]


def leases(ledger: Path) -> list:
    with sqlite3.connect(ledger, timeout=30) as db:
        return db.execute("select trial_key from privbench_trials where lease_owner is not null").fetchall()


# Piped; the pty test (test_sweep_on_terminal.py) checks both signals in the default suite as a person sends them.
@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_driver_after_recording_with_one_line(write_grid, store, sig, code):
    grid_file = write_grid({"name": "stopme", "seeds": [0, 1, 2], "grid": TINY["grid"] | {"mechanism": ["nonprivate"]}})
    cmd = [sys.executable, "-m", "orchestrator", "sweep", "run", str(grid_file), "--store", str(store),
           "--max-concurrent", "1"]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    deadline = time.monotonic() + 300
    while finished_count(store / "ledger.db") < 1:  # the ledger itself says the sweep is under way
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no trial finished within 300 s"
        time.sleep(0.05)
    os.kill(driver.pid, sig)
    _out, err = driver.communicate(timeout=300)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert driver.returncode == code, err[-3000:]
    assert len(errors) == 1 and f"stopped by {signal.Signals(sig).name}" in errors[0], err[-3000:]
    assert "Traceback" not in err and "SIGTERM received" not in err and "*** " not in err, err[-3000:]
    assert leases(store / "ledger.db") == []  # given back: a rerun takes the trials at once
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert finished_count(store / "ledger.db") == 3
    keys = [r.data.tags["privbench.trial_key"] for r in trial_runs(store, "stopme")]
    assert len(keys) == 3 == len(set(keys))


@pytest.mark.slow
def test_a_killed_ray_head_stops_the_driver_with_one_line_and_gives_its_trials_back(write_grid, store):
    """Issue 31 #19: with the GCS killed, the driver waited 60 s in silence, Ray logged a C++ line and the
    process ended with exit 1 and no privbench line, leaving a trial "running". The driver checks the head
    every 2 s: it records what arrived, gives its trials back (pending) and says so."""
    import psutil

    grid_file = write_grid({"name": "headless", "seeds": list(range(8)), "train": {"epochs": 300, "batch_size": 64},
                            "grid": TINY["grid"] | {"mechanism": ["nonprivate"]}})
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator", "sweep", "run", str(grid_file), "--store",
                               str(store), "--max-concurrent", "1"], env=os.environ | {"PYTHONPATH": str(ROOT)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while finished_count(store / "ledger.db") < 1:
        assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()[1][-3000:]
        time.sleep(0.05)
    gcs = [p for p in psutil.Process(driver.pid).children(recursive=True) if "gcs_server" in " ".join(p.cmdline())]
    assert gcs, "the driver's local Ray has a GCS process"
    killed = time.monotonic()
    for p in gcs:
        p.kill()
    try:
        _, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert time.monotonic() - killed < 45  # not Ray's 60 s
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert driver.returncode == 1 and len(errors) == 1 and "stopped answering" in errors[0], err[-3000:]
    with sqlite3.connect(store / "ledger.db") as db:
        rows = db.execute("select status, lease_owner from privbench_trials").fetchall()
    # what arrived is recorded, the rest given back: trials long enough that some are left when the driver stops
    # (3 short trials all finished within the head check's 20 s of patience, and the driver rightly exited 0)
    assert {owner for _, owner in rows} == {None} and {status for status, _ in rows} == {"finished", "pending"}
