"""The CLI as a person meets it: fast start, one-line errors with exit 2, read commands that never write."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.location import resolve
from storage.store import Store

ROOT = Path(__file__).resolve().parents[2]
ENV = os.environ | {"PYTHONPATH": str(ROOT)}


def privbench(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", *map(str, args)], env=ENV, capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def record(i: int) -> dict:
    mech = "nonprivate" if i % 3 == 0 else "dpsgd"
    cfg = {"mechanism": mech, "dataset": "digits", "model": "mlp", "seed": i // 3 % 5,
           "epsilon": None if mech == "nonprivate" else float(1 + i % 3), "delta": 1e-5, "train": {"batch_size": 64}}
    return {"sweep": "big", "trial_key": f"key{i:04d}", "status": "finished", "config": cfg,
            "metrics": {"accuracy": 0.8 + i / 1000, "wall_s": 1.0, "step_time_s": 0.01},
            "privacy": {"epsilon_claimed": cfg["epsilon"], "epsilon_certified": cfg["epsilon"]}}


@pytest.fixture(scope="module")
def big_store(tmp_path_factory) -> Path:
    """A store with 150 recorded trials (written through Store, as the driver does)."""
    folder = tmp_path_factory.mktemp("big") / "store"
    st = Store(resolve(folder), create=True)
    recs = [record(i) for i in range(150)]
    st.open_sweep("big", "name: big", [r["config"] | {"trial_key": r["trial_key"]} for r in recs])
    for r in recs:
        st.record(r)
    st.close()  # last connections closed: the WAL is checkpointed into the files
    return folder


# What the CLI may import: heavy libraries only where a command needs them. How fast that makes it is
# measured, not asserted (a timed test flakes on a shared machine): benchmarks/cli_latency.py.
HEAVY = ("torch", "ray", "mlflow", "opacus", "mechanisms", "workers", "matplotlib", "sklearn", "transformers",
         "scipy", "pandas", "numpy", "sqlalchemy", "alembic")
IMPORTS_PROBE = """
import atexit, json, runpy, sys
out = sys.argv[1]
def dump():
    with open(out, "w") as fh:
        json.dump(sorted({m.split(".")[0] for m in sys.modules}), fh)
atexit.register(dump)
sys.argv = ["privbench", *sys.argv[2:]]
runpy.run_module("orchestrator", run_name="__main__")
"""


def imported_by(tmp_path: Path, *args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    """Run `privbench ARGS` in a fresh interpreter; the top-level packages it had imported at exit."""
    out = tmp_path / "modules.json"
    result = subprocess.run([sys.executable, "-c", IMPORTS_PROBE, str(out), *map(str, args)], env=ENV,
                            capture_output=True, text=True, timeout=300)
    return set(json.loads(out.read_text())) & set(HEAVY), result


def test_help_imports_nothing_heavy(tmp_path):
    heavy, result = imported_by(tmp_path, "--help")
    assert result.returncode == 0 and "sweep" in result.stdout, result.stderr
    assert heavy == set(), f"privbench --help imports {sorted(heavy)}"
    heavy, result = imported_by(tmp_path, "sweep", "run", "--help")
    assert result.returncode == 0 and heavy == set(), sorted(heavy)


def test_the_imports_probe_sees_a_heavy_import(tmp_path):
    """The probe can fail: a command that imports torch is seen doing so (here a dry run of a grid that gives
    model options, whose schema is the model builder's signature: checking them imports the builder)."""
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\nseeds: [0]\ngrid: {dataset: [digits], model: [mlp], mechanism: [nonprivate]}\n"
                    "model_options: {mlp: {hidden: 64}}\n")
    heavy, result = imported_by(tmp_path, "sweep", "run", grid, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "torch" in heavy


# Read commands read the ledger (SQLAlchemy) and, for tables, pandas; never training, Ray or MLflow.
READ_ALLOWED = {"sqlalchemy", "pandas", "numpy"}


@pytest.mark.parametrize("args", [("sweep", "status", "big"), ("leaderboard", "big", "--format", "json"),
                                  ("sweep", "list"), ("leaderboard", "big", "--format", "csv")])
def test_read_commands_import_no_training_ray_or_mlflow(big_store, tmp_path, args):
    heavy, result = imported_by(tmp_path, *args, "--store", big_store)
    assert result.returncode == 0, result.stderr
    assert heavy <= READ_ALLOWED, f"{' '.join(args)} imports {sorted(heavy - READ_ALLOWED)}"


def test_export_is_complete_and_imports_no_training_ray_or_mlflow(big_store, tmp_path):
    heavy, result = imported_by(tmp_path, "export", "big", "--store", big_store, "--format", "csv",
                                "--out", tmp_path / "x.csv")
    assert result.returncode == 0, result.stderr
    assert heavy <= READ_ALLOWED, sorted(heavy - READ_ALLOWED)
    assert len((tmp_path / "x.csv").read_text().splitlines()) == 151


def test_export_to_a_missing_folder_and_unknown_metric_are_one_line(big_store, tmp_path):
    result = privbench("export", "big", "--store", big_store, "--format", "csv", "--out", tmp_path / "no/dir/x.csv")
    assert result.returncode == 2 and "does not exist" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = privbench("leaderboard", "big", "--store", big_store, "--metric", "nosuch")
    assert result.returncode == 2 and "unknown metric 'nosuch'" in result.stderr and "accuracy" in result.stderr


def test_read_commands_do_not_touch_the_store(big_store):
    """The databases and artifacts are unchanged. SQLite's own -shm/-wal sidecars are not data: a reader
    of a WAL database (mode=ro) makes an empty write-ahead log and its shared-memory index to read it."""
    def files() -> dict:
        return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in big_store.iterdir()
                if not p.name.endswith(("-shm", "-wal"))}

    before = files()
    for args in (("sweep", "status"), ("sweep", "list"), ("leaderboard",), ("export", "--out", os.devnull)):
        assert privbench(*args, "--store", big_store).returncode == 0
    assert files() == before
    assert all(p.stat().st_size == 0 for p in big_store.glob("*-wal"))  # nothing was written to a log


