"""The store on real MLflow/SQLite, without Ray: ownership, leases, reconcile, resume checks, creation races."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from storage.errors import Conflict, StoreError
from storage.location import mask, resolve
from storage.mlflow_sink import SWEEP_ID_TAG, TRIAL_KEY_TAG
from storage.store import Store

CONFIGS = [{"trial_key": f"k{i}", "dataset": "digits", "model": "mlp", "mechanism": "nonprivate", "epsilon": None,
            "seed": i} for i in range(3)]


def record_for(key: str, sweep: str = "s1", status: str = "finished") -> dict:
    seed = int(key[1:])
    return {"sweep": sweep, "trial_key": key, "status": status, "metrics": {"accuracy": 0.5 + seed / 10},
            "config": {"mechanism": "nonprivate", "dataset": "digits", "model": "mlp", "seed": seed, "epsilon": None}}


def client_of(store: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")


def active(client: MlflowClient, name: str) -> list:
    """The sweep's trial runs (its parent run holds the grid and summaries, not a trial)."""
    runs = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    return [r for r in runs if r.data.tags.get("privbench.sweep_run") != "true"]


def opened(store: Path, name: str = "s1", **kwargs) -> Store:
    st = Store(resolve(store, **kwargs), create=True)
    st.open_sweep(name, "yaml", CONFIGS)
    return st


def test_sweep_identity_is_tagged_on_experiment_runs_and_ledger(store):
    st = opened(store)
    run_id = st.record(record_for("k0"))
    exp = client_of(store).get_experiment_by_name("s1")
    sweep_id = st._ledger.sweep("s1")["sweep_id"]
    assert sweep_id and exp.tags[SWEEP_ID_TAG] == sweep_id
    assert exp.tags["privbench.ledger_id"] == st._ledger.ledger_id()
    assert client_of(store).get_run(run_id).data.tags[SWEEP_ID_TAG] == sweep_id


def test_audit_fields_are_logged_as_mlflow_metrics_with_legal_names(store):
    """Every audit number of the privacy record is a metric of the trial's run; `%` is not legal in a name."""
    st = opened(store)
    audit = {"epsilon_audited": 0.4, "epsilon_audited_steinke": 0.3, "epsilon_audited_fdp": 0.4,
             "epsilon_audited_curve": 1.7, "audit_ceiling": 0.5, "mia_auc": 0.52, "mia_tpr_at_0_1pct_fpr": 0.002,
             "mia_tpr_at_1pct_fpr": 0.02, "audit_s": 3.0, "audit_time_ratio": 1.05, "claim_status": "violated"}
    run_id = st.record(record_for("k0") | {"privacy": audit})
    logged = client_of(store).get_run(run_id).data.metrics
    assert logged["epsilon_audited_curve"] == 1.7 and logged["audit_ceiling"] == 0.5
    assert logged["mia_tpr_at_0_1pct_fpr"] == 0.002 and logged["mia_tpr_at_1pct_fpr"] == 0.02
    assert logged["audit_time_ratio"] == 1.05 and logged["epsilon_audited_steinke"] == 0.3
    assert logged["mia_auc"] == 0.52 and logged["audit_s"] == 3.0 and logged["epsilon_audited"] == 0.4


def test_experiment_not_made_by_privbench_is_refused_and_left_alone(store):
    Store(resolve(store), create=True)
    client = client_of(store)
    exp_id = client.create_experiment("s1")
    theirs = client.create_run(exp_id).info.run_id
    with pytest.raises(Conflict, match="no privbench sweep created"):
        opened(store)
    assert client.get_run(theirs).info.lifecycle_stage == "active"


def test_experiment_of_another_ledger_is_refused_and_its_runs_kept(store, tmp_path):
    first = opened(store)
    kept = first.record(record_for("k0"))
    leftover = first.sink.client.create_run(first._ledger.sweep("s1")["experiment_id"],
                                       tags={SWEEP_ID_TAG: first._ledger.sweep("s1")["sweep_id"],
                                             TRIAL_KEY_TAG: "k1"}).info.run_id
    with pytest.raises(Conflict, match="--ledger"):
        opened(store, ledger=f"sqlite:///{tmp_path / 'other-ledger.db'}")
    client = client_of(store)
    assert client.get_run(kept).info.lifecycle_stage == "active"
    assert client.get_run(leftover).info.lifecycle_stage == "active"


