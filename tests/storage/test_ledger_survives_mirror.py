"""The ledger survives its mirror (issue 31, items 1-3, 7, 8, 10, 11 and the facade), at the store, without Ray.

Damaged pages are found before anything is read or written, the ledger is never changed because of what
MLflow shows, each file is rebuilt from the other on request, a complete run the ledger does not know is
adopted rather than trained again, a retried trial keeps one run whatever moment kills its driver, a sweep
name belongs to one grid at a time, and leases are timed on the database's clock.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.errors import Conflict, StoreError
from storage.location import resolve
from storage.store import Store
from tests.storage.test_store import client_of, record_for

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = [{"trial_key": f"k{i}", "dataset": "digits", "model": "mlp", "mechanism": "nonprivate", "epsilon": None,
            "seed": i} for i in range(4)]
# (start, end) of the zeroed bytes, as fractions of a 4 KiB page: torn writes at several offsets, each over
# the page's header or its cells (SQLite fills a page from its end; zeroing only free space damages nothing)
TORN = [(0.5, 1.0), (0.0, 0.5), (0.75, 1.0), (0.9, 1.0)]


def opened(store: Path, configs: list[dict] = CONFIGS, name: str = "s1") -> Store:
    st = Store(resolve(store), create=True)
    st.open_sweep(name, "yaml", configs)
    return st


def recorded(store: Path, keys=("k0", "k1", "k2", "k3")) -> dict[str, str]:
    """A store whose trials `keys` are recorded, closed cleanly (the WAL checkpointed into the files)."""
    st = opened(store)
    runs = {}
    for key in keys:
        assert st.claim("s1", key)
        runs[key] = st.record(record_for(key))
    st.release("s1")
    st.close()
    return runs


def zero(path: Path, name: str, start: float, end: float) -> None:
    """Zero bytes [start, end) of the root page of table or index `name`: a torn write or a bad block."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        page = db.execute("select rootpage from sqlite_master where name = ?", (name,)).fetchone()[0]
        size = db.execute("pragma page_size").fetchone()[0]
    with open(path, "r+b") as fh:
        fh.seek((page - 1) * size + int(size * start))
        fh.write(b"\0" * (int(size * end) - int(size * start)))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ledger_rows(store: Path) -> dict[str, tuple]:
    """(status, run id, has a result) per trial key, read past any index (`NOT INDEXED`)."""
    with contextlib.closing(sqlite3.connect(f"file:{store / 'ledger.db'}?mode=ro", uri=True)) as db:
        return {k: (s, r, bool(j)) for k, s, r, j in db.execute(
            "select trial_key, status, run_id, result_json from privbench_trials not indexed")}


def active_runs(store: Path, name: str = "s1") -> collections.Counter:
    """Active trial runs per trial key in MLflow."""
    client = client_of(store)
    runs = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    return collections.Counter(r.data.tags["privbench.trial_key"] for r in runs
                               if r.data.tags.get("privbench.sweep_run") != "true")


# items 1 and 11: a damaged mlflow.db ------------------------------------------------------------------------
@pytest.mark.parametrize("start, end", TORN)
def test_a_torn_runs_page_of_mlflow_db_is_refused_and_never_empties_the_ledger(store, start, end):
    recorded(store)
    before = ledger_rows(store)
    zero(store / "mlflow.db", "runs", start, end)
    files = {name: digest(store / name) for name in ("ledger.db", "mlflow.db")}
    with pytest.raises(StoreError) as info:
        opened(store, CONFIGS + [dict(CONFIGS[0], trial_key="k4", seed=4)])  # a rerun with one seed added
    assert all(status == "finished" and result for status, _, result in before.values())
    assert ledger_rows(store) == before  # today's main: 4 finished became 5 pending, results gone
    assert re.search(r"mlflow\.db is damaged .*nothing was written.*rebuild-mirror", str(info.value))
    assert "\n" not in str(info.value)
    assert {name: digest(store / name) for name in files} == files  # nothing was written, MLflow included


@pytest.mark.parametrize("index", ["sqlite_autoindex_runs_1", "index_tags_run_uuid", "sqlite_autoindex_tags_1"])
def test_a_zeroed_runs_or_tags_index_of_mlflow_db_is_reported(store, index):
    recorded(store)
    zero(store / "mlflow.db", index, 0.0, 1.0)
    before = digest(store / "mlflow.db")
    with pytest.raises(StoreError, match=r"mlflow\.db is damaged"):
        opened(store)  # what `sweep run --reconcile` opens: no second "(sweep)" parent run is created
    assert digest(store / "mlflow.db") == before