@pytest.mark.parametrize("damage, fragment", [
    (lambda s: (s / "ledger.db").write_bytes(b"garbage" * 500), "not a SQLite database"),
    (lambda s: (s / "ledger.db").write_bytes(b""), "is empty"),
    (lambda s: (s / "mlflow.db").write_bytes(b""), "mlflow.db is empty"),
])
def test_damaged_store_is_one_line_and_exit_2(big_store, tmp_path, damage, fragment):
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(big_store, copy, ignore=shutil.ignore_patterns("*-wal", "*-shm", "*.lock"))
    damage(copy)
    grid = tmp_path / "g.yaml"
    grid.write_text("name: big\ngrid: {dataset: [digits], model: [mlp], mechanism: [nonprivate]}\n")
    for args in (("sweep", "status"), ("sweep", "run", grid)):
        result = privbench(*args, "--store", copy)
        if fragment == "mlflow.db is empty" and args[1] == "status":
            assert result.returncode == 0  # the ledger is intact: reading works, and writes nothing
            assert (copy / "mlflow.db").stat().st_size == 0
            continue
        assert result.returncode == 2, result.stderr
        assert fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_read_only_store_stays_readable_and_run_says_why(big_store, tmp_path):
    """Files and folder made immutable (`chattr +i`: even root cannot write them, as for a store on a
    read-only share)."""
    import shutil

    copy = tmp_path / "ro"
    shutil.copytree(big_store, copy, ignore=shutil.ignore_patterns("*-wal", "*-shm", "*.lock"))
    grid = tmp_path / "g.yaml"
    grid.write_text("name: big\ngrid: {dataset: [digits], model: [mlp], mechanism: [nonprivate]}\n")
    paths = [*copy.iterdir(), copy]
    subprocess.run(["chattr", "+i", *map(str, paths)], check=True)
    try:
        status = privbench("sweep", "status", "big", "--store", copy, "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["counts"] == {"finished": 150}
        board = privbench("leaderboard", "big", "--store", copy, "--format", "json")
        assert board.returncode == 0 and json.loads(board.stdout)
        result = privbench("sweep", "run", grid, "--store", copy)
        assert result.returncode == 2 and "read-only" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    finally:
        subprocess.run(["chattr", "-i", *map(str, paths)], check=True)


def test_unreachable_address_fails_fast(write_grid, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    start = time.perf_counter()
    result = privbench("sweep", "run", write_grid(), "--store", tmp_path / "s", "--address", f"127.0.0.1:{port}")
    assert time.perf_counter() - start < 30
    assert result.returncode == 2 and "cannot reach the Ray cluster" in result.stderr
    assert not (tmp_path / "s").exists()


def test_ui_exits_non_zero_when_the_port_is_busy(big_store):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        result = privbench("ui", "--store", big_store, "--port", busy.getsockname()[1], timeout=60)
    assert result.returncode == 2 and "cannot serve" in result.stderr
    bad = privbench("ui", "--store", big_store, "--port", "70000")
    assert bad.returncode == 2


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGTERM, marks=pytest.mark.slow), signal.SIGINT])  # 15 s each
def test_ui_stops_its_server_on_sigterm_and_sigint(big_store, sig):
    from tests.servers import free_port, stop_group, wait_http

    port = free_port()
    ui = subprocess.Popen([sys.executable, "-m", "orchestrator", "ui", "--store", str(big_store), "--port", str(port)],
                          env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", ui)
        ui.send_signal(sig)
        assert ui.wait(timeout=60) == 0
        deadline = time.monotonic() + 30
        while True:  # the server (its own process group) is gone: nothing answers on the port
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) != 0:
                    break
            assert time.monotonic() < deadline, "the MLflow server outlived privbench ui"
            time.sleep(0.1)  # poll interval
    finally:
        stop_group(ui)