def test_reconcile_deletes_only_its_own_leftovers(store):
    st = opened(store)
    recorded = st.record(record_for("k0"))
    exp_id, sweep_id = st._ledger.sweep("s1")["experiment_id"], st._ledger.sweep("s1")["sweep_id"]
    leftover = st.sink.client.create_run(exp_id, tags={SWEEP_ID_TAG: sweep_id, TRIAL_KEY_TAG: "k1"}).info.run_id
    by_hand = st.sink.client.create_run(exp_id, tags={"note": "a user's own run"}).info.run_id
    opened(store)  # the next driver reconciles
    client = client_of(store)
    assert client.get_run(recorded).info.lifecycle_stage == "active"
    assert client.get_run(leftover).info.lifecycle_stage == "deleted"
    assert client.get_run(by_hand).info.lifecycle_stage == "active"


def test_a_run_deleted_in_mlflow_is_restored_from_the_ledger_not_redone(store):
    """The mirror never rewrites the truth: a recorded trial stays recorded; its run comes back."""
    st = opened(store)
    runs = {}
    for key in ("k0", "k1"):
        st.claim("s1", key)
        runs[key] = st.record(record_for(key))
    client_of(store).delete_run(runs["k0"])
    again = opened(store)
    assert sorted(c["trial_key"] for c in again.pending("s1")) == ["k2"]
    assert again.reconciled["s1"].restored == ("k0",)
    assert client_of(store).get_run(runs["k0"]).info.lifecycle_stage == "active"


def test_deleted_experiment_is_reported_before_anything_runs(store):
    st = opened(store)
    st.record(record_for("k0"))
    client = client_of(store)
    client.delete_experiment(client.get_experiment_by_name("s1").experiment_id)
    with pytest.raises(StoreError, match="was deleted; restore it"):
        opened(store)


def test_legacy_sweep_without_identity_is_adopted(store):
    st = opened(store)
    exp_id = st._ledger.sweep("s1")["experiment_id"]
    st.sink.client.delete_experiment_tag(exp_id, SWEEP_ID_TAG)
    st._ledger.update_sweep("s1", sweep_id=None)
    again = opened(store)
    new_id = again._ledger.sweep("s1")["sweep_id"]
    assert new_id and client_of(store).get_experiment(exp_id).tags[SWEEP_ID_TAG] == new_id


def test_a_trial_is_leased_by_one_driver_at_a_time(store):
    a, b = opened(store), opened(store)
    assert a.claim("s1", "k0") and not b.claim("s1", "k0")
    assert b.claim("s1", "k1")
    assert a.record(record_for("k0")) is not None
    assert not b.claim("s1", "k0")  # finished: nobody runs it again
    assert len(active(client_of(store), "s1")) == 1


def test_an_expired_lease_is_taken_over_and_the_loser_records_nothing(store, monkeypatch):
    monkeypatch.setenv("PRIVBENCH_LEASE_S", "0.3")
    a, b = opened(store), opened(store)
    assert a.claim("s1", "k0")
    deadline = time.monotonic() + 30
    while not b.claim("s1", "k0"):  # a stopped renewing: its lease runs out
        assert time.monotonic() < deadline
    assert b.record(record_for("k0")) is not None
    assert a.record(record_for("k0")) is None
    assert len(active(client_of(store), "s1")) == 1


def test_a_dead_local_driver_releases_its_leases_at_once(store):
    st = opened(store)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    owner = f"{os.uname().nodename}:{dead.stdout.strip()}:deadbeef"
    with sqlite3.connect(store / "ledger.db") as db:
        db.execute("update privbench_trials set lease_owner=?, lease_expires=? where trial_key='k0'",
                   (owner, time.time() + 3600))
    assert not st.claim("s1", "k0")
    assert opened(store).claim("s1", "k0")


def _create_and_open(store: str, barrier, results) -> None:
    barrier.wait(timeout=60)
    try:
        st = Store(resolve(store), create=True)
        st.open_sweep("race", "yaml", CONFIGS)
        results.put("ok")
    except Exception as e:  # noqa: BLE001 - reported to the test
        results.put(f"{type(e).__name__}: {e}")


