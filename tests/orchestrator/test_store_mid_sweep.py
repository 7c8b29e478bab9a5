"""A store that fails under a running sweep, after its first result (issue 50, items 2 and 4), with real Ray.

The driver is paused right after its first ledger record (`PRIVBENCH_FAULT=after_ledger_record:1:stop`), the
store's disk is filled (a real tmpfs) or `mlflow.db` is locked by another process, and the driver resumed. It
stops in one `error:` line: exit 1 for the full disk, 2 for the lock, naming the file and the wait. Then the
space is freed or the lock ended, and the same command, with no hand step between, finishes every trial once:
the ledger and MLflow agree.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.storage.test_ledger_survives_mirror import active_runs
from tests.storage.test_store_faults import ROOT, proc_state, tiny_tmpfs

GRID = ("name: s1\nseeds: [0, 1, 2, 3]\ngrid: {dataset: [digits], model: [mlp], mechanism: [nonprivate]}\n"
        "train: {epochs: 1, batch_size: 64, max_train_examples: 256}\n")
HOLD = "import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1], isolation_level=None); " \
       "db.execute('BEGIN EXCLUSIVE'); print('held', flush=True); time.sleep(300)"


def sweep(grid: Path, store: Path, fault: str | None = None) -> subprocess.Popen:
    env = os.environ | {"PYTHONPATH": str(ROOT)} | ({"PRIVBENCH_FAULT": fault} if fault else {})
    env.pop("PRIVBENCH_FAULT", None) if fault is None else None
    return subprocess.Popen([sys.executable, "-m", "orchestrator", "sweep", "run", str(grid), "--store", str(store)],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def paused(driver: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while proc_state(driver.pid) != "T":
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, "the driver never reached its first record"
        time.sleep(0.05)


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    return filler


def ledger_runs(store: Path) -> dict[str, tuple[str, str]]:
    with contextlib.closing(sqlite3.connect(f"file:{store / 'ledger.db'}?mode=ro", uri=True)) as db:
        return {k: (s, r) for k, s, r in db.execute("select trial_key, status, run_id from privbench_trials")}


@pytest.mark.parametrize("trouble", ["a full disk",  # ~2 Ray starts each: the lock is also tested at the store
                                     pytest.param("a lock on mlflow.db", marks=pytest.mark.slow)])
def test_a_store_failing_after_the_first_result_stops_in_one_line_and_the_rerun_finishes(tmp_path, cli, trouble):
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    with tiny_tmpfs(tmp_path / "disk", "40m") as disk:
        store = disk / "store"
        driver = sweep(grid, store, "after_ledger_record:1:stop")
        holder = None
        try:
            paused(driver)
            if trouble == "a full disk":
                filler = fill(disk)
            else:
                holder = subprocess.Popen([sys.executable, "-c", HOLD, str(store / "mlflow.db")],
                                          stdout=subprocess.PIPE, text=True)
                assert holder.stdout.readline().strip() == "held"
        finally:
            os.kill(driver.pid, signal.SIGCONT)
        out, err = driver.communicate(timeout=600)
        if holder is not None:
            holder.kill()
            holder.wait()
        else:
            filler.unlink()
        errors = [line for line in (out + err).splitlines() if line.startswith("error:")]
        assert "Traceback" not in out + err and len(errors) == 1, out + err
        if trouble == "a full disk":
            assert driver.returncode == 1 and "disk is full; what was recorded is kept" in errors[0], errors
        else:
            assert driver.returncode == 2, out + err  # main: exit 1, MLflow's 95 lines
            assert f"store file {store / 'mlflow.db'} is locked by another process" in errors[0], errors
            assert "waited" in errors[0] and "run the command again" in errors[0], errors
        first = {k: row for k, row in ledger_runs(store).items() if row[0] == "finished"}
        assert first, "the first result was lost"
        check = cli("store", "check", "--store", store)  # main, after a full disk: "ledger.db is damaged (cut short"
        assert check.exit_code == 0, check.output

        rerun = sweep(grid, store)  # the same command, no hand step
        out, err = rerun.communicate(timeout=600)
        assert rerun.returncode == 0, out + err
        rows = ledger_runs(store)
        assert len(rows) == 4 and {s for s, _ in rows.values()} == {"finished"}, rows
        assert all(rows[k] == row for k, row in first.items())  # recorded results kept as they were
        assert active_runs(store) == {k: 1 for k in rows}  # each trial once in MLflow
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
        runs = client.search_runs([client.get_experiment_by_name("s1").experiment_id])
        assert {r.info.run_id for r in runs if r.data.tags.get("privbench.sweep_run") != "true"} == \
            {run for _, run in rows.values()}
