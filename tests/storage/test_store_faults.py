"""Faults under a recording driver, at the store (no Ray): a deleted or replaced store, a paused driver
that another took over from, a full disk (a real tmpfs, and the fault hook), a tracking server that dies,
passwords that a URL pattern misreads."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.errors import StoreError, StoreLost
from storage.location import mask, mask_uri, normalise_db_uri, resolve
from storage.store import Store
from tests.storage.test_store import CONFIGS, active, client_of, opened, record_for

ROOT = Path(__file__).resolve().parents[2]


def test_a_deleted_store_stops_the_driver(store):
    st = opened(store)
    assert st.record(record_for("k0"))
    shutil.rmtree(store)
    with pytest.raises(StoreLost, match="was deleted while the sweep ran"):
        st.record(record_for("k1"))


def test_a_replaced_store_stops_the_driver(store, tmp_path):
    st = opened(store)
    assert st.record(record_for("k0"))
    store.rename(tmp_path / "moved-away")
    subprocess.run([sys.executable, "-c", "import sys; from storage.store import Store; "  # a new, empty store
                    "Store(sys.argv[1], create=True)", str(store)],  # where the old one was (another process)
                   env=os.environ | {"PYTHONPATH": str(ROOT)}, check=True)
    with pytest.raises(StoreLost, match="was replaced while the sweep ran"):
        st.record(record_for("k1"))


def test_a_store_deleted_while_a_result_is_written_is_noticed_after_it(store, monkeypatch):
    st = opened(store)
    write = st.sink.write_run

    def write_then_delete(*args):
        run_id = write(*args)
        shutil.rmtree(store)  # between the MLflow run and the ledger row
        return run_id

    monkeypatch.setattr(st.sink, "write_run", write_then_delete)
    with pytest.raises(StoreLost):
        st.record(record_for("k0"))


PAUSED_DRIVER = """
import json, sys
from storage.location import resolve
from storage.store import Store
from tests.storage.test_store import CONFIGS, record_for
st = Store(resolve(sys.argv[1]), create=True)
st.open_sweep("s1", "yaml", CONFIGS)
assert st.claim("s1", "k0")
print(json.dumps({"run_id": st.record(record_for("k0"))}), flush=True)
"""


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_paused_driver_that_lost_its_trial_stands_down(store):
    """Driver A pauses (SIGSTOP) right after creating the trial's run, past its lease; B takes the trial
    over (deleting A's half-written run) and records it; A, resumed, stands down: no traceback, no run."""
    env = os.environ | {"PYTHONPATH": str(ROOT), "PRIVBENCH_LEASE_S": "1", "PRIVBENCH_FAULT": "after_create_run:1:stop"}
    a = subprocess.Popen([sys.executable, "-c", PAUSED_DRIVER, str(store)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while proc_state(a.pid) != "T":  # wait for the pause itself
            assert a.poll() is None, a.stderr.read()
            assert time.monotonic() < deadline, "driver A never paused"
            time.sleep(0.05)
        while True:  # A's lease lapses (1 s): B can claim the trial
            b = opened(store)
            if b.claim("s1", "k0"):
                break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        b_run = b.record(record_for("k0"))
    finally:
        os.kill(a.pid, signal.SIGCONT)
    out, err = a.communicate(timeout=120)
    assert a.returncode == 0, err
    assert "Traceback" not in err and "MlflowException" not in err
    assert '"run_id": null' in out  # A stood down
    runs = active(client_of(store), "s1")
    assert [r.info.run_id for r in runs] == [b_run]


def test_a_full_disk_at_the_ledger_write_is_one_line_and_keeps_what_was_recorded(store, monkeypatch):
    """Through the fault hook: OSError 28 exactly at the ledger write of the second trial."""
    monkeypatch.setenv("PRIVBENCH_FAULT", "before_ledger_record:2:enospc")
    monkeypatch.setattr("storage.faults._FAULT_COUNTS", {})
    st = opened(store)
    assert st.record(record_for("k0"))
    with pytest.raises(StoreLost, match="disk is full; what was recorded is kept"):
        st.record(record_for("k1"))
    monkeypatch.delenv("PRIVBENCH_FAULT")
    again = opened(store)
    assert {t["trial_key"]: t["status"] for t in again._ledger.trials("s1")}["k0"] == "finished"
    # the rerun resumes: k1's run was complete when the disk filled, so it is adopted rather than run again
    assert [c["trial_key"] for c in again.pending("s1")] == ["k2"] and again.reconciled["s1"].adopted == ("k1",)


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str = "4m"):
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); the fault-hook test covers the path")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def test_a_really_full_disk_is_one_line_and_keeps_what_was_recorded(tmp_path):
    with tiny_tmpfs(tmp_path / "disk", "8m") as disk:
        st = Store(resolve(disk / "store"), create=True)
        st.open_sweep("s1", "yaml", CONFIGS)
        assert st.record(record_for("k0"))
        filler = disk / "filler"
        with open(filler, "wb") as fh, contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        big = record_for("k1") | {"curves": {"loss": [0.1] * 20000}}  # more than the few bytes left
        with pytest.raises(StoreError) as info:
            st.record(big)
        assert "disk is full" in str(info.value) and "\n" not in str(info.value)
        st.close()
        filler.unlink()
        again = opened(disk / "store")
        assert {t["trial_key"]: t["status"] for t in again._ledger.trials("s1")}["k0"] == "finished"
        assert again.record(record_for("k1"))  # free space, rerun: it resumes
        again.close()


HOSTILE = ["Car/olPw1", "Wr@ngP@ss999", "ha#sh#pw", "co:lo:n", "per%cent", "100%", "sp ace pw", "a/b@c#d:e%f g?h"]


@pytest.mark.parametrize("password", HOSTILE)
def test_hostile_passwords_are_parsed_and_masked(password):
    raw = f"postgresql://alice:{password}@127.0.0.1:5432/db"
    location = resolve(raw)
    assert password not in location.display and "alice:***@127.0.0.1:5432/db" in location.display
    from sqlalchemy.engine import make_url

    url = make_url(normalise_db_uri(raw))  # what the driver connects with: the whole password, the right host
    assert (url.password, url.host, url.port, url.database) == (password, "127.0.0.1", 5432, "db")
    assert password not in mask(f"connection to {raw} failed: FATAL: password {password} rejected")
    assert password not in mask_uri(raw)


@pytest.mark.slow
def test_a_tracking_server_that_dies_mid_sweep_is_one_line(tmp_path):
    from tests.servers import free_port, stop_group, wait_http

    port = free_port()
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                               f"sqlite:///{tmp_path / 'mlflow.db'}", "--artifacts-destination",
                               str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
                               "--workers", "1"], env=os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", server)
        st = Store(resolve(f"http://127.0.0.1:{port}", ledger=f"sqlite:///{tmp_path / 'ledger.db'}"), create=True)
        st.open_sweep("s1", "yaml", CONFIGS)
        assert st.record(record_for("k0"))
    finally:
        stop_group(server)
        log.close()
    start = time.monotonic()
    with pytest.raises(StoreError) as info:
        st.record(record_for("k1"))
    assert time.monotonic() - start < 120
    message = str(info.value)
    assert "\n" not in message and "stopped answering" in message and "rerun" in message