def concurrent_creation(store: str, n: int = 4) -> list[str]:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_create_and_open, args=(store, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    out = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return out


@pytest.mark.slow
def test_drivers_creating_a_fresh_store_at_once_all_succeed(tmp_path):
    store = tmp_path / "fresh"
    assert concurrent_creation(str(store), 3) == ["ok"] * 3
    st = Store(resolve(store))
    assert st.sweep_names() == ["race"] and len(st._ledger.trials("race")) == 3
    assert len([e for e in client_of(store).search_experiments() if e.name == "race"]) == 1


def test_read_commands_never_write(store):
    st = opened(store)
    st.record(record_for("k0"))
    (store / "mlflow.db").write_bytes(b"")  # truncated MLflow database
    before = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in store.iterdir()}
    reader = Store(resolve(store))
    assert reader.sweep_names() == ["s1"] and len(reader.records("s1")) == 1
    assert {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in store.iterdir()} == before
    with pytest.raises(StoreError, match="mlflow.db is empty"):
        Store(resolve(store), create=True)
    assert (store / "mlflow.db").stat().st_size == 0


def drop_table(path: Path, table: str) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute(f"drop table {table}")
        db.commit()


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(b""), "is empty"),
    (lambda p: p.write_bytes(b"this is not a database" * 100), "not a SQLite database"),
    (lambda p: p.write_bytes(p.read_bytes()[:1024]), "store"),
    (lambda p: drop_table(p, "privbench_trials"), "missing the tables"),
])
def test_damaged_ledger_is_one_clear_error(store, damage, message):
    st = opened(store)
    st.record(record_for("k0"))
    st.close()  # the last connection checkpoints the WAL: the damage hits the real file
    damage(store / "ledger.db")
    with pytest.raises(StoreError, match=message) as info:
        st = Store(resolve(store))
        st.records(st.sweep_names()[0])
    assert "\n" not in str(info.value)


def test_missing_store_is_not_created_by_reading(tmp_path):
    with pytest.raises(StoreError, match="no privbench store"):
        Store(resolve(tmp_path / "nothing"))
    assert not (tmp_path / "nothing").exists()


def test_locations_mask_passwords_and_keep_artifacts_next_to_the_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pg = resolve("postgresql://alice:hunter2@db.example:5432/bench")
    assert pg.tracking_uri.startswith("postgresql+psycopg://") and pg.ledger_uri == pg.tracking_uri
    assert "hunter2" not in pg.display and "alice:***@" in pg.display
    assert mask("could not connect to postgresql://u:p%40ss@h/db") == "could not connect to postgresql://u:***@h/db"
    folder = resolve(tmp_path / "st")  # artifacts named relative to the store, kept in its own folder
    assert folder.artifact_root == "mlflow-artifacts:" and folder.artifacts_folder == tmp_path / "st" / "artifacts"
    lite = resolve(f"sqlite:///{tmp_path / 'x' / 'mlflow.db'}")
    assert lite.artifact_root == "mlflow-artifacts:" and lite.artifacts_folder == tmp_path / "x" / "artifacts"
    given = resolve(tmp_path / "st", artifacts=str(tmp_path / "elsewhere"))
    assert given.artifact_root == (tmp_path / "elsewhere").as_uri()
    server = resolve("http://127.0.0.1:5000", ledger="postgresql://u:pw@h/ledger")
    assert server.ledger_uri.startswith("postgresql+psycopg://") and server.artifact_root is None
    assert not resolve("http://h:1").ledger_uri.startswith(f"sqlite:///{tmp_path}")  # never the working folder
    with pytest.raises(StoreError):
        resolve("ftp://nope")


def test_a_store_written_before_the_phase_column_still_reads(tmp_path):
    """A ledger made by an older privbench (no `phase_json` column) reads in a read-only command, and a
    driver opening it adds the column."""
    st = Store(str(tmp_path / "store"), create=True)
    st.open_sweep("s1", "grid", CONFIGS)
    st.close()
    ledger = tmp_path / "store" / "ledger.db"
    with contextlib.closing(sqlite3.connect(ledger)) as db:
        db.execute("ALTER TABLE privbench_trials DROP COLUMN phase_json")
        db.commit()
    reader = Store(str(tmp_path / "store"))
    assert [t["trial_key"] for t in reader._ledger.trials("s1")] == ["k0", "k1", "k2"]
    reader.close()
    Store(str(tmp_path / "store"), create=True).close()
    with contextlib.closing(sqlite3.connect(ledger)) as db:
        assert "phase_json" in {row[1] for row in db.execute("PRAGMA table_info(privbench_trials)")}