def test_the_mirror_is_rebuilt_from_the_ledger(store):
    from storage.recovery import rebuild_mirror

    recorded(store)
    zero(store / "mlflow.db", "runs", 0.5, 1.0)
    rows = ledger_rows(store)
    rebuilt = rebuild_mirror(resolve(store))
    assert rebuilt.trials == {"finished": 4} and rebuilt.kept is not None and rebuilt.kept.exists()
    assert active_runs(store) == {k: 1 for k in rows}
    after = ledger_rows(store)
    assert {k: v[0] for k, v in after.items()} == {k: "finished" for k in rows}
    st = opened(store)  # the store is usable again, nothing left to run or mend
    assert st.pending("s1") == [] and not st.reconciled["s1"]
    assert st.records("s1") == Store(resolve(store)).records("s1")


# item 2: a damaged ledger ------------------------------------------------------------------------------------
@pytest.mark.parametrize("start, end", TORN)
def test_a_torn_ledger_index_reads_as_damaged_not_empty_and_the_mirror_is_kept(store, start, end):
    runs = recorded(store)
    zero(store / "ledger.db", "sqlite_autoindex_privbench_trials_1", start, end)
    mirror = digest(store / "mlflow.db")
    with pytest.raises(StoreError, match=r"ledger\.db is damaged .*rebuild-ledger"):
        Store(resolve(store)).records("s1")  # a read command
    with pytest.raises(StoreError, match=r"ledger\.db is damaged"):
        opened(store)  # a driver
    assert digest(store / "mlflow.db") == mirror and active_runs(store) == {k: 1 for k in runs}


def test_the_ledger_is_rebuilt_from_the_mirror(store):
    from storage.recovery import rebuild_ledger

    runs = recorded(store)
    zero(store / "ledger.db", "sqlite_autoindex_privbench_trials_1", 0.5, 1.0)
    rebuilt = rebuild_ledger(resolve(store))
    assert rebuilt.sweeps == 1 and rebuilt.trials == {"finished": 4}
    assert list(store.glob("ledger.db.damaged-*")), "the damaged ledger is kept beside the new one"
    assert {k: (s, r) for k, (s, r, _) in ledger_rows(store).items()} == {k: ("finished", r) for k, r in runs.items()}
    again = opened(store)  # same sweep, same experiment: no conflict, nothing to run
    assert again.pending("s1") == [] and not again.reconciled["s1"]
    assert active_runs(store) == {k: 1 for k in runs}


def test_a_sound_ledger_is_not_rebuilt_unless_forced(store):
    from storage.recovery import rebuild_ledger

    recorded(store, ("k0",))
    with pytest.raises(StoreError, match="passes privbench.s integrity check.*--force"):
        rebuild_ledger(resolve(store))
    assert rebuild_ledger(resolve(store), force=True).trials == {"finished": 1}


# item 8: a ledger restored from a backup ---------------------------------------------------------------------
def backup(src: Path, dst: Path) -> None:
    with contextlib.closing(sqlite3.connect(src)) as a, contextlib.closing(sqlite3.connect(dst)) as b:
        a.backup(b)


def test_a_ledger_restored_from_a_backup_adopts_the_newer_runs(store, tmp_path):
    st = opened(store)
    assert st.claim("s1", "k0") and st.record(record_for("k0"))
    assert st.claim("s1", "k1") and st.record(record_for("k1", status="failed"))
    st.release("s1")
    backup(store / "ledger.db", tmp_path / "backup.db")  # a consistent copy while the store is open
    st.close()
    st = opened(store)  # later: k1 retried (finished now), k2 and k3 run
    newer = {key: (st.claim("s1", key), st.record(record_for(key)))[1] for key in ("k1", "k2", "k3")}
    st.release("s1")
    st.close()
    shutil.copyfile(tmp_path / "backup.db", store / "ledger.db")  # docs/store.md: restore the ledger from a backup
    again = opened(store)
    assert sorted(again.reconciled["s1"].adopted) == ["k1", "k2", "k3"] and again.pending("s1") == []
    rows = ledger_rows(store)
    assert {k: rows[k][:2] for k in newer} == {k: ("finished", r) for k, r in newer.items()}
    assert active_runs(store) == {"k0": 1, "k1": 1, "k2": 1, "k3": 1}


