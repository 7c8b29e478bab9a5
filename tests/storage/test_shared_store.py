"""A store a team shares, end to end through the real CLI: a throwaway PostgreSQL (Debian's binaries),
a real `mlflow server`, real Ray; drivers killed at exact points (PRIVBENCH_FAULT), two drivers at once,
two users on one server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from mlflow.tracking import MlflowClient

from storage.location import normalise_db_uri
from storage.mlflow_sink import SWEEP_RUN_TAG
from tests.servers import PG_PASSWORD, mlflow_server, stop_group

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
GRID = {
    "name": "shared", "seeds": [0, 1], "sigma": 1.0,
    "grid": {"dataset": ["digits"], "model": ["mlp"], "mechanism": ["nonprivate", "dpsgd"]},
    "train": {"epochs": 1, "batch_size": 64, "lr": 0.5, "max_train_examples": 256},
    "audit": {"enabled": False}, "resources": {"cpus": 1, "gpus": 0},
}


def write_grid(folder: Path, **overrides) -> Path:
    path = folder / "grid.yaml"
    path.write_text(yaml.safe_dump(GRID | overrides))
    return path


def privbench(*args: str, cwd: Path, fault: str | None = None, home: Path | None = None,
              background: bool = False):
    """The CLI as a user runs it: its own process (group), its own working folder and home."""
    env = os.environ | {"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "PRIVBENCH_LEASE_S": "20"}
    env.pop("PRIVBENCH_FAULT", None)
    if fault:
        env["PRIVBENCH_FAULT"] = fault
    if home is not None:
        env |= {"HOME": str(home), "XDG_DATA_HOME": str(home / "data")}
    cmd = [sys.executable, "-m", "orchestrator", *args, "--max-concurrent", "1"]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    if background:
        return proc
    return finish(proc)


def finish(proc: subprocess.Popen, timeout: float = 600) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        stop_group(proc)  # a killed driver's Ray processes go with it
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def ledger_rows(uri: str, sweep: str = "shared") -> list[dict]:
    eng = sa.create_engine(normalise_db_uri(uri))
    try:
        with eng.connect() as c:
            return [dict(r) for r in c.execute(sa.text("select * from privbench_trials where sweep = :s"),
                                               {"s": sweep}).mappings()]
    finally:
        eng.dispose()


def active_runs(tracking_uri: str, name: str = "shared") -> list:
    """The sweep's trial runs; its one parent run (grid, leaderboard, figures) is checked and left out."""
    client = MlflowClient(tracking_uri=normalise_db_uri(tracking_uri))
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id]) if exp else []
    parents = [r for r in runs if r.data.tags.get(SWEEP_RUN_TAG) == "true"]
    assert len(parents) <= 1, f"{len(parents)} parent runs for one sweep"
    return [r for r in runs if r.data.tags.get(SWEEP_RUN_TAG) != "true"]


def assert_each_trial_once(runs: list, rows: list[dict], n: int = 4) -> None:
    keys = [r.data.tags["privbench.trial_key"] for r in runs]
    assert len(keys) == n and len(set(keys)) == n
    assert {r["status"] for r in rows} == {"finished"} and len(rows) == n
    assert {r["run_id"] for r in rows} == {r.info.run_id for r in runs}


