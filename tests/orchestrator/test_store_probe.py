"""The store defects of the 179-case probe, through the real CLI: stores this user may not read or write
(root with CAP_DAC_OVERRIDE dropped, so that file permissions bind), unsupported and unreachable stores,
a port that is not Ray, leases held by another driver, a rerun with nothing to do, `privbench ui`'s
command line and output, and faults in the middle of a real sweep."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator import grid
from storage.location import resolve
from storage.store import Store
from tests.orchestrator.test_cli import IMPORTS_PROBE

ROOT = Path(__file__).resolve().parents[2]
ENV = os.environ | {"PYTHONPATH": str(ROOT)}
# Root as an ordinary user meets a file system: without the capabilities that override permissions.
UNPRIVILEGED = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
GRID = "name: done\nseeds: [0, 1]\ngrid: {dataset: [digits], model: [mlp], mechanism: [nonprivate]}\n"


def privbench(*args, timeout: float = 120, prefix: list[str] | None = None, env: dict | None = None):
    return subprocess.run([*(prefix or []), sys.executable, "-m", "orchestrator", *map(str, args)],
                          env=env or ENV, capture_output=True, text=True, timeout=timeout)


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.fixture
def finished(tmp_path) -> tuple[Path, Path]:
    """A store whose sweep (the grid file next to it) has every trial finished, written as the driver does."""
    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    spec = grid.load(path)
    folder = tmp_path / "store"
    st = Store(resolve(folder), create=True)
    st.open_sweep(spec.name, spec.text, [t.to_dict() for t in spec.trials], key_of=grid.stored_key)
    for cfg in (t.to_dict() for t in spec.trials):
        st.record({"sweep": spec.name, "trial_key": cfg["trial_key"], "status": "finished", "config": cfg,
                   "metrics": {"accuracy": 0.9, "wall_s": 1.0}})
    st.close()
    return folder, path


@pytest.fixture(scope="module")
def pg():
    """A throwaway PostgreSQL cluster (Debian's binaries) for this module, always stopped."""
    from tests.servers import postgres

    with postgres() as server:
        yield server


def sidecars(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(("-wal", "-shm")))


READS = [("sweep", "list"), ("sweep", "status", "done"), ("leaderboard", "done", "--format", "json"),
         ("export", "done", "--format", "csv", "--out", os.devnull)]


def test_read_commands_create_no_file_on_a_cleanly_closed_store(finished):
    folder, _ = finished
    before = sorted(p.name for p in folder.iterdir())
    for args in READS:
        assert privbench(*args, "--store", folder).returncode == 0
    assert sorted(p.name for p in folder.iterdir()) == before and sidecars(folder) == []


def test_a_store_this_user_cannot_write_is_readable(finished):
    folder, grid_file = finished
    subprocess.run(["chmod", "-R", "a-w", str(folder)], check=True)
    try:
        for args in READS:
            result = privbench(*args, "--store", folder, prefix=UNPRIVILEGED)
            assert result.returncode == 0, (args, result.stderr)
        status = privbench("sweep", "status", "done", "--store", folder, "--json", prefix=UNPRIVILEGED)
        assert json.loads(status.stdout)["counts"] == {"finished": 2}
        grid_file.write_text(GRID.replace("[0, 1]", "[0, 1, 2]"))  # real work to do: it needs write access
        result = privbench("sweep", "run", grid_file, "--store", folder, prefix=UNPRIVILEGED)
        assert result.returncode == 2 and "needs write access" in one_line(result)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(folder)], check=True)


def test_a_store_folder_without_permission_is_one_line(finished):
    folder, grid_file = finished
    folder.chmod(0)
    try:
        for args in (("sweep", "list"), ("leaderboard", "done"), ("sweep", "run", grid_file)):
            result = privbench(*args, "--store", folder, prefix=UNPRIVILEGED)
            assert result.returncode == 2 and "permission denied" in one_line(result), (args, result.stderr)
    finally:
        folder.chmod(0o755)


