"""The store and CLI fault probe (docs/store.md, "Fault probe"): damaged databases, kills, concurrent drivers,
clock skew, secrets, failing plugins, hostile names and arguments, each run for real against a privbench
checkout and judged from what a user sees (exit code, one line, no traceback) and what the store keeps
(ledger rows and active MLflow runs per trial key, before and after).

    python scripts/fault_probe.py --tree /path/to/checkout [--only GROUP,...] [--json out.json]

`--tree` is the checkout under test (default: this one); it is put on PYTHONPATH of every command, so the
same probe measures an old and a new version side by side. `--worst` runs only the worst cases of issue 31
(torn pages, two grids at once, a kill at the ledger record, a restored backup) and prints their table.
Nothing outside a temporary folder is written; every process the probe starts is ended.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
GRID = "name: probe\nseeds: [0, 1, 2, 3]\ngrid: {dataset: [digits], model: [mlp], mechanism: [nonprivate]}\n"
TINY_TRAIN = "train: {epochs: 1, batch_size: 64}\n"


class Probe:
    """One checkout under test, and a scratch folder per case."""

    def __init__(self, tree: Path, scratch: Path) -> None:
        self.tree = tree
        self.scratch = scratch
        self.env = os.environ | {"PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}

    def folder(self, name: str) -> Path:
        path = self.scratch / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def cli(self, *args: Any, timeout: float = 300, env: dict | None = None, memory_gb: float | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        limit = None if memory_gb is None else (lambda: resource.setrlimit(
            resource.RLIMIT_AS, (int(memory_gb * 2**30), int(memory_gb * 2**30))))
        try:  # run from the tree: `python -m` and `-c` import from the working folder before PYTHONPATH
            return subprocess.run([sys.executable, "-m", "orchestrator", *map(str, args)], env=env or self.env,
                                  capture_output=True, text=True, timeout=timeout, preexec_fn=limit,
                                  cwd=cwd or self.tree)
        except subprocess.TimeoutExpired as e:
            return subprocess.CompletedProcess(e.cmd, -999, e.stdout or "", (e.stderr or "") + "\n[timed out]")

    def python(self, code: str, *args: Any, env: dict | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], env=env or self.env,
                              capture_output=True, text=True, timeout=timeout, cwd=self.tree)

    def store_with_results(self, folder: Path, keys: int = 4, failed: tuple[int, ...] = ()) -> None:
        """A store whose sweep `s1` has trials k0..k{keys-1} recorded, through the tree's own Store."""
        result = self.python(STORE_SCRIPT, folder, keys, ",".join(map(str, failed)))
        if result.returncode != 0:
            raise RuntimeError(result.stderr[-2000:])


STORE_SCRIPT = """
import sys
from storage.location import resolve
from storage.store import Store
folder, n, failed = sys.argv[1], int(sys.argv[2]), {int(i) for i in sys.argv[3].split(",") if i}
configs = [{"trial_key": f"k{i}", "dataset": "digits", "model": "mlp", "mechanism": "nonprivate", "epsilon": None,
            "seed": i} for i in range(n)]
st = Store(resolve(folder), create=True)
st.open_sweep("s1", "yaml", configs)
for c in configs:
    st.claim("s1", c["trial_key"])
    st.record({"sweep": "s1", "trial_key": c["trial_key"], "status": "failed" if c["seed"] in failed else "finished",
               "metrics": {"accuracy": 0.5}, "config": c, "error": "boom" if c["seed"] in failed else None})
st.release("s1")
st.close()
"""

OPEN_SCRIPT = """
import json, sys
from storage.location import resolve
from storage.store import Store
folder, n = sys.argv[1], int(sys.argv[2])
configs = [{"trial_key": f"k{i}", "dataset": "digits", "model": "mlp", "mechanism": "nonprivate", "epsilon": None,
            "seed": i} for i in range(n)]
st = Store(resolve(folder), create=True)
st.open_sweep("s1", "yaml", configs)
print(json.dumps(sorted(c["trial_key"] for c in st.pending("s1"))))
st.release("s1")
st.close()
"""


# what the store holds ------------------------------------------------------------------------------------
def ledger_state(folder: Path) -> dict[str, Any]:
    """Ledger rows per trial key (read past any index), or why it cannot be read."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{folder / 'ledger.db'}?mode=ro", uri=True)) as db:
            rows = db.execute("select trial_key, status, result_json is not null from privbench_trials not indexed"
                              ).fetchall()
    except sqlite3.Error as e:
        return {"error": str(e)}
    keys: dict[str, int] = {}
    for key, *_ in rows:
        keys[key] = keys.get(key, 0) + 1
    statuses: dict[str, int] = {}
    for _, status, _ in rows:
        statuses[status] = statuses.get(status, 0) + 1
    return {"rows": len(rows), "keys": len(keys), "max_rows_per_key": max(keys.values(), default=0),
            "statuses": statuses, "with_result": sum(1 for *_, r in rows if r)}


def mlflow_state(folder: Path) -> dict[str, Any]:
    """Active trial runs per trial key in mlflow.db (tables scanned past their indexes)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{folder / 'mlflow.db'}?mode=ro", uri=True)) as db:
            rows = db.execute("select t.value, r.lifecycle_stage from runs r not indexed join tags t not indexed "
                              "on t.run_uuid = r.run_uuid and t.key = 'privbench.trial_key'").fetchall()
            parents = db.execute("select count(*) from tags not indexed where key = 'privbench.sweep_run' "
                                 "and value = 'true'").fetchone()[0]
    except sqlite3.Error as e:
        return {"error": str(e)}
    active: dict[str, int] = {}
    for key, stage in rows:
        if stage == "active":
            active[key] = active.get(key, 0) + 1
    return {"active": sum(active.values()), "keys": len(active), "max_per_key": max(active.values(), default=0),
            "deleted": sum(1 for _, stage in rows if stage != "active"), "parents": parents}


def state(folder: Path) -> dict[str, Any]:
    return {"ledger": ledger_state(folder), "mlflow": mlflow_state(folder)}


def zero(path: Path, name: str, start: float, end: float) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        page = db.execute("select rootpage from sqlite_master where name = ?", (name,)).fetchone()[0]
        size = db.execute("pragma page_size").fetchone()[0]
    with open(path, "r+b") as fh:
        fh.seek((page - 1) * size + int(size * start))
        fh.write(b"\0" * (int(size * end) - int(size * start)))


def one_line(result: subprocess.CompletedProcess, code: int = 2, *, has: str = "") -> bool:
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    return (result.returncode == code and len(errors) == 1 and "Traceback" not in result.stderr
            and has in errors[0])


def said(result: subprocess.CompletedProcess) -> str:
    text = (result.stderr.strip().splitlines() or [""])[-1]
    return f"exit {result.returncode}: {text[:160]}"