def test_postgres_store_end_to_end_with_resume_after_a_kill(pg, tmp_path):
    uri = pg.database()
    grid = write_grid(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    killed = privbench("sweep", "run", str(grid), "--store", uri, cwd=work, fault="after_create_run:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert sum(r["status"] == "finished" for r in ledger_rows(uri)) == 1
    assert len(active_runs(uri)) == 2  # one recorded, one cut off after create_run

    rerun = privbench("sweep", "run", str(grid), "--store", uri, cwd=work)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "1 already finished, 3 to run" in " ".join(rerun.stderr.split())
    assert_each_trial_once(active_runs(uri), ledger_rows(uri))
    for out in (killed, rerun):
        assert PG_PASSWORD not in out.stdout + out.stderr
    assert "postgres:***@" in rerun.stderr
    assert not (work / "mlruns").exists() and not (work / "privbench-store").exists()
    run = active_runs(uri)[0]
    assert run.info.artifact_uri.startswith("file://") and "/work/" not in run.info.artifact_uri
    assert Path(run.info.artifact_uri.removeprefix("file://"), "result.json").exists()

    again = privbench("sweep", "run", str(grid), "--store", uri, cwd=work)
    assert again.returncode == 0 and "4 already finished, 0 to run" in " ".join(again.stderr.split())
    status = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "status", "--store", uri, "--json"],
                            cwd=work, env=os.environ | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert status.returncode == 0 and '"finished": 4' in status.stdout


def test_two_drivers_at_once_on_postgres_run_each_trial_once(pg, tmp_path):
    uri = pg.database()  # fresh: both drivers also race to create the schema and the experiment
    grid = write_grid(tmp_path, seeds=[0, 1, 2])
    drivers = [privbench("sweep", "run", str(grid), "--store", uri, cwd=tmp_path, background=True)
               for _ in range(2)]
    results = [finish(d) for d in drivers]
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    rows = ledger_rows(uri)
    assert_each_trial_once(active_runs(uri), rows, n=6)
    assert all(r["attempts"] == 1 for r in rows)  # no trial ran twice


def test_two_users_share_one_tracking_server_through_a_shared_ledger(pg, tmp_path):
    backend, ledger = pg.database(), pg.database()
    with mlflow_server(normalise_db_uri(backend), tmp_path / "server-artifacts") as server:
        alice, bob, carol = (tmp_path / n for n in ("alice", "bob", "carol"))
        for home in (alice, bob, carol):
            home.mkdir()
        grid = write_grid(tmp_path)
        first = privbench("sweep", "run", str(grid), "--store", server, "--ledger", ledger, cwd=alice, home=alice,
                          fault="after_create_run:3")
        assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
        assert sum(r["status"] == "finished" for r in ledger_rows(ledger)) == 2

        second = privbench("sweep", "run", str(grid), "--store", server, "--ledger", ledger, cwd=bob, home=bob)
        assert second.returncode == 0, second.stderr[-3000:]
        assert "2 already finished, 2 to run" in " ".join(second.stderr.split())
        runs = active_runs(server)
        assert_each_trial_once(runs, ledger_rows(ledger))
        assert PG_PASSWORD not in first.stderr + second.stderr + second.stdout
        assert list((tmp_path / "server-artifacts").rglob("result.json"))  # artifacts went to the server
        assert not (alice / "mlruns").exists() and not (bob / "mlruns").exists()

        # a third user without the team's ledger is stopped, and deletes nothing
        third = privbench("sweep", "run", str(grid), "--store", server, cwd=carol, home=carol)
        assert third.returncode == 2
        assert "belongs to another privbench ledger" in third.stderr and "--ledger" in third.stderr
        assert len(third.stderr.strip().splitlines()) == 1
        assert {r.info.run_id for r in active_runs(server)} == {r.info.run_id for r in runs}

        # an experiment of the same name that privbench did not make is left alone
        client = MlflowClient(tracking_uri=server)
        theirs = client.create_run(client.create_experiment("notours")).info.run_id
        other = privbench("sweep", "run", str(write_grid(tmp_path, name="notours")), "--store", server,
                          "--ledger", ledger, cwd=bob, home=bob)
        assert other.returncode == 2 and "no privbench sweep created" in other.stderr
        assert client.get_run(theirs).info.lifecycle_stage == "active"


RACE = [{"sweep": "race", "trial_key": f"k{i}", "dataset": "digits", "model": "mlp", "mechanism": "nonprivate",
         "epsilon": None, "seed": i} for i in range(6)]


def _race_driver(uri: str, barrier, results) -> None:
    """One driver: released at the same instant as the others on a fresh database, it creates the store
    (MLflow's schema, the ledger's tables), opens the sweep, then leases and records every trial it can."""
    from storage.location import resolve
    from storage.store import Store

    recorded: list[str] = []
    try:
        barrier.wait(timeout=120)
        st = Store(resolve(uri), create=True)
        st.open_sweep("race", "name: race", RACE)
        for cfg in RACE:
            if st.claim("race", cfg["trial_key"]):
                record = {"sweep": "race", "trial_key": cfg["trial_key"], "status": "finished", "config": cfg,
                          "metrics": {"accuracy": 0.5}}
                if st.record(record) is not None:
                    recorded.append(cfg["trial_key"])
        st.release("race")
        results.put(("ok", recorded))
    except Exception as e:  # noqa: BLE001 - reported to the test
        results.put((f"{type(e).__name__}: {str(e)[:500]}", recorded))


@pytest.mark.parametrize("attempt", range(3))
def test_drivers_starting_at_once_on_a_fresh_postgres_database(pg, attempt):
    """Three drivers released by one barrier on an empty database: schema and experiment creation is
    serialised (advisory lock), all three succeed, and every trial is recorded exactly once."""
    import multiprocessing

    uri = pg.database()
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_race_driver, args=(uri, barrier, results)) for _ in range(3)]
    for p in procs:
        p.start()
    try:
        out = [results.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert [status for status, _ in out] == ["ok"] * 3, out
    recorded = [key for _, keys in out for key in keys]
    assert sorted(recorded) == sorted(c["trial_key"] for c in RACE)  # each trial by exactly one driver
    rows = ledger_rows(uri, "race")
    assert {r["status"] for r in rows} == {"finished"} and all(r["attempts"] == 1 for r in rows)
    client = MlflowClient(tracking_uri=normalise_db_uri(uri))
    assert len([e for e in client.search_experiments() if e.name == "race"]) == 1
    runs = active_runs(uri, "race")  # the trial runs (the parent run left out)
    assert sorted(r.data.tags["privbench.trial_key"] for r in runs) == sorted(recorded)
    assert {r["run_id"] for r in rows} == {r.info.run_id for r in runs}