def test_a_rerun_with_nothing_to_do_starts_neither_ray_nor_mlflow(finished, tmp_path):
    folder, grid_file = finished
    out = tmp_path / "modules.json"
    result = subprocess.run([sys.executable, "-c", IMPORTS_PROBE, str(out), "sweep", "run", str(grid_file),
                             "--store", str(folder)], env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "2 trials, 2 already finished, 0 to run; nothing to do" in result.stderr
    modules = set(json.loads(out.read_text()))
    assert not modules & {"ray", "mlflow"}, sorted(modules & {"ray", "mlflow"})
    assert sidecars(folder) == []


@pytest.mark.slow
def test_trials_leased_by_a_dead_remote_driver_exit_1_and_say_when(finished):
    """A driver on another machine died holding a lease (it is never renewed): the sweep ends with that
    trial not run, exit 1, when the lease lapses and how to take it over; `--steal-leases` runs it."""
    folder, grid_file = finished
    with sqlite3.connect(folder / "ledger.db") as db:
        db.execute("update privbench_trials set status='running', result_json=null, lease_owner=?, "
                   "lease_expires=? where seed=1", ("elsewhere:4242:cafe", time.time() + 300))
    env = ENV | {"PRIVBENCH_LEASE_S": "6"}  # the wait for a renewal is a third of it
    result = privbench("sweep", "run", grid_file, "--store", folder, env=env, timeout=600)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "1 trial(s) not run" in lines[0] and "elsewhere:4242:cafe" in lines[0] and "--steal-leases" in lines[0]
    assert "lapse in 2" in lines[0]  # about 280-300 s
    stolen = privbench("sweep", "run", grid_file, "--store", folder, "--steal-leases", env=env, timeout=600)
    assert stolen.returncode == 0, stolen.stderr[-3000:]
    status = privbench("sweep", "status", "done", "--store", folder, "--json")
    assert json.loads(status.stdout)["counts"] == {"finished": 2}


def test_mysql_is_refused_with_the_supported_back_ends():
    result = privbench("sweep", "list", "--store", "mysql://bob:hunter2@db.example/x")
    line = one_line(result)
    assert result.returncode == 2 and "MySQL is not supported" in line and "postgresql://" in line
    assert "hunter2" not in result.stderr


def test_an_unreachable_server_creates_no_file(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    home = tmp_path / "home"
    env = ENV | {"HOME": str(home), "XDG_DATA_HOME": str(home / "data")}
    start = time.monotonic()
    result = privbench("sweep", "run", path, "--store", "http://127.0.0.1:1", env=env)
    assert time.monotonic() - start < 60
    assert result.returncode == 2 and "cannot reach the MLflow server" in one_line(result)
    assert not home.exists()


def silent_or_chatty_server(reply: bytes) -> tuple[socket.socket, int]:
    """A TCP server that accepts connections and answers `reply` (nothing when empty), never Ray."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    conns: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conns.append(conn)
            if reply:
                conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


@pytest.mark.parametrize("reply, said", [(b"", "did not answer"), (b"HTTP/1.1 400 Bad Request\r\n\r\n", "HTTP/1"),
                                         (b"SSH-2.0-OpenSSH_9.2\r\n", "SSH")])
def test_an_address_that_is_not_ray_fails_fast_and_says_what_answered(tmp_path, reply, said):
    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    srv, port = silent_or_chatty_server(reply)
    try:
        start = time.monotonic()
        result = privbench("sweep", "run", path, "--store", tmp_path / "s", "--address", f"127.0.0.1:{port}")
        assert time.monotonic() - start < 60
    finally:
        srv.close()
    line = one_line(result)
    assert result.returncode == 2 and "is not a Ray cluster" in line and said in line, line
    assert not (tmp_path / "s").exists()


def children_cmdlines(pid: int) -> list[str]:
    """The command lines of `pid` and all its descendants, as every user of the machine can read them."""
    lines, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            lines.append(Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return lines


@pytest.mark.slow
def test_ui_keeps_the_password_out_of_argv_and_its_output_quiet(pg, tmp_path):
    """`privbench ui` on a PostgreSQL store (the URI from PRIVBENCH_STORE): no process's argv holds the
    password, the UI answers, and its output is the link alone, not MLflow's start-up noise."""
    from tests.servers import PG_PASSWORD, free_port, stop_group, wait_http

    uri = pg.database()
    st = Store(resolve(uri), create=True)
    st.open_sweep("s1", "yaml", [{"trial_key": "k0", "dataset": "digits", "model": "mlp", "mechanism": "nonprivate",
                                  "epsilon": None, "seed": 0}])
    st.close()
    port = free_port()
    log = tmp_path / "ui.log"
    with open(log, "w") as fh:
        ui = subprocess.Popen([sys.executable, "-m", "orchestrator", "ui", "--port", str(port)],
                              env=ENV | {"PRIVBENCH_STORE": uri}, stdout=fh, stderr=subprocess.STDOUT,
                              start_new_session=True)
        try:
            wait_http(f"http://127.0.0.1:{port}/health", ui)
            for _ in range(3):  # requests: no access-log line each
                urllib_get(f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/get-by-name?experiment_name=s1")
            cmdlines = children_cmdlines(ui.pid)
            assert len(cmdlines) >= 3, cmdlines  # privbench ui, mlflow server, uvicorn (and its workers)
            assert not [c for c in cmdlines if PG_PASSWORD in c or "postgresql" in c], cmdlines
        finally:
            stop_group(ui)
    text = log.read_text()
    assert "s1: http://127.0.0.1:" in text
    for noise in ("Registry store URI", "Security middleware", "DeprecationWarning", "INFO", "GET /api"):
        assert noise not in text, text
    assert PG_PASSWORD not in text


def urllib_get(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def hostile_role(pg, password: str) -> str:
    """A role with `password` owning a fresh database; its URI typed as a user would (unescaped)."""
    import psycopg

    uri = pg.database()
    db = uri.rsplit("/", 1)[1]
    role = f"r{abs(hash(password)) % 10**8}"
    with psycopg.connect(pg.uri(), autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {role}")  # noqa: S608 - test-made identifiers
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")  # noqa: S608
        conn.execute(f'ALTER DATABASE "{db}" OWNER TO {role}')
    return f"postgresql://{role}:{password}@127.0.0.1:{pg.port}/{db}"


@pytest.mark.slow
@pytest.mark.parametrize("password", ["Car/olPw1", "Wr@ngP@ss999", "ha#sh:pw", "per%cent 100%"])
def test_hostile_passwords_on_every_print_path(pg, tmp_path, password):
    """Normal (a store opened, listed and summarised), error (refused, wrong password) and UI paths print
    the URI with `***`; the password reaches PostgreSQL whole."""
    uri = hostile_role(pg, password)
    st = Store(resolve(uri), create=True)  # connects: the parsed password is the right one
    st.open_sweep("s1", "yaml", [])
    st.close()
    normal = privbench("sweep", "list", "--store", uri)
    assert normal.returncode == 0, normal.stderr
    wrong = privbench("sweep", "list", "--store", uri.replace(password, password + "x"))
    assert wrong.returncode == 2 and "rejected the credentials" in one_line(wrong)
    refused = privbench("sweep", "list", "--store", uri.replace(f":{pg.port}/", ":1/"))
    assert refused.returncode == 2 and "***" in one_line(refused)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    with busy:
        ui = privbench("ui", "--store", uri, "--port", busy.getsockname()[1])
    assert ui.returncode == 2 and "cannot serve" in one_line(ui)
    for result in (normal, wrong, refused, ui):
        assert password not in result.stdout + result.stderr
        assert password.split("@")[-1] not in result.stderr.replace("127.0.0.1", "")


SWEEP = ("name: faults\nseeds: [0, 1, 2]\ngrid: {dataset: [digits], model: [mlp], mechanism: [nonprivate]}\n"
         "train: {epochs: 1, batch_size: 64, lr: 0.5, max_train_examples: 128}\naudit: {enabled: false}\n"
         "resources: {cpus: 1, gpus: 0}\n")


def driver(grid_file: Path, store: Path, fault: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in ENV.items() if k != "PRIVBENCH_FAULT"} | {"PYTHONUNBUFFERED": "1"}
    env |= {"PRIVBENCH_FAULT": fault} if fault else {}
    return subprocess.Popen([sys.executable, "-m", "orchestrator", "sweep", "run", str(grid_file), "--store",
                             str(store), "--max-concurrent", "1"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    from tests.servers import stop_group

    try:
        out, err = proc.communicate(timeout=600)
    finally:
        stop_group(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def errors(result: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_a_store_deleted_mid_sweep_stops_the_driver_with_exit_1(tmp_path):
    """The driver pauses (fault hook) just before writing its second result; the store is deleted; it
    resumes, writes into the deleted file, notices, and stops with one line instead of `3 finished`."""
    import shutil
    import signal

    from tests.storage.test_store_faults import proc_state

    grid_file, store = tmp_path / "grid.yaml", tmp_path / "store"
    grid_file.write_text(SWEEP)
    proc = driver(grid_file, store, "before_ledger_record:2:stop")
    try:
        deadline = time.monotonic() + 400
        while proc_state(proc.pid) != "T":
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the driver never reached its second record"
            time.sleep(0.1)
        shutil.rmtree(store)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    result = finish(proc)
    lines = errors(result)
    assert result.returncode == 1 and len(lines) == 1 and "was deleted while the sweep ran" in lines[0], result.stderr
    assert "3 finished" not in result.stderr


@pytest.mark.slow
def test_a_full_disk_mid_sweep_is_one_line_exit_1_and_the_rerun_resumes(tmp_path):
    grid_file, store = tmp_path / "grid.yaml", tmp_path / "store"
    grid_file.write_text(SWEEP)
    result = finish(driver(grid_file, store, "before_ledger_record:2:enospc"))
    lines = errors(result)
    assert result.returncode == 1 and len(lines) == 1 and "disk is full; what was recorded is kept" in lines[0]
    status = privbench("sweep", "status", "faults", "--store", store, "--json")
    assert json.loads(status.stdout)["counts"].get("finished") == 1
    rerun = finish(driver(grid_file, store))
    assert rerun.returncode == 0 and "1 already finished, 2 to run" in rerun.stderr, rerun.stderr[-3000:]


@pytest.mark.slow
def test_a_run_refused_on_a_server_creates_no_ledger_file(tmp_path):
    """User A's sweep is on the tracking server; user B (own home, no ledger yet) runs a grid of the same
    name: refused, one line, exit 2, and B's per-user ledger file is never created."""
    from tests.servers import mlflow_server

    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    (tmp_path / "srv").mkdir()
    with mlflow_server(f"sqlite:///{tmp_path / 'srv' / 'mlflow.db'}", tmp_path / "srv" / "artifacts") as url:
        a = Store(resolve(url, ledger=f"sqlite:///{tmp_path / 'a-ledger.db'}"), create=True)
        a.open_sweep("done", GRID, [])
        a.close()
        home = tmp_path / "home-b"
        env = ENV | {"HOME": str(home), "XDG_DATA_HOME": str(home / "data")}
        result = privbench("sweep", "run", path, "--store", url, env=env)
    assert result.returncode == 2 and "belongs to another privbench ledger" in one_line(result)
    assert not home.exists() or not list(home.rglob("*.db")), sorted(home.rglob("*"))


@pytest.mark.slow
def test_an_http_store_password_is_never_printed(tmp_path):
    """Issue 31 #12 and #13: MLflow printed "View run ... at: http://alice:PASSWORD@..." on stdout for every
    run, and a password with `#`, `/` or `?` crashed every command. A real sweep on a real `mlflow server`."""
    from tests.servers import mlflow_server

    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    (tmp_path / "srv").mkdir()
    password = "Ha#sh/pw?x@y"
    home = tmp_path / "home"
    env = ENV | {"HOME": str(home), "XDG_DATA_HOME": str(home / "data")}
    with mlflow_server(f"sqlite:///{tmp_path / 'srv' / 'mlflow.db'}", tmp_path / "srv" / "artifacts") as url:
        store = url.replace("http://", f"http://alice:{password}@")
        result = privbench("sweep", "run", path, "--store", store, env=env, timeout=600)
        status = privbench("sweep", "status", "done", "--store", store, "--json", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(status.stdout)["counts"] == {"finished": 2}
    for text in (result.stdout, result.stderr, status.stdout, status.stderr):
        assert "Ha#sh" not in text and "View run" not in text, text[-2000:]