# worst cases of issue 31, with the store before and after -------------------------------------------------
def worst_torn_mlflow(p: Probe, offset: tuple[float, float]) -> dict[str, Any]:
    folder = p.folder(f"w1-{offset[0]}")
    p.store_with_results(folder / "store")
    zero(folder / "store" / "mlflow.db", "runs", *offset)
    before = state(folder / "store")
    grid = folder / "g.yaml"
    grid.write_text(GRID.replace("[0, 1, 2, 3]", "[0, 1, 2, 3, 4]") + TINY_TRAIN)
    run = p.cli("sweep", "run", grid, "--store", folder / "store", "--reconcile", timeout=600)
    after = state(folder / "store")
    kept = after["ledger"] == before["ledger"]
    return {"case": f"1: mlflow.db runs page torn at {offset}", "before": before, "after": after,
            "outcome": said(run), "ok": kept and run.returncode == 2}


def worst_torn_ledger(p: Probe, offset: tuple[float, float]) -> dict[str, Any]:
    folder = p.folder(f"w2-{offset[0]}")
    p.store_with_results(folder / "store")
    zero(folder / "store" / "ledger.db", "sqlite_autoindex_privbench_trials_1", *offset)
    before = state(folder / "store")
    listed = p.cli("sweep", "list", "--json", "--store", folder / "store")
    grid = folder / "g.yaml"
    grid.write_text(GRID.replace("name: probe", "name: s1") + TINY_TRAIN)
    run = p.cli("sweep", "run", grid, "--store", folder / "store", timeout=600)
    after = state(folder / "store")
    ok = (listed.returncode == 2 and run.returncode == 2 and after["mlflow"] == before["mlflow"])
    return {"case": f"2: ledger index page torn at {offset}", "before": before, "after": after,
            "outcome": f"list: {said(listed)}; run: {said(run)}", "ok": ok}


TWO_GRIDS = """
import json, sys
from storage.location import resolve
from storage.store import Store
folder = sys.argv[1]
def configs(prefix, lr):
    return [{"trial_key": f"{prefix}{i}", "dataset": "digits", "model": "mlp", "mechanism": "dpsgd", "epsilon": 1.0,
             "seed": i, "train": {"lr": lr}} for i in range(2)]
def record(st, cfg, acc):
    return st.record({"sweep": "s1", "trial_key": cfg["trial_key"], "status": "finished", "config": cfg,
                      "metrics": {"accuracy": acc}, "privacy": {"epsilon_certified": 1.0, "claim_status": "ok"}})
a = Store(resolve(folder), create=True)
a.open_sweep("s1", "grid lr 0.5", configs("a", 0.5))   # driver A, alive, lr 0.5
claimed = [a.claim("s1", c["trial_key"]) for c in configs("a", 0.5)]
out = {"a_claimed": claimed}
try:
    b = Store(resolve(folder), create=True)
    b.open_sweep("s1", "grid lr 0.05", configs("b", 0.05))   # driver B, same name, lr 0.05, at the same time
    out["b_opened"] = True
    for c in configs("b", 0.05):
        if b.claim("s1", c["trial_key"]):
            record(b, c, 0.1)
except Exception as e:
    out["b_opened"] = False
    out["b_error"] = str(e).splitlines()[0][:200]
out["a_recorded"] = [record(a, c, 0.9) is not None for c in configs("a", 0.5)]
print(json.dumps(out))
"""


def worst_two_grids(p: Probe) -> dict[str, Any]:
    folder = p.folder("w3")
    result = p.python(TWO_GRIDS, folder / "store")
    before = {"ledger": {}, "mlflow": {}}
    after = state(folder / "store")
    board = p.cli("leaderboard", "s1", "--store", folder / "store", "--format", "json")
    try:
        rows = json.loads(board.stdout)
        mixed = [r for r in rows if (r.get("n_finished") or 0) > 2]
    except ValueError:
        rows, mixed = [], []
    out = json.loads(result.stdout or "{}")
    ok = out.get("b_opened") is False and not mixed
    return {"case": "3: two grids under one name, two live drivers", "before": before, "after": after,
            "outcome": f"B opened: {out.get('b_opened')} ({out.get('b_error', '')[:90]}); leaderboard rows "
                       f"averaging both grids: {len(mixed)}", "ok": ok}


KILLED_AT_RECORD = """
import os, signal, sys
import storage.ledger as ledger
from storage.location import resolve
from storage.store import Store
record = ledger.Ledger.record
def record_and_die(self, *args, **kwargs):
    if sys.argv[2] == "before":   # the driver dies just before the ledger row, its MLflow run complete
        os.kill(os.getpid(), signal.SIGKILL)
    done = record(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)   # the moment just after the ledger row (the new fault point)
    return done
ledger.Ledger.record = record_and_die
configs = [{"trial_key": f"k{i}", "dataset": "digits", "model": "mlp", "mechanism": "nonprivate", "epsilon": None,
            "seed": i} for i in range(4)]
st = Store(resolve(sys.argv[1]), create=True)
st.open_sweep("s1", "yaml", configs)
assert st.claim("s1", "k0")
st.record({"sweep": "s1", "trial_key": "k0", "status": "finished", "metrics": {"accuracy": 0.6}, "config": configs[0]})
"""


def worst_kill_after_record(p: Probe) -> dict[str, Any]:
    folder = p.folder("w7")
    p.store_with_results(folder / "store", failed=(0,))  # k0's first attempt failed: a rerun retries it
    before = state(folder / "store")
    killed = p.python(KILLED_AT_RECORD, folder / "store", "after")
    after = state(folder / "store")
    reopened = p.python(OPEN_SCRIPT, folder / "store", 4)  # the next driver (a rerun with nothing to do skips this)
    ok = killed.returncode == -9 and after["mlflow"].get("max_per_key") == 1
    return {"case": "7: kill just after the ledger record of a retried trial", "before": before, "after": after,
            "outcome": f"driver exit {killed.returncode}; pending after reopening: {reopened.stdout.strip()}",
            "ok": ok}


BACKUP = """
import shutil, sqlite3, sys, contextlib
from pathlib import Path
from storage.location import resolve
from storage.store import Store
folder = Path(sys.argv[1]); backup = Path(sys.argv[2])
configs = [{"trial_key": f"k{i}", "dataset": "digits", "model": "mlp", "mechanism": "nonprivate", "epsilon": None,
            "seed": i} for i in range(4)]
def rec(st, i):
    st.claim("s1", f"k{i}")
    st.record({"sweep": "s1", "trial_key": f"k{i}", "status": "finished", "metrics": {"accuracy": 0.5},
               "config": configs[i]})
st = Store(resolve(folder), create=True)
st.open_sweep("s1", "yaml", configs)
rec(st, 0)
st.release("s1")
with contextlib.closing(sqlite3.connect(folder / "ledger.db")) as a, contextlib.closing(sqlite3.connect(backup)) as b:
    a.backup(b)
for i in (1, 2, 3):
    rec(st, i)
st.release("s1")
st.close()
shutil.copyfile(backup, folder / "ledger.db")   # restored from the backup, as docs/store.md advises
"""


