"""Every command agrees with `store check` (issue 50, items 1, 2, 3 and 5), through the CLI, without Ray.

Each damage case of the suite, in either file, goes through `store check`, `sweep run`, `sweep status`,
`leaderboard`, `export` and `report`. A writer refuses with check's own line, exit 2, and writes nothing (both
files keep their bytes); a reader refuses a damaged ledger with that line, and goes on past a damaged MLflow
file saying so. Then the command the line names is run as written, and it mends the store.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from storage.location import resolve
from storage.store import Store
from tests.storage.test_ledger_survives_mirror import active_runs, digest, recorded, zero
from tests.storage.test_recovery import change_byte_in_a_row, cut_short, index_disagrees, torn_wal

GRID = ("name: s1\nseeds: [0, 1, 2, 3, 4]\ngrid: {dataset: [digits], model: [mlp], mechanism: [nonprivate]}\n"
        "train: {epochs: 1, batch_size: 64, max_train_examples: 256}\n")


def run_row_unindexed(store: Path) -> None:
    """One run id changed in the `runs` table's row, not in its primary key's index: `integrity_check` finds
    it (`row N missing from index`), `quick_check` does not; a driver used to open the store anyway."""
    path = store / "mlflow.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        root, = db.execute("select rootpage from sqlite_master where name = 'runs'").fetchone()
        run_id, = db.execute("select run_uuid from runs limit 1").fetchone()
        size, = db.execute("pragma page_size").fetchone()
    data = bytearray(path.read_bytes())
    at = data.index(run_id.encode(), (root - 1) * size, root * size)
    data[at] = ord("x")
    path.write_bytes(bytes(data))


def cut_by_one_page(store: Path) -> None:
    path = store / "mlflow.db"
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size - 4096)


def foreign(store: Path) -> None:
    """Another program's SQLite database in place of mlflow.db."""
    (store / "mlflow.db").unlink()
    with contextlib.closing(sqlite3.connect(store / "mlflow.db")) as db:
        db.execute("create table notes (id integer primary key, body text)")
        db.execute("insert into notes (body) values ('not a benchmark')")
        db.commit()


LEDGER = {"a changed byte in a row": (change_byte_in_a_row, "not JSON"),
          "a file cut short": (cut_short, "cut short"),
          "an index entry that no longer matches its row": (index_disagrees, "index"),
          "a torn WAL header": (torn_wal, "write-ahead log")}
MIRROR = {"a torn runs page": (lambda s: zero(s / "mlflow.db", "runs", 0.5, 1.0), "mlflow.db is damaged"),
          "a run row its index lacks": (run_row_unindexed, "missing from index"),
          "a file cut by one page": (cut_by_one_page, "cut short"),
          "another program's SQLite file": (foreign, "not an MLflow database")}


def lines(result) -> list[str]:
    assert "Traceback" not in result.output, result.output
    return [line for line in result.output.splitlines() if line.strip()]


def the_error(result) -> str:
    found = [line for line in lines(result) if line.startswith("error:")]
    assert len(found) == 1, result.output
    return found[0]


def advice(line: str) -> list[str]:
    """The command a line names, as a user would copy it."""
    commands = re.findall(r"`(privbench store [^`]+)`", line)
    assert len(commands) == 1, line
    return shlex.split(commands[0])[1:]


def files_of(store: Path) -> dict[str, str]:
    return {p.name: digest(p) for p in sorted(store.iterdir()) if p.is_file() and not p.name.endswith(".lock")}


