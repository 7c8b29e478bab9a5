"""Recovery you can trust (issue 40, items 1 and 2), at the store and through the CLI, without Ray.

`store check` sees the damage every other command sees (a changed byte in a row, zeroed bytes in an
overflow page, a file cut short, an index that disagrees with its rows, a torn log header), names it and
the command that mends it; that command agrees the file is damaged. Both rebuilds refuse a sound file
without `--force`, keep the replaced file under a name that says why, leave the original in place when
they fail, and a kill at any of their steps leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from storage.errors import StoreError
from storage.location import resolve
from storage.store import Store
from tests.storage.test_ledger_survives_mirror import ROOT, active_runs, digest, ledger_rows, opened, recorded
from tests.storage.test_store import record_for

# -- the damage, made as a disk, a kill or a person makes it --------------------------------------------------


def change_byte_in_a_row(store: Path) -> None:
    """One byte inside a trial's result record: the page and its b-trees stay valid, the JSON does not."""
    data = bytearray((store / "ledger.db").read_bytes())
    at = data.index(b'"status": "finished"')
    data[at + 8] = ord(";")
    (store / "ledger.db").write_bytes(bytes(data))


def big_record(key: str) -> dict:
    """A result record longer than a page: its tail lives in overflow pages."""
    return record_for(key) | {"curve": [round(0.001 * i, 3) for i in range(1500)], "marker": "MIDDLE-OF-RECORD"}


def zero_in_overflow_page(store: Path) -> None:
    """Zero 64 bytes inside an overflow page of one record (a bad block): no SQLite check reads them."""
    data = bytearray((store / "ledger.db").read_bytes())
    at = data.index(b"MIDDLE-OF-RECORD")
    data[at - 200:at - 136] = bytes(64)
    (store / "ledger.db").write_bytes(bytes(data))


def cut_short(store: Path) -> None:
    with open(store / "ledger.db", "r+b") as fh:
        fh.truncate(os.path.getsize(store / "ledger.db") - 1000)