def worst_restored_backup(p: Probe) -> dict[str, Any]:
    folder = p.folder("w8")
    made = p.python(BACKUP, folder / "store", folder / "backup.db")
    if made.returncode != 0:
        raise RuntimeError(made.stderr[-2000:])
    before = state(folder / "store")
    reopened = p.python(OPEN_SCRIPT, folder / "store", 4)
    after = state(folder / "store")
    pending = json.loads(reopened.stdout or "null")
    ok = pending == [] and after["mlflow"].get("active") == 4 and after["ledger"]["statuses"] == {"finished": 4}
    return {"case": "8: ledger restored from a backup (3 newer runs)", "before": before, "after": after,
            "outcome": f"trials to run again: {pending}", "ok": ok}


TORN = [(0.5, 1.0), (0.0, 0.5), (0.75, 1.0), (0.9, 1.0)]


def worst(p: Probe) -> list[dict[str, Any]]:
    out = [worst_torn_mlflow(p, o) for o in TORN]
    out += [worst_torn_ledger(p, o) for o in TORN]
    out += [worst_two_grids(p), worst_kill_after_record(p), worst_restored_backup(p)]
    return out


# the probe's own cases --------------------------------------------------------------------------------------
CASES: list[tuple[str, str, Callable[[Probe], tuple[bool, str]]]] = []


def case(group: str, name: str) -> Callable:
    def add(fn: Callable[[Probe], tuple[bool, str]]) -> Callable:
        CASES.append((group, name, fn))
        return fn
    return add


def grid_file(p: Probe, name: str, text: str) -> Path:
    folder = p.folder(name)
    path = folder / "g.yaml"
    path.write_text(text)
    return path


@case("yaml", "!!bool yes in audit.enabled")
def _(p):
    r = p.cli("sweep", "run", grid_file(p, "y1", GRID + "audit: {enabled: !!bool yes}\n"), "--dry-run")
    return one_line(r, has="!!bool"), said(r)


@case("yaml", "!!python/object/apply tag")
def _(p):
    r = p.cli("sweep", "run", grid_file(p, "y2", GRID + 'x: !!python/object/apply:os.system ["echo PWNED"]\n'),
              "--dry-run")
    return one_line(r) and "PWNED" not in r.stdout + r.stderr, said(r)


@case("yaml", "1 MB flat seeds list")
def _(p):
    r = p.cli("sweep", "run", grid_file(p, "y3", GRID.replace("[0, 1, 2, 3]", "[" + ", ".join(
        map(str, range(120_000))) + "]")), "--dry-run")
    return one_line(r) and "aliases" not in r.stderr, said(r)


@case("yaml", "20-digit hex epochs")
def _(p):
    r = p.cli("sweep", "run", grid_file(p, "y4", GRID + "train: {epochs: 0xffffffffffffffffffff}\n"), "--dry-run")
    return one_line(r), said(r)


@case("names", "--store with [old] in its name")
def _(p):
    r = p.cli("sweep", "list", "--store", p.scratch / "exp[old]y")
    return one_line(r, has="exp[old]y"), said(r)


@case("names", "sweep name ../../etc")
def _(p):
    folder = p.folder("n2")
    p.store_with_results(folder / "store", keys=1)
    r = p.cli("sweep", "status", "../../etc", "--store", folder / "store")
    return one_line(r, has="unknown sweep"), said(r)


@case("names", "export --out a hard link to mlflow.db")
def _(p):
    folder = p.folder("n3")
    p.store_with_results(folder / "store", keys=1)
    os.link(folder / "store" / "mlflow.db", folder / "link.json")
    before = (folder / "store" / "mlflow.db").read_bytes()
    r = p.cli("export", "s1", "--store", folder / "store", "--out", folder / "link.json")
    return one_line(r) and (folder / "store" / "mlflow.db").read_bytes() == before, said(r)


@case("names", "grid path with an OSC escape")
def _(p):
    r = p.cli("sweep", "run", p.scratch / "\x1b]0;pwned\x07.yaml")
    return one_line(r) and "\x1b" not in r.stderr, said(r).encode("unicode_escape").decode()


RAY_GRID = GRID.replace("[0, 1, 2, 3]", "[0, 1, 2]") + "train: {epochs: 3, batch_size: 64}\n"


def ledger_finished(folder: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(folder / "ledger.db", timeout=30)) as db:
            return db.execute("select count(*) from privbench_trials where status='finished'").fetchone()[0]
    except sqlite3.Error:
        return 0


@contextlib.contextmanager
def driver(p: Probe, grid: Path, store: Path) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "sweep", "run", str(grid), "--store", str(store),
                             "--max-concurrent", "1"], env=p.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, cwd=p.tree)
    try:
        deadline = time.monotonic() + 300
        while ledger_finished(store) < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@case("kills", "SIGTERM mid-sweep")
def _(p):
    grid = grid_file(p, "k1", RAY_GRID)
    with driver(p, grid, grid.parent / "store") as proc:
        if proc.poll() is not None:
            return False, f"the driver ended before a trial finished: {proc.communicate()[1][-300:]}"
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            err = "[timed out]"
    r = subprocess.CompletedProcess([], proc.returncode, "", err)
    with contextlib.closing(sqlite3.connect(grid.parent / "store" / "ledger.db")) as db:
        held = db.execute("select count(*) from privbench_trials where lease_owner is not null").fetchone()[0]
    return one_line(r, 143) and held == 0, f"{said(r)}; leases left {held}"


@case("kills", "kill just after the ledger record of a retried trial")
def _(p):
    w = worst_kill_after_record(p)
    return w["ok"], f"{w['outcome']}; runs per key after: {w['after']['mlflow'].get('max_per_key')}"


@case("kills", "kill just before the ledger record: adopted, not trained again")
def _(p):
    folder = p.folder("k3")
    p.store_with_results(folder / "store", failed=(0,))
    killed = p.python(KILLED_AT_RECORD, folder / "store", "before")
    reopened = p.python(OPEN_SCRIPT, folder / "store", 4)
    pending = json.loads(reopened.stdout or "null")
    return killed.returncode == -9 and pending == [], f"pending after reopening: {pending}"