@pytest.mark.parametrize("password", ["Ha#sh", "sl/ash", "qu?ery", "a/b@c#d:e%f g?h"])
def test_an_http_password_with_url_characters_reaches_mlflow_whole(password):
    """Issue 31 #13: `#`, `/` or `?` in an http store's password crashed every command ("Port could not be
    cast to integer value as 'Ha'") and printed its prefix. MLflow gets the password percent-escaped;
    requests decodes it for the basic-auth header."""
    import urllib.parse

    import requests
    from mlflow.tracking import MlflowClient

    location = resolve(f"http://alice:{password}@127.0.0.1:5000")
    host = MlflowClient(location.tracking_uri)._tracking_client.store.get_host_creds().host
    assert urllib.parse.urlparse(host).port == 5000 and urllib.parse.urlparse(host).hostname == "127.0.0.1"
    assert requests.utils.get_auth_from_url(host) == ("alice", password)
    assert password not in location.display and password not in mask(f"failed: {host}")


def test_a_disk_that_fills_while_the_store_is_created_leaves_it_usable_once_space_is_freed(tmp_path):
    """Issue 31 #16: MLflow's migrations stopped by a full disk left a half-migrated mlflow.db, and every later
    run failed with "table _alembic_tmp_experiments already exists", even with space freed."""
    with tiny_tmpfs(tmp_path / "disk", "400k") as disk:  # room for the ledger, not for MLflow's schema
        with pytest.raises(StoreError) as info:
            Store(resolve(disk / "store"), create=True)
        assert "disk is full" in str(info.value) and "\n" not in str(info.value)
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)  # space freed
        st = Store(resolve(disk / "store"), create=True)
        st.open_sweep("s1", "yaml", CONFIGS)
        assert st.claim("s1", "k0") and st.record(record_for("k0"))
        st.close()
        assert sorted(p.name for p in (disk / "store").iterdir() if "creating" in p.name) == []


def test_a_store_file_locked_after_the_first_result_is_one_line_naming_it_and_the_wait(store):
    """Another process takes mlflow.db's write lock (BEGIN EXCLUSIVE) after the first result: main raised
    SQLAlchemy's 'raised as a result of Query-invoked autoflush', after MLflow logged 95 lines. Now `Locked`
    (exit 2 in the CLI) names the file and the wait, the first result is kept, and a rerun resumes."""
    from storage.errors import Locked

    st = opened(store)
    assert st.claim("s1", "k0") and st.record(record_for("k0"))
    code = ("import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "db.execute('BEGIN EXCLUSIVE'); print('held', flush=True); time.sleep(300)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(store / "mlflow.db")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert st.claim("s1", "k1")
        with pytest.raises(Locked) as info:
            st.record(record_for("k1"))
    finally:
        holder.kill()
        holder.wait()
    line = str(info.value)
    assert line.startswith(f"store file {store / 'mlflow.db'} is locked by another process") and "\n" not in line
    assert "waited" in line and "what was recorded is kept" in line, line
    st.release("s1")  # as the driver does on its way out
    st.close()
    again = opened(store)
    pending = [c["trial_key"] for c in again.pending("s1")]
    assert "k0" not in pending and "k1" in pending, pending  # the first result kept, the locked one to redo
    assert again.claim("s1", "k1") and again.record(record_for("k1"))
    assert active(client_of(store), "s1") and len(again.records("s1")) == 2