def index_disagrees(store: Path) -> None:
    """The trial key k3 changed in its table row, not in the primary key's index (`row 4 missing from
    index`): a read through the index lists a key no row has."""
    path = store / "ledger.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        index_page = db.execute("select rootpage from sqlite_master where name = "
                                "'sqlite_autoindex_privbench_trials_1'").fetchone()[0]
        size = db.execute("pragma page_size").fetchone()[0]
    data = bytearray(path.read_bytes())
    for page in range(len(data) // size):
        if page + 1 == index_page:
            continue
        chunk = data[page * size:(page + 1) * size]
        at = chunk.find(b"s1k3")
        if at >= 0:
            data[page * size + at + 3] = ord("9")
            break
    else:
        raise AssertionError("row k3 not found")
    path.write_bytes(bytes(data))


def torn_wal(store: Path) -> None:
    """A driver killed after a commit, before a checkpoint, and its log's header torn."""
    code = ("import sqlite3, os, sys; db = sqlite3.connect(sys.argv[1]); db.execute('pragma journal_mode=wal');"
            "db.execute(\"update privbench_trials set attempts = attempts + 1\"); db.commit(); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(store / "ledger.db")], check=True)
    wal = store / "ledger.db-wal"
    assert wal.stat().st_size > 32
    with open(wal, "r+b") as fh:
        fh.seek(8)
        fh.write(bytes(8))


DAMAGE = {"a changed byte in a row": (change_byte_in_a_row, "not JSON"),
          "zeroed bytes in an overflow page": (zero_in_overflow_page, "not JSON"),
          "a file cut short by 1,000 bytes": (cut_short, "cut short"),
          "an index entry that no longer matches its row": (index_disagrees, "index"),
          "a torn WAL header": (torn_wal, "write-ahead log")}


def big_store(store: Path) -> None:
    st = opened(store)
    for key in ("k0", "k1", "k2", "k3"):
        assert st.claim("s1", key)
        st.record(big_record(key) if key == "k2" else record_for(key))
    st.release("s1")
    st.close()


def one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip() and not line.endswith(": ok")]
    assert "Traceback" not in result.output and len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("case", list(DAMAGE))
def test_store_check_sees_what_the_commands_see_and_names_the_mending_command(store, cli, case):
    make, what = DAMAGE[case]
    big_store(store)
    runs = {k: r for k, (_, r, _) in ledger_rows(store).items()}
    make(store)
    check = cli("store", "check", "--store", store)
    assert check.exit_code == 2, check.output  # today's main: "ok", exit 0
    line = one_line(check)
    assert "ledger.db is damaged" in line and what in line, line
    assert f"privbench store rebuild-ledger --store {store}" in line and "--force" not in line, line
    for args in (("sweep", "list", "--json"), ("sweep", "status", "s1", "--json"), ("leaderboard", "s1")):
        result = cli(*args, "--store", store)  # each reads right, or refuses naming the same command
        if result.exit_code != 0 or what != "not JSON":
            assert result.exit_code == 2, (args, result.output)
            assert f"rebuild-ledger --store {store}" in one_line(result)
    mended = cli("store", "rebuild-ledger", "--store", store)  # no --force: it agrees the file is damaged
    assert mended.exit_code == 0 and "4 finished" in mended.output, mended.output
    assert list(store.glob("ledger.db.damaged-*")) and not list(store.glob("*.rebuilding*"))
    assert {k: r for k, (_, r, _) in ledger_rows(store).items()} == runs
    assert cli("store", "check", "--store", store).exit_code == 0
    assert len(Store(resolve(store)).records("s1")) == 4


def test_store_check_quick_keeps_quick_check(store, cli):
    big_store(store)
    index_disagrees(store)
    assert cli("store", "check", "--quick", "--store", store).exit_code == 0  # quick_check does not compare
    assert cli("store", "check", "--store", store).exit_code == 2


def test_a_damaged_row_read_by_a_command_names_the_same_command_as_store_check(store, cli):
    recorded(store)
    with contextlib.closing(sqlite3.connect(store / "ledger.db")) as db:
        db.execute("update privbench_trials set result_json = '{\"status\": ' where trial_key = 'k1'")
        db.commit()
    result = cli("export", "s1", "--store", store, "--out", store.parent / "x.json")
    line = one_line(result)
    assert result.exit_code == 2 and "not JSON" in line and f"privbench store rebuild-ledger --store {store}" in line
    assert f"privbench store rebuild-ledger --store {store}" in one_line(cli("store", "check", "--store", store))


# -- item 2: rebuilds refuse a sound file, keep what they replace, and fail or die without harm ------------------

def test_rebuild_mirror_refuses_a_sound_mlflow_db_and_force_keeps_it_aside(store, cli):
    from mlflow.tracking import MlflowClient

    recorded(store)
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    client.create_experiment("added by hand")
    before = digest(store / "mlflow.db")
    refused = cli("store", "rebuild-mirror", "--store", store)
    line = one_line(refused)
    assert refused.exit_code == 2 and f"privbench store rebuild-mirror --store {store} --force" in line, line
    assert digest(store / "mlflow.db") == before and not list(store.glob("mlflow.db.*-*"))
    forced = cli("store", "rebuild-mirror", "--store", store, "--force")
    assert forced.exit_code == 0 and "4 finished" in forced.output, forced.output
    kept = list(store.glob("mlflow.db.replaced-*"))
    assert len(kept) == 1 and not list(store.glob("mlflow.db.damaged-*"))
    old = MlflowClient(tracking_uri=f"sqlite:///{kept[0]}")
    assert old.get_experiment_by_name("added by hand") is not None  # what the user added is kept, not lost
    assert active_runs(store) == {k: 1 for k in ledger_rows(store)}
    assert cli("store", "check", "--store", store).exit_code == 0


def test_rebuild_ledger_refusal_names_force(store, cli):
    recorded(store)
    refused = cli("store", "rebuild-ledger", "--store", store)
    assert refused.exit_code == 2 and f"rebuild-ledger --store {store} --force" in one_line(refused)
    forced = cli("store", "rebuild-ledger", "--store", store, "--force")
    assert forced.exit_code == 0 and list(store.glob("ledger.db.replaced-*")), forced.output


@pytest.mark.parametrize("what", ["ledger", "mirror"])
def test_a_failed_rebuild_leaves_the_original_in_place(store, what, monkeypatch):
    from storage import recovery

    recorded(store)
    damaged = "mlflow.db" if what == "mirror" else "ledger.db"
    change_byte_in_a_row(store) if what == "ledger" else cut_mirror(store)
    before = {name: digest(store / name) for name in ("ledger.db", "mlflow.db")}
    monkeypatch.setattr("storage.faults._FAULT_COUNTS", {})
    monkeypatch.setenv("PRIVBENCH_FAULT", "rebuild_row:2:enospc")  # the disk fills half-way through
    with pytest.raises(StoreError, match="disk is full"):
        getattr(recovery, f"rebuild_{what}")(resolve(store))
    assert {name: digest(store / name) for name in before} == before
    assert not list(store.glob("*.rebuilding*")) and not list(store.glob(f"{damaged}.damaged-*"))


def cut_mirror(store: Path) -> None:
    with open(store / "mlflow.db", "r+b") as fh:
        fh.truncate(os.path.getsize(store / "mlflow.db") - 1000)


LEDGER_STEPS = ["rebuild_row:2", "rebuild_built", "rebuild_kept", "rebuild_unlinked", "rebuild_replaced"]
MIRROR_STEPS = [*LEDGER_STEPS, "rebuild_repointed"]


def killed(store: Path, what: str, step: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(ROOT), "PRIVBENCH_FAULT": step}
    return subprocess.run([sys.executable, "-m", "orchestrator", "store", f"rebuild-{what}", "--store", str(store)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


def kill_at(store: Path, cli, what: str, step: str) -> None:
    recorded(store)
    runs = {k: r for k, (_, r, _) in ledger_rows(store).items()}
    change_byte_in_a_row(store) if what == "ledger" else cut_mirror(store)
    name = "ledger.db" if what == "ledger" else "mlflow.db"
    old = digest(store / name)
    result = killed(store, what, step)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    check = cli("store", "check", "--store", store)
    if digest(store / name) == old:  # the old file, whole: the check still names its damage and its mend
        assert check.exit_code == 2 and f"rebuild-{what}" in check.output, check.output
    elif check.exit_code == 2:  # the new file, not yet pointed at by the ledger: named, and mended by a rerun
        assert what == "mirror" and "interrupted rebuild-mirror" in check.output, check.output
        refused = cli("sweep", "list", "--store", store)  # the ledger itself is whole and reads
        assert refused.exit_code == 0, refused.output
    else:  # the new file, whole
        assert check.exit_code == 0
    if check.exit_code == 2:
        again = cli("store", f"rebuild-{what}", "--store", store)
        assert again.exit_code == 0 and "4 finished" in again.output, again.output
    assert cli("store", "check", "--store", store).exit_code == 0
    rows = ledger_rows(store)
    assert {k: s for k, (s, _, _) in rows.items()} == {k: "finished" for k in runs}
    if what == "ledger":
        assert {k: r for k, (_, r, _) in rows.items()} == runs
    assert active_runs(store) == {k: 1 for k in runs}
    st = opened(store)  # a driver opens it: nothing to run, nothing to reconcile
    assert st.pending("s1") == [] and not st.reconciled["s1"]
    st.close()
    assert not list(store.glob("*.rebuilding")) or check.exit_code == 0


@pytest.mark.parametrize("what, step", [("ledger", "rebuild_unlinked"), ("mirror", "rebuild_replaced")])
def test_a_rebuild_killed_at_its_riskiest_step_leaves_the_old_file_or_the_new_one(store, cli, what, step):
    kill_at(store, cli, what, step)


@pytest.mark.slow
@pytest.mark.parametrize("what, step", [("ledger", s) for s in LEDGER_STEPS] + [("mirror", s) for s in MIRROR_STEPS])
def test_a_rebuild_killed_at_every_step_leaves_the_old_file_or_the_new_one(store, cli, what, step):
    kill_at(store, cli, what, step)


def test_json_stays_loadable_for_big_records(store):
    """The overflow-page case really has overflow pages (a record longer than a page)."""
    big_store(store)
    with contextlib.closing(sqlite3.connect(store / "ledger.db")) as db:
        size = db.execute("pragma page_size").fetchone()[0]
        longest = db.execute("select max(length(result_json)) from privbench_trials").fetchone()[0]
    assert longest > 2 * size
    assert json.loads(json.dumps(big_record("k2")))["marker"] == "MIDDLE-OF-RECORD"