@case("kills", "GCS killed mid-sweep (Ray gives up on it after 20 s)")
def _(p):
    import psutil

    grid = grid_file(p, "k4", GRID.replace("[0, 1, 2, 3]", "[0, 1, 2, 3, 4, 5]")
                     + "train: {epochs: 30, batch_size: 64}\n")
    start = None
    env, p.env = p.env, p.env | {"RAY_gcs_rpc_server_reconnect_timeout_s": "20"}
    with contextlib.ExitStack() as stack:
        stack.callback(setattr, p, "env", env)
        proc = stack.enter_context(driver(p, grid, grid.parent / "store"))
        if proc.poll() is not None:
            return False, f"the driver ended before a trial finished: {proc.communicate()[1][-300:]}"
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "gcs_server" in " ".join(child.cmdline()):
                    child.kill()
        start = time.monotonic()
        try:
            _, err = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            err = "[timed out]"
    waited = time.monotonic() - start
    r = subprocess.CompletedProcess([], proc.returncode, "", err)
    statuses = ledger_state(grid.parent / "store").get("statuses", {})
    return one_line(r, 1) and "running" not in statuses, f"{said(r)}; {waited:.0f} s; {statuses}"


@case("damaged", "ledger.db cut to half its size (read: refused, or read whole)")
def _(p):
    folder = p.folder("d1")
    p.store_with_results(folder / "store")
    ledger = folder / "store" / "ledger.db"
    ledger.write_bytes(ledger.read_bytes()[:ledger.stat().st_size // 2])
    r = p.cli("sweep", "status", "s1", "--json", "--store", folder / "store")
    whole = r.returncode == 0 and json.loads(r.stdout or "{}").get("counts") == {"finished": 4}
    return one_line(r) or whole, said(r) if r.returncode else f"exit 0: {r.stdout[:80]}"


@case("damaged", "mlflow.db experiments table zeroed, sweep run --reconcile")
def _(p):
    folder = p.folder("d2")
    p.store_with_results(folder / "store")
    zero(folder / "store" / "mlflow.db", "experiments", 0.0, 1.0)
    before = ledger_state(folder / "store")
    grid = folder / "g.yaml"
    grid.write_text(GRID.replace("name: probe", "name: s1"))
    r = p.cli("sweep", "run", grid, "--store", folder / "store", "--reconcile", timeout=600)
    return one_line(r) and ledger_state(folder / "store") == before, said(r)


@case("damaged", "store check finds a damaged mlflow.db")
def _(p):
    folder = p.folder("d3")
    p.store_with_results(folder / "store")
    zero(folder / "store" / "mlflow.db", "tags", 0.5, 1.0)
    r = p.cli("store", "check", "--store", folder / "store")
    return r.returncode == 2 and "mlflow.db" in r.stderr and "Traceback" not in r.stderr, said(r)


@case("damaged", "rebuild the ledger from the MLflow runs")
def _(p):
    folder = p.folder("d4")
    p.store_with_results(folder / "store")
    zero(folder / "store" / "ledger.db", "privbench_trials", 0.5, 1.0)
    r = p.cli("store", "rebuild-ledger", "--store", folder / "store")
    after = ledger_state(folder / "store")
    return r.returncode == 0 and after.get("statuses") == {"finished": 4}, f"{said(r)}; {after.get('statuses')}"


@case("damaged", "empty mlflow.db while the ledger lists sweeps: refused before Ray")
def _(p):
    folder = p.folder("d5")
    p.store_with_results(folder / "store")
    (folder / "store" / "mlflow.db").write_bytes(b"")
    grid = folder / "g.yaml"
    grid.write_text(GRID.replace("name: probe", "name: s1"))
    start = time.monotonic()
    r = p.cli("sweep", "run", grid, "--store", folder / "store", "--reconcile", timeout=600)
    took = time.monotonic() - start
    return one_line(r, has="mlflow.db") and took < 20, f"{said(r)} in {took:.0f} s"


@case("drivers", "a second grid under a running sweep's name")
def _(p):
    w = worst_two_grids(p)
    return w["ok"], w["outcome"]


SAME_GRID = """
import json, sys
from storage.location import resolve
from storage.store import Store
configs = [{"trial_key": f"k{i}", "dataset": "digits", "model": "mlp", "mechanism": "nonprivate", "epsilon": None,
            "seed": i} for i in range(4)]
a, b = (Store(resolve(sys.argv[1]), create=True) for _ in range(2))
a.open_sweep("s1", "yaml", configs)
b.open_sweep("s1", "yaml", configs)
print(json.dumps([[st.claim("s1", c["trial_key"]) for st in (a, b)] for c in configs]))
"""


@case("drivers", "two drivers of one grid split its trials")
def _(p):
    r = p.python(SAME_GRID, p.folder("c2") / "store")
    claims = json.loads(r.stdout or "[]")
    return claims == [[True, False]] * 4, str(claims or r.stderr[-200:])


@case("drivers", "a finished driver's sweep takes an edited grid")
def _(p):
    folder = p.folder("c3")
    p.store_with_results(folder / "store", keys=2)
    r = p.python(OPEN_SCRIPT, folder / "store", 3)
    return r.returncode == 0 and json.loads(r.stdout or "null") == ["k2"], r.stdout.strip() or r.stderr[-200:]


SKEW = """
import json, sys, time
from storage.location import resolve
from storage.store import Store
configs = [{"trial_key": "k0", "dataset": "digits", "model": "mlp", "mechanism": "nonprivate", "epsilon": None,
            "seed": 0}]
a, b = (Store(resolve(sys.argv[1]), create=True) for _ in range(2))
a.open_sweep("s1", "yaml", configs)
b.open_sweep("s1", "yaml", configs)
real = time.time
time.time = lambda: real() + float(sys.argv[2])   # driver B's clock is off by this much
got_b = b.claim("s1", "k0")
time.time = real
print(json.dumps([got_b, a.claim("s1", "k0")]))
"""


@case("skew", "a driver 120 s behind keeps its lease")
def _(p):
    r = p.python(SKEW, p.folder("s1") / "store", -120)
    return r.stdout.strip() == "[true, false]", r.stdout.strip() or r.stderr[-200:]


@case("skew", "a driver 120 s ahead keeps its lease")
def _(p):
    r = p.python(SKEW, p.folder("s2") / "store", 120)
    return r.stdout.strip() == "[true, false]", r.stdout.strip() or r.stderr[-200:]


@case("secrets", "http password with # on sweep run")
def _(p):
    r = p.cli("sweep", "run", grid_file(p, "p1", GRID), "--store", "http://alice:Ha#shPW@127.0.0.1:1")
    return one_line(r) and "Ha#sh" not in r.stderr and "shPW" not in r.stderr, said(r)


@case("secrets", "http password with / and ? on sweep run")
def _(p):
    r = p.cli("sweep", "run", grid_file(p, "p2", GRID), "--store", "http://alice:sl/ash?qPW@127.0.0.1:1")
    return one_line(r) and "ash?qPW" not in r.stderr and "qPW" not in r.stderr, said(r)


@case("secrets", "postgresql password with # / ? unreachable")
def _(p):
    r = p.cli("sweep", "list", "--store", "postgresql://alice:a#b/c?dPW@127.0.0.1:1/db")
    return one_line(r) and "dPW" not in r.stderr, said(r)


def plugin_grid(p: Probe, name: str, source: str) -> Path:
    folder = p.folder(name)
    (folder / f"{name}_plugin.py").write_text(source)
    path = folder / "g.yaml"
    path.write_text(f"name: pl\nplugins: [{name}_plugin]\ngrid: {{dataset: [digits], model: [mlp], "
                    "mechanism: [nonprivate]}\n")
    return path


@case("plugins", "a plugin that raises at import")
def _(p):
    r = p.cli("sweep", "run", plugin_grid(p, "f1", "raise RuntimeError('exploded')\n"), "--dry-run")
    return one_line(r, has="exploded"), said(r)


@case("plugins", "a plugin that calls sys.exit(3)")
def _(p):
    r = p.cli("sweep", "run", plugin_grid(p, "f2", "import sys\nsys.exit(3)\n"), "--dry-run")
    return one_line(r), said(r)


@case("plugins", "a plugin's sibling module is shipped with it")
def _(p):
    folder = p.folder("f3")
    shutil.copytree(HERE / "tests" / "plugins" / "ext_mech" / "ext_mech", folder / "ext_mech")
    (folder / "helpers.py").write_text("X = 1\n")
    (folder / "mine.py").write_text("import helpers\nfrom ext_mech.mechanisms import *  # noqa: F403\n")
    (folder / "g.yaml").write_text("name: f\nplugins: [mine]\ngrid: {dataset: [digits], model: [mlp], "
                                   "mechanism: [dpsgd-tightclip], epsilon: [2]}\n")
    r = p.python(f"from orchestrator import grid\nfrom workers.plugins import shipped\n"
                 f"print(sorted(m.__name__ for m in shipped(grid.load({str(folder / 'g.yaml')!r}).plugins)))")
    return "'helpers'" in r.stdout, r.stdout.strip() or r.stderr[-200:]


@case("cli", "audit --option noize=real")
def _(p):
    r = p.cli("audit", "gredp", "--sigma", "1", "--samples", "200", "--option", "noize=real", timeout=300)
    return one_line(r, has="noize"), said(r)


@case("cli", "privacy epsilon --sigma 1e-300")
def _(p):
    r = p.cli("privacy", "epsilon", "--sigma", "1e-300", "--sample-rate", "0.01", "--steps", "100", "--delta", "1e-5")
    return one_line(r), said(r)


@case("cli", "privacy epsilon --steps 1e11")
def _(p):
    r = p.cli("privacy", "epsilon", "--sigma", "1", "--sample-rate", "0.01", "--steps", "100000000000", "--delta",
              "1e-5", memory_gb=4, timeout=120)
    return one_line(r), said(r)


@case("cli", "leaderboard '[/bold]'")
def _(p):
    folder = p.folder("e4")
    p.store_with_results(folder / "store", keys=1)
    r = p.cli("leaderboard", "[/bold]", "--store", folder / "store")
    return one_line(r, has="[/bold]"), said(r)


@case("cli", "a 400-digit seed")
def _(p):
    r = p.cli("sweep", "run", grid_file(p, "e5", GRID.replace("[0, 1, 2, 3]", "[" + "9" * 400 + "]")), "--dry-run")
    return one_line(r), said(r)


@case("cli", "audit --samples 1e11 (memory capped at 3 GB)")
def _(p):
    r = p.cli("audit", "gredp", "--samples", "100000000000", memory_gb=3, timeout=90)
    return one_line(r, has="samples"), said(r)


# issue 40: recovery you can trust -------------------------------------------------------------------------------
BIG_RECORD_SCRIPT = """
import sys
from storage.location import resolve
from storage.store import Store
folder = sys.argv[1]
configs = [{"trial_key": f"k{i}", "dataset": "digits", "model": "mlp", "mechanism": "nonprivate", "epsilon": None,
            "seed": i} for i in range(4)]
st = Store(resolve(folder), create=True)
st.open_sweep("s1", "yaml", configs)
for c in configs:
    st.claim("s1", c["trial_key"])
    extra = {"curve": [round(0.001 * i, 3) for i in range(1500)], "marker": "MIDDLE-OF-RECORD"}
    extra = extra if c["seed"] == 2 else {}
    st.record({"sweep": "s1", "trial_key": c["trial_key"], "status": "finished", "metrics": {"accuracy": 0.5},
               "config": c, **extra})
st.release("s1")
st.close()
"""


def recovery_store(p: Probe, name: str) -> Path:
    folder = p.folder(name) / "store"
    result = p.python(BIG_RECORD_SCRIPT, folder)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return folder


def _patch(path: Path, find: bytes, offset: int, value: bytes) -> None:
    data = bytearray(path.read_bytes())
    at = data.index(find) + offset
    data[at:at + len(value)] = value
    path.write_bytes(bytes(data))


def _cut(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 1000)


def _index_disagrees(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        index_page = db.execute("select rootpage from sqlite_master where name = "
                                "'sqlite_autoindex_privbench_trials_1'").fetchone()[0]
        size = db.execute("pragma page_size").fetchone()[0]
    data = bytearray(path.read_bytes())
    for page in range(len(data) // size):
        at = data[page * size:(page + 1) * size].find(b"s1k3")
        if page + 1 != index_page and at >= 0:
            data[page * size + at + 3] = ord("9")
            break
    path.write_bytes(bytes(data))


def _torn_wal(path: Path) -> None:
    code = ("import sqlite3, os, sys; db = sqlite3.connect(sys.argv[1]); db.execute('pragma journal_mode=wal');"
            "db.execute('update privbench_trials set attempts = attempts + 1'); db.commit(); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True)
    with open(path.with_name(path.name + "-wal"), "r+b") as fh:
        fh.seek(8)
        fh.write(bytes(8))


LEDGER_DAMAGE = {
    "a changed byte in a row": lambda f: _patch(f / "ledger.db", b'"status": "finished"', 8, b";"),
    "zeroed bytes in an overflow page": lambda f: _patch(f / "ledger.db", b"MIDDLE-OF-RECORD", -200, bytes(64)),
    "a ledger cut short by 1,000 bytes": lambda f: _cut(f / "ledger.db"),
    "an index entry that no longer matches its row": lambda f: _index_disagrees(f / "ledger.db"),
    "a torn WAL header left by a killed driver": lambda f: _torn_wal(f / "ledger.db"),
}


def _damage_case(name: str, make: Callable[[Path], None]) -> None:
    @case("recovery", f"store check sees {name}, names the mend, and the mend agrees")
    def _(p):
        store = recovery_store(p, "r-" + name.split()[1])
        make(store)
        check = p.cli("store", "check", "--store", store)
        mend = p.cli("store", "rebuild-ledger", "--store", store)
        after = p.cli("store", "check", "--store", store)
        listed = p.cli("sweep", "list", "--json", "--store", store)
        ok = (check.returncode == 2 and "rebuild-ledger" in check.stderr and mend.returncode == 0
              and after.returncode == 0 and '"finished": 4' in listed.stdout)
        return ok, f"check: {said(check)}; rebuild: {said(mend)}"


for _name, _make in LEDGER_DAMAGE.items():
    _damage_case(_name, _make)


@case("recovery", "rebuild-mirror on a sound mlflow.db without --force")
def _(p):
    store = recovery_store(p, "r-mirror-sound")
    before = (store / "mlflow.db").read_bytes()
    r = p.cli("store", "rebuild-mirror", "--store", store)
    return one_line(r, has="--force") and (store / "mlflow.db").read_bytes() == before, said(r)


@case("recovery", "rebuild-ledger on a sound ledger names --force")
def _(p):
    store = recovery_store(p, "r-ledger-sound")
    r = p.cli("store", "rebuild-ledger", "--store", store)
    return one_line(r, has="--force"), said(r)


@case("recovery", "a rebuild-mirror that fails (disk full) leaves the original in place")
def _(p):
    store = recovery_store(p, "r-mirror-fails")
    os.truncate(store / "mlflow.db", (store / "mlflow.db").stat().st_size - 1000)
    before = (store / "mlflow.db").read_bytes()
    r = p.cli("store", "rebuild-mirror", "--store", store, env=p.env | {"PRIVBENCH_FAULT": "rebuild_row:2:enospc"})
    return r.returncode != 0 and (store / "mlflow.db").read_bytes() == before, said(r)


def _killed_rebuild(p: Probe, what: str) -> tuple[bool, str]:
    """Kill the rebuild (SIGKILL) as soon as it has made its first file (the new one, or the old one set
    aside): the same moment on any version, found by watching the folder."""
    store = recovery_store(p, f"r-kill-{what}")
    target = "ledger.db" if what == "ledger" else "mlflow.db"
    if what == "ledger":
        _patch(store / target, b'"status": "finished"', 8, b";")
    else:
        os.truncate(store / target, (store / target).stat().st_size - 1000)
    cmd = [sys.executable, "-m", "orchestrator", "store", f"rebuild-{what}", "--store", str(store)]
    child = subprocess.Popen(cmd, env=p.env, cwd=p.tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while child.poll() is None and time.monotonic() < deadline:
        if any(n.name.startswith((f"{target}.rebuilding", f"{target}.damaged-")) for n in store.iterdir()):
            child.kill()
            break
        time.sleep(0.005)
    child.wait()
    check = p.cli("store", "check", "--store", store)
    listed = p.cli("sweep", "list", "--json", "--store", store)
    again = p.cli("store", f"rebuild-{what}", "--store", store) if check.returncode else check
    final = p.cli("store", "check", "--store", store)
    listed_after = p.cli("sweep", "list", "--json", "--store", store)
    whole = '"finished": 4' in listed.stdout or listed.returncode == 2 or check.returncode == 2
    ok = (child.returncode == -signal.SIGKILL and whole and again.returncode == 0 and final.returncode == 0
          and '"finished": 4' in listed_after.stdout)
    return ok, (f"killed: exit {child.returncode}; check: {said(check)}; list: {listed.stdout.strip()[:60]}; "
                f"rerun: {said(again)}")


@case("recovery", "rebuild-ledger killed mid-build")
def _(p):
    return _killed_rebuild(p, "ledger")


@case("recovery", "rebuild-mirror killed mid-build")
def _(p):
    return _killed_rebuild(p, "mirror")


@case("recovery", "mlflow.db a symbolic link to ledger.db: sweep run")
def _(p):
    store = recovery_store(p, "r-link")
    (store / "mlflow.db").unlink()
    (store / "mlflow.db").symlink_to("ledger.db")
    grid = grid_file(p, "r-link-grid", GRID.replace("name: probe", "name: s1"))
    with contextlib.closing(sqlite3.connect(f"file:{store / 'ledger.db'}?mode=ro", uri=True)) as db:
        tables = db.execute("select count(*) from sqlite_master").fetchone()[0]
    r = p.cli("sweep", "run", grid, "--store", store, timeout=600)
    with contextlib.closing(sqlite3.connect(f"file:{store / 'ledger.db'}?mode=ro", uri=True)) as db:
        after = db.execute("select count(*) from sqlite_master").fetchone()[0]
    return one_line(r) and after == tables, f"{said(r)}; ledger objects {tables} -> {after}"


@case("recovery", "mlflow.db replaced by a folder: sweep run")
def _(p):
    store = recovery_store(p, "r-folder")
    (store / "mlflow.db").unlink()
    (store / "mlflow.db").mkdir()
    grid = grid_file(p, "r-folder-grid", GRID.replace("name: probe", "name: s1"))
    start = time.monotonic()
    r = p.cli("sweep", "run", grid, "--store", store, timeout=600)
    took = time.monotonic() - start
    return one_line(r, has="folder") and took < 60, f"{said(r)} ({took:.0f} s)"


@case("recovery", "--store a loop of symbolic links")
def _(p):
    folder = p.folder("r-loop")
    (folder / "a").symlink_to(folder / "b")
    (folder / "b").symlink_to(folder / "a")
    results = [p.cli(*args, "--store", folder / "a") for args in (("sweep", "list"), ("store", "check"))]
    return all(one_line(r) for r in results), "; ".join(said(r) for r in results)


@case("recovery", "mlflow.db locked by another process: sweep run")
def _(p):
    store = recovery_store(p, "r-lock")
    grid = grid_file(p, "r-lock-grid", GRID.replace("name: probe", "name: s1") + TINY_TRAIN)
    code = ("import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "db.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(store / "mlflow.db")], stdout=subprocess.PIPE, text=True)
    try:
        holder.stdout.readline()
        r = p.cli("sweep", "run", grid, "--store", store, timeout=600)
    finally:
        holder.kill()
        holder.wait()
    return one_line(r, has="locked"), said(r)


@case("recovery", "export --format csv without --out")
def _(p):
    store = recovery_store(p, "r-export")
    r = p.cli("export", "s1", "--store", store, "--format", "csv", cwd=store.parent)
    return r.returncode == 0 and (store.parent / "privbench-export.csv").is_file() and \
        not (store.parent / "privbench-export.json").exists(), said(r) if r.returncode else r.stdout.strip()


@case("recovery", "--dry-run of a 10^6-trial grid: first line, memory")
def _(p):
    seeds = ", ".join(map(str, range(1000)))
    eps = ", ".join(f"{1 + i / 1000:g}" for i in range(1000))
    grid = grid_file(p, "r-big", f"name: big\nmax_trials: 1000000\nseeds: [{seeds}]\ngrid: {{dataset: [digits], "
                                  f"model: [mlp], mechanism: [dpsgd], epsilon: [{eps}]}}\n")
    child = subprocess.Popen([sys.executable, "-m", "orchestrator", "sweep", "run", str(grid), "--dry-run"],
                             env=p.env, cwd=p.tree, stdout=subprocess.PIPE, text=True)
    start, first, cpu, peak = time.monotonic(), None, None, 0.0
    try:
        while time.monotonic() - start < 600 and child.poll() is None:
            status = Path(f"/proc/{child.pid}/status").read_text()
            peak = max(peak, int(status.split("VmHWM:")[1].split()[0]) / 1024)
            if peak > 3000:
                break
            import select
            if select.select([child.stdout], [], [], 0.2)[0]:
                first = child.stdout.readline().strip()
                fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
                break
    finally:
        child.kill()
        child.wait()
    ok = first is not None and cpu is not None and cpu < 5 and peak < 1024
    return ok, (f"first line {first!r} after {cpu:.1f} s of CPU" if cpu is not None else
                f"no line in {time.monotonic() - start:.0f} s") + f"; peak {peak:.0f} MB"


for _args, _what in [(("--address", "127.0.0.1:99999"), "bad port"), (("--address", "[::1:6379"), "IPv6 bracket")]:
    @case("recovery", f"--address with a {_what}")
    def _(p, _args=_args):
        r = p.cli("sweep", "run", grid_file(p, "r-addr", GRID), "--store", p.scratch / "r-addr" / "s", *_args)
        return one_line(r), said(r)


TYPER_REJECTS = [("sweep", "run", "GRID", "--max-concurrent", "0"), ("sweep", "run", "GRID", "--retries", "-1"),
                 ("sweep", "run", "GRID", "--retries", "x"), ("sweep", "run"), ("sweep", "run", "GRID", "--bogus"),
                 ("ui", "--port", "0"), ("leaderboard", "--metric")]
for _args in TYPER_REJECTS:
    @case("recovery", "Typer rejects: " + " ".join(_args))
    def _(p, _args=_args):
        grid = grid_file(p, "r-typer", GRID)
        r = p.cli(*(grid if a == "GRID" else a for a in _args))
        return one_line(r) and not r.stdout.strip(), said(r)


@case("recovery", "a newline in --store and --out paths")
def _(p):
    folder = p.folder("r-newline")
    results = [p.cli("sweep", "list", "--store", folder / "a\nb"),
               p.cli("leaderboard", "--out", folder / "x\ny" / "o.csv")]
    return all(only_line(r) for r in results), "; ".join(said(r) for r in results)


def only_line(result: subprocess.CompletedProcess) -> bool:
    """`one_line`, and nothing else on stderr (a message split by a raw newline has a second line)."""
    return one_line(result) and len([line for line in result.stderr.splitlines() if line.strip()]) == 1


@case("recovery", "a NUL byte in a grid")
def _(p):
    r = p.cli("sweep", "run", grid_file(p, "r-nul", GRID.replace("probe", "probe\0")), "--dry-run")
    return only_line(r), said(r)


@case("recovery-ray", "SIGTERM while Ray starts")
def _(p):
    """SIGTERM as soon as the driver has started Ray's GCS server (found among its children)."""
    grid = grid_file(p, "r-term", GRID.replace("[0, 1, 2, 3]", "[0]") + TINY_TRAIN)
    child = subprocess.Popen([sys.executable, "-m", "orchestrator", "sweep", "run", str(grid), "--store",
                              str(grid.parent / "store")], env=p.env, cwd=p.tree, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while child.poll() is None and time.monotonic() < deadline:
        names = subprocess.run(["ps", "-o", "comm=", "-s", str(child.pid)], capture_output=True, text=True).stdout
        if "gcs_server" in names:
            child.send_signal(signal.SIGTERM)
            break
        time.sleep(0.01)
    out, err = child.communicate(timeout=300)
    left = subprocess.run(["pgrep", "-s", str(child.pid)], capture_output=True, text=True).stdout.split()
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    r = subprocess.CompletedProcess(child.args, child.returncode, out, err)
    return one_line(r, 143) and not left, f"{said(r)}; {len(left)} processes left"


# issue 50: every command agrees with `store check` --------------------------------------------------------------
def _unindexed_run(path: Path) -> None:
    """One run id changed in `runs`' row, not in its index: found by integrity_check, not quick_check."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        root = db.execute("select rootpage from sqlite_master where name = 'runs'").fetchone()[0]
        run_id = db.execute("select run_uuid from runs limit 1").fetchone()[0]
        size = db.execute("pragma page_size").fetchone()[0]
    data = bytearray(path.read_bytes())
    data[data.index(run_id.encode(), (root - 1) * size, root * size)] = ord("x")
    path.write_bytes(bytes(data))


def _foreign(path: Path) -> None:
    path.unlink()
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("create table notes (body text)")
        db.commit()


MIRROR_DAMAGE = {
    "a torn runs page of mlflow.db": lambda f: zero(f / "mlflow.db", "runs", 0.5, 1.0),
    "a run row its index lacks": lambda f: _unindexed_run(f / "mlflow.db"),
    "mlflow.db cut by one page": lambda f: os.truncate(f / "mlflow.db", (f / "mlflow.db").stat().st_size - 4096),
    "another program's SQLite file as mlflow.db": lambda f: _foreign(f / "mlflow.db"),
}


def _bytes_of(folder: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir()) if f.is_file() and f.suffix != ".lock"}


def _verdict_case(name: str, make: Callable[[Path], None], ledger: bool) -> None:
    @case("verdict", f"every command gives store check's verdict on {name}, and its advice mends it")
    def _(p):
        import re
        import shlex

        store = recovery_store(p, "v-" + "".join(ch for ch in name if ch.isalnum())[:20])
        make(store)
        grid = grid_file(p, "v-grid-" + store.parent.name, GRID.replace("name: probe", "name: s1") + TINY_TRAIN)
        before = _bytes_of(store)
        check = p.cli("store", "check", "--store", store)
        line = next((x for x in check.stderr.splitlines() if x.startswith("error:")), "")
        run = p.cli("sweep", "run", grid, "--store", store, timeout=600)
        wrong = [] if one_line(run) and run.stderr.strip() == line else ["sweep run"]
        wrong += [] if _bytes_of(store) == before else ["bytes written"]
        for args in (("sweep", "status", "s1"), ("leaderboard", "s1"), ("export", "s1", "--out", store.parent / "x")):
            r = p.cli(*args, "--store", store)
            warned = [x for x in r.stderr.splitlines() if x.startswith("warning:")]
            agrees = (one_line(r) and r.stderr.strip() == line if ledger else
                      r.returncode == 0 and len(warned) == 1 and line.split("`")[1:2] == warned[0].split("`")[1:2])
            wrong += [] if agrees else [args[0] + (" " + args[1] if args[0] == "sweep" else "")]
        named = re.findall(r"`privbench (store [^`]+)`", line)
        mend = p.cli(*shlex.split(named[0])) if len(named) == 1 else check
        after = p.cli("store", "check", "--store", store)
        ok = check.returncode == 2 and not wrong and mend.returncode == 0 and after.returncode == 0
        return ok, f"check: {said(check)}; disagree: {', '.join(wrong) or 'none'}; advice: {said(mend)}"


for _name, _make in LEDGER_DAMAGE.items():
    _verdict_case(_name, _make, ledger=True)
for _name, _make in MIRROR_DAMAGE.items():
    _verdict_case(_name, _make, ledger=False)


for _redirect, _code in [(">&-", 1), (">/dev/full", 1), ("2>&-", 0), ("2>/dev/full", 0)]:
    @case("verdict", f"sweep list {_redirect}")
    def _(p, _redirect=_redirect, _code=_code):
        store = recovery_store(p, "v-out")
        prog = f"{sys.executable} -m orchestrator sweep list --store {store} {_redirect}"
        r = subprocess.run(["bash", "-c", prog], env=p.env, cwd=p.tree, capture_output=True, text=True, timeout=300)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        return r.returncode == _code and len(lines) <= 1 and "Traceback" not in r.stderr, said(r)


def _mid_sweep(p: Probe, trouble: str) -> tuple[bool, str]:
    """The driver paused after its first ledger record, the store's disk filled or mlflow.db locked, the driver
    resumed; then space freed or the lock ended, and the same command run again with no hand step."""
    folder = p.folder("v-mid-" + trouble)
    disk = folder / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(disk)], capture_output=True).returncode:
        return False, "cannot mount a tmpfs here (needs root)"
    try:
        store = disk / "store"
        grid = grid_file(p, "v-mid-grid", GRID.replace("name: probe", "name: s1") + TINY_TRAIN)
        cmd = [sys.executable, "-m", "orchestrator", "sweep", "run", str(grid), "--store", str(store)]
        child = subprocess.Popen(cmd, env=p.env | {"PRIVBENCH_FAULT": "after_ledger_record:1:stop"}, cwd=p.tree,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            if child.poll() is not None or time.monotonic() > deadline:
                return False, "the driver never reached its first record"
            time.sleep(0.05)
        holder = None
        if trouble == "full":
            with open(disk / "filler", "wb") as fh, contextlib.suppress(OSError):
                while True:
                    fh.write(bytes(65536))
                    fh.flush()
        else:
            code = ("import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
                    "db.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(600)")
            holder = subprocess.Popen([sys.executable, "-c", code, str(store / "mlflow.db")], stdout=subprocess.PIPE,
                                      text=True)
            holder.stdout.readline()
        os.kill(child.pid, signal.SIGCONT)
        out, err = child.communicate(timeout=600)
        first = subprocess.CompletedProcess(cmd, child.returncode, out, err)
        if holder is not None:
            holder.kill()
            holder.wait()
        (disk / "filler").unlink(missing_ok=True)
        check = p.cli("store", "check", "--store", store)
        rerun = p.cli("sweep", "run", grid, "--store", store, timeout=600)
        after = ledger_state(store)
        whole = after.get("statuses") == {"finished": 4} and after.get("max_rows_per_key") == 1
        ok = (one_line(first, 1 if trouble == "full" else 2) and check.returncode == 0 and rerun.returncode == 0
              and whole and mlflow_state(store).get("max_per_key") == 1)
        return ok, f"first: {said(first)}; check: {said(check)}; rerun: {said(rerun)}; ledger {after.get('statuses')}"
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@case("verdict-ray", "disk full after the first result, then freed: check, and the rerun with no hand step")
def _(p):
    return _mid_sweep(p, "full")


@case("verdict-ray", "mlflow.db locked after the first result, then released: the rerun")
def _(p):
    return _mid_sweep(p, "lock")


def _cell(st: dict[str, Any]) -> str:
    led, mlf = st.get("ledger", {}), st.get("mlflow", {})
    if not led and not mlf:
        return "-"
    ledger = (f"unreadable ({led['error'][:30]})" if "error" in led else
              ", ".join(f"{n} {s}" for s, n in sorted(led.get("statuses", {}).items())) +
              f"; {led.get('max_rows_per_key', 0)}/key; {led.get('with_result', 0)} results")
    mlflow = (f"unreadable ({mlf['error'][:30]})" if "error" in mlf else
              f"{mlf.get('active', 0)} active, max {mlf.get('max_per_key', 0)}/key, {mlf.get('parents', 0)} parent")
    return f"ledger: {ledger}<br>MLflow: {mlflow}"


def table(before_file: Path, after_file: Path) -> str:
    """The worst cases as a Markdown table: each case's store before and after, on the old and new tree."""
    old = {r["case"]: r for r in json.loads(before_file.read_text())}
    new = {r["case"]: r for r in json.loads(after_file.read_text())}
    lines = ["| case | store before | old: outcome | old: store after | new: outcome | new: store after |",
             "|---|---|---|---|---|---|"]
    for name, n in new.items():
        o = old.get(name, {})
        lines.append(f"| {name} | {_cell(n['before'])} | {'right' if o.get('ok') else 'WRONG'}: "
                     f"{o.get('outcome', '-')[:150]} | {_cell(o.get('after', {}))} | "
                     f"{'right' if n['ok'] else 'WRONG'}: {n['outcome'][:150]} | {_cell(n['after'])} |")
    return "\n".join(lines).replace(str(Path(tempfile.gettempdir())), "/tmp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=HERE, help="privbench checkout under test")
    parser.add_argument("--only", default="", help="comma-separated groups: " + ", ".join(
        sorted({g for g, _, _ in CASES})))
    parser.add_argument("--worst", action="store_true", help="the worst cases of issue 31 and their table")
    parser.add_argument("--json", type=Path, help="write every result here")
    parser.add_argument("--table", type=Path, nargs=2, metavar=("OLD.json", "NEW.json"),
                        help="print the Markdown table of two --worst runs (old and new tree) and exit")
    args = parser.parse_args()
    if args.table:
        print(table(*args.table))
        return
    groups = {g for g in args.only.split(",") if g}
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="privbench-probe-") as tmp:
        probe = Probe(args.tree.resolve(), Path(tmp))
        if args.worst:
            for item in worst(probe):
                results.append(item)
                print(f"{'ok ' if item['ok'] else 'BAD'} {item['case']}: {item['outcome']}", flush=True)
        else:
            for group, name, fn in CASES:
                if groups and group not in groups:
                    continue
                start = time.monotonic()
                try:
                    ok, detail = fn(probe)
                except Exception as e:  # noqa: BLE001 - a case that cannot even run is a wrong case
                    ok, detail = False, f"probe error: {type(e).__name__}: {e}"[:300]
                results.append({"group": group, "case": name, "ok": ok, "detail": detail,
                                "seconds": round(time.monotonic() - start, 1)})
                print(f"{'ok ' if ok else 'BAD'} [{group}] {name}: {detail}", flush=True)
    right = sum(r["ok"] for r in results)
    print(f"{right} of {len(results)} right against {args.tree}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
