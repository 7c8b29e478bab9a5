"""SIGKILL the driver mid-sweep, rerun: every trial ends up exactly once in MLflow and the ledger.

Slow (three minutes on a 2-core machine): the default suite covers each kill point with fault injection
(tests/storage/test_ledger_survives_mirror.py) and the driver's signals end to end (test_driver_signals.py)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient


def finished_count(ledger: Path) -> int:
    if not ledger.exists():
        return 0
    try:
        with sqlite3.connect(ledger, timeout=30) as db:
            return db.execute("select count(*) from privbench_trials where status='finished'").fetchone()[0]
    except sqlite3.OperationalError:  # schema not created yet
        return 0


@pytest.mark.slow
def test_kill_driver_then_rerun_completes_each_trial_once(write_grid, store):
    grid = write_grid({"name": "killme", "seeds": [0, 1, 2], "train": {"epochs": 2, "batch_size": 64, "lr": 0.5}})
    cmd = [sys.executable, "-m", "orchestrator", "sweep", "run", str(grid), "--store", str(store),
           "--max-concurrent", "1"]
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    driver = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    deadline = time.monotonic() + 300
    while finished_count(store / "ledger.db") < 2:  # wait on the ledger itself, not on a clock
        assert driver.poll() is None, "the sweep ended before it could be killed"
        assert time.monotonic() < deadline, "no trial finished within 300 s"
        time.sleep(0.05)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    assert finished_count(store / "ledger.db") < 6

    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert finished_count(store / "ledger.db") == 6
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    runs = [r for r in client.search_runs([client.get_experiment_by_name("killme").experiment_id])
            if "privbench.sweep_run" not in r.data.tags]  # the trials (not the sweep's parent run)
    keys = [r.data.tags["privbench.trial_key"] for r in runs]
    assert len(keys) == 6 and len(set(keys)) == 6
    assert all(r.info.status == "FINISHED" for r in runs)