# item 7: a kill around the ledger record of a retried trial -------------------------------------------------
RETRY = """
import sys
from storage.location import resolve
from storage.store import Store
from tests.storage.test_ledger_survives_mirror import CONFIGS
from tests.storage.test_store import record_for
st = Store(resolve(sys.argv[1]), create=True)
st.open_sweep("s1", "yaml", CONFIGS)
assert st.claim("s1", "k0")
st.record(record_for("k0"))
"""


def retried_then_killed(store: Path, point: str) -> subprocess.CompletedProcess:
    st = opened(store)
    assert st.claim("s1", "k0") and st.record(record_for("k0", status="failed"))  # the first attempt failed
    st.release("s1")
    st.close()
    env = os.environ | {"PYTHONPATH": str(ROOT), "PRIVBENCH_FAULT": point}
    return subprocess.run([sys.executable, "-c", RETRY, str(store)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_kill_just_after_the_ledger_record_of_a_retried_trial_leaves_one_run(store):
    driver = retried_then_killed(store, "after_ledger_record")
    assert driver.returncode == -9, driver.stderr[-2000:]  # killed at the new fault point
    status, run_id, _ = ledger_rows(store)["k0"]
    assert status == "finished" and active_runs(store)["k0"] == 1
    assert client_of(store).get_run(run_id).info.lifecycle_stage == "active"
    assert not opened(store).reconciled["s1"]  # nothing left for the next driver to mend


def test_a_kill_just_before_the_ledger_record_is_adopted_not_trained_again(store):
    driver = retried_then_killed(store, "before_ledger_record")
    assert driver.returncode == -9, driver.stderr[-2000:]
    assert ledger_rows(store)["k0"][0] == "running"
    again = opened(store)
    assert again.reconciled["s1"].adopted == ("k0",) and "k0" not in [c["trial_key"] for c in again.pending("s1")]
    assert ledger_rows(store)["k0"][0] == "finished" and active_runs(store)["k0"] == 1


# item 3: two grids under one sweep name at once ---------------------------------------------------------------
def test_a_second_driver_with_another_grid_under_the_same_name_is_refused(store):
    first = opened(store, CONFIGS[:2])
    assert first.claim("s1", "k0")
    other = [dict(c, trial_key=f"x{i}", seed=10 + i) for i, c in enumerate(CONFIGS[:2])]  # lr 0.05 vs 0.5, say
    with pytest.raises(Conflict, match="being run right now by another driver with a different grid"):
        opened(store, other)
    assert {k: s for k, (s, *_) in ledger_rows(store).items()} == {"k0": "running", "k1": "pending"}
    assert opened(store, CONFIGS[:2]).claim("s1", "k1")  # the same grid: a second driver shares the work
    first.release("s1")
    first.record(record_for("k0"))  # the first driver's result is still its own


def test_another_grid_runs_once_the_first_driver_is_done(store):
    first = opened(store, CONFIGS[:2])
    first.release("s1")  # the driver ends
    other = [dict(CONFIGS[0], trial_key="x0", seed=10)]
    opened(store, other)  # an edited grid: the old trials are superseded, as before
    assert {k: s for k, (s, *_) in ledger_rows(store).items()} == {"k0": "superseded", "k1": "superseded",
                                                                  "x0": "pending"}


# item 10: clock skew ---------------------------------------------------------------------------------------
def test_a_driver_whose_clock_is_behind_does_not_lose_its_lease(store, monkeypatch):
    ahead, behind = opened(store), opened(store)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 120)  # this driver's clock is 120 s behind
    assert behind.claim("s1", "k0")
    monkeypatch.setattr(time, "time", real)
    assert not ahead.claim("s1", "k0")  # its lease is live on the database's clock: nobody trains it twice
    assert behind.record(record_for("k0")) is not None


# the facade -----------------------------------------------------------------------------------------------------
def test_driver_code_cannot_reach_into_the_ledger_or_the_mlflow_client(store):
    st = opened(store)
    assert not hasattr(st, "ledger") and not hasattr(st, "client")
    rows = st.trials("s1")
    assert [t.trial_key for t in rows] == ["k0", "k1", "k2", "k3"] and rows[0].record is None
    assert st.status_counts("s1") == {"pending": 4} and st.grid_yaml("s1") == "yaml"


def test_a_tear_in_free_space_damages_nothing_and_reads_whole(store):
    recorded(store)
    zero(store / "ledger.db", "sqlite_autoindex_privbench_trials_1", 0.25, 0.5)  # between header and cells
    assert len(Store(resolve(store)).records("s1")) == 4