@pytest.mark.parametrize("case", [*LEDGER, *MIRROR])
def test_every_command_gives_store_checks_verdict_and_its_advice_mends_the_store(store, cli, tmp_path, case):
    in_ledger = case in LEDGER
    make, what = (LEDGER | MIRROR)[case]
    recorded(store)
    make(store)
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    before = files_of(store)

    check = cli("store", "check", "--store", store)
    verdict = the_error(check)
    assert check.exit_code == 2 and what in verdict, check.output
    assert ("ledger.db is damaged" if in_ledger else "mlflow.db is damaged") in verdict

    run = cli("sweep", "run", grid, "--store", store)  # refused before Ray starts: nothing is written
    assert run.exit_code == 2 and the_error(run) == verdict and len(lines(run)) == 1, run.output
    assert files_of(store) == before

    for args in (("sweep", "status", "s1"), ("leaderboard", "s1"), ("export", "s1", "--out", tmp_path / "x.json"),
                 ("report", "s1", "--out", tmp_path / "r.html")):
        read = cli(*args, "--store", store)
        if in_ledger:  # what they read is damaged: the same line, exit 2
            assert read.exit_code == 2 and the_error(read) == verdict and len(lines(read)) == 1, (args, read.output)
        else:  # they read the ledger alone: they go on, and say why in one line
            warned = [line for line in lines(read) if line.startswith("warning:")]
            assert read.exit_code == 0 and len(warned) == 1, (args, read.output)
            assert warned[0].split(";")[0] == verdict.split(";")[0].replace("error:", "warning:")
            assert advice(warned[0]) == advice(verdict)
    assert files_of(store) == before

    mended = cli(*advice(verdict))  # as written: no --force, no hand step
    assert mended.exit_code == 0, mended.output
    assert cli("store", "check", "--store", store).exit_code == 0
    assert len(Store(resolve(store)).records("s1")) == 4
    assert active_runs(store) == {f"k{i}": 1 for i in range(4)}


def test_a_foreign_mlflow_db_is_kept_aside_by_the_rebuild_with_its_tables(store, cli):
    recorded(store)
    foreign(store)
    assert cli("store", "rebuild-mirror", "--store", store).exit_code == 0
    kept, = store.glob("mlflow.db.foreign-*")
    with contextlib.closing(sqlite3.connect(kept)) as db:
        assert db.execute("select body from notes").fetchall() == [("not a benchmark",)]


# -- item 2: a sound WAL-mode database whose newest pages are in its log is not damaged ---------------------

LOGGED = """
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("pragma journal_mode = wal"); db.execute("pragma wal_autocheckpoint = 0")
db.execute("create table t (i integer primary key, body text)")
db.executemany("insert into t (body) values (?)", [("x" * 3000,)] * 40)
db.execute("pragma wal_checkpoint(passive)")  # the pages are copied, the log keeps them (not reset)
os._exit(0)  # killed before it closes: no final checkpoint, the log stays
"""


def logged_db(tmp_path: Path) -> Path:
    path = tmp_path / "logged.db"
    subprocess.run([sys.executable, "-c", LOGGED, str(path)], check=True)
    with open(path, "r+b") as fh:  # a checkpoint that filled the disk: the header copied, the file not grown
        fh.truncate(4096)
    return path


def test_a_file_whose_missing_pages_are_in_its_log_is_sound(tmp_path):
    from storage.ledger import sqlite_damage

    path = logged_db(tmp_path)
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        assert db.execute("pragma integrity_check").fetchall() == [("ok",)]  # SQLite reads it whole
        assert db.execute("select count(*) from t").fetchone() == (40,)
    assert sqlite_damage(path, full=True) is None  # today's main: "cut short: 4096 bytes where its header says"


def test_a_file_whose_missing_pages_are_not_in_its_log_is_cut_short(tmp_path):
    from storage.ledger import sqlite_damage

    path = logged_db(tmp_path)
    log = path.with_name(path.name + "-wal")
    log.write_bytes(log.read_bytes()[:32 + 2 * (24 + 4096)])  # the log keeps only its first two frames
    assert "cut short" in (sqlite_damage(path, full=True) or "")
    log.unlink()
    assert "cut short" in (sqlite_damage(path, full=True) or "")


def test_a_mirror_without_the_sweeps_experiment_names_the_rebuild_that_mends_it(store, store_template, cli):
    """mlflow.db replaced by another, sound MLflow database (no experiment for the ledger's sweep): the line
    used to name `privbench store rebuild-mirror`, which refuses a sound file; it names the forced one now."""
    from storage.errors import StoreError
    from tests.storage.conftest import _copy_db
    from tests.storage.test_ledger_survives_mirror import opened

    recorded(store)
    (store / "mlflow.db").unlink()
    _copy_db(store_template / "mlflow.db", store / "mlflow.db")
    with pytest.raises(StoreError) as info:
        opened(store)
    assert advice(str(info.value)) == ["store", "rebuild-mirror", "--store", str(store), "--force"]
    assert cli(*advice(str(info.value))).exit_code == 0
    again = opened(store)
    assert len(again.records("s1")) == 4 and again.pending("s1") == []
    assert active_runs(store) == {f"k{i}": 1 for i in range(4)}
