"""The store: the ledger (the source of truth) plus its MLflow mirror, written by the driver alone.

`Store` is the only door to both: it decides what is owned, leased and recorded, and in which order,
and every method runs inside the store's error translation (one line naming the file, never a driver
traceback). The ledger is private to storage/; every MLflow call goes through the `MlflowSink`
(storage/mlflow_sink.py) that `Store` feeds. It takes result records as plain mappings; it does not
import `workers`.

The mirror never rewrites the truth: reconciling MLflow with the ledger changes MLflow (a leftover run
deleted, a missing run written again from the ledger's record) and never a recorded result of the
ledger. The one thing MLflow can add to the ledger is a complete, recorded run of a trial the ledger
holds no result for (a ledger restored from a backup, a driver killed between the run and the ledger
row): that run is adopted, not deleted and trained again. Every command opens a store after the verdict
`store check` gives (`check_files`, `storage.recovery.problem_of`): a driver on both files, a read command
on the ledger (and it warns about MLflow's file, which it does not read: `mirror_damage`).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from storage import files
from storage.errors import WRITE_ACCESS, Conflict, Damaged, Locked, StoreError, StoreLost, translated
from storage.faults import fault
from storage.ledger import DONE, Ledger, lease_seconds, new_owner, owner_dead
from storage.location import StoreLocation, data_home, mask_uri, resolve, split_credentials, sqlite_path
from storage.mlflow_sink import (
    KIND_TAG,
    LEDGER_ID_TAG,
    RECORDED_TAG,
    SUPERSEDED_TAG,
    SWEEP_ID_TAG,
    SWEEP_RUN_TAG,
    TRIAL_KEY_TAG,
    MlflowSink,
)
from storage.recovery import mend_command, problem_of


def _default_artifacts(location: StoreLocation) -> str:
    """A database store's artifact root when none was given: a per-user folder named after the
    database (never the working folder). Recorded in the ledger, so every driver uses the same."""
    ident = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in mask_uri(location.tracking_uri).split("@")[-1])
    return (data_home() / "artifacts" / ident.strip("_")).as_uri()


SERVER_PROBE_TIMEOUT_S = 5.0


def preflight(location: StoreLocation, sweep: str) -> None:
    """What can be known before the driver creates anything (a ledger file, a folder): a tracking server
    answers, and a sweep whose ledger does not exist yet does not name an experiment that is already on
    the server (it would belong to another ledger, and the run would be refused after creating one)."""
    lease_seconds()  # a bad PRIVBENCH_LEASE_S is said now, not when the first trial is leased
    with translated(location.display):
        refuse_odd_files(location)
        check_files(location, sqlite_path(location.ledger_uri), sqlite_path(location.tracking_uri))
        refuse_odd_files(location, locks=True)  # after the check: a lock taken on a damaged file fails otherwise
        ledger_file = sqlite_path(location.ledger_uri)
        if ledger_file is not None and ledger_file.is_file():
            ledger = Ledger(location.ledger_uri, read_only=True)
            try:
                check_tracking_file(location, ledger)
            finally:
                ledger.engine.dispose()
    if location.folder is not None and location.folder.exists() and not location.folder.is_dir():
        raise StoreError(f"store {location.display} is a file, not a store folder")
    if location.kind != "server":
        return
    import urllib.error  # lazy: keeps the read commands light
    import urllib.request  # lazy: keeps the read commands light

    scheme, user, password, rest = split_credentials(location.tracking_uri)
    request = urllib.request.Request(f"{scheme}://{rest}/health")  # urllib takes no credentials in the URL
    if user or password:
        token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:  # any HTTP answer means a server is there; MLflow's client would retry for a long time instead
        urllib.request.urlopen(request, timeout=SERVER_PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        pass
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise StoreError(f"cannot reach the MLflow server {location.display}: "
                         f"{getattr(reason, 'strerror', None) or reason}") from None
    ledger = sqlite_path(location.ledger_uri)
    if ledger is None or ledger.exists():
        return
    with translated(location.display):
        exp = MlflowSink(location.tracking_uri, location.display, writer=False).experiment(sweep)
    if exp is not None:
        tags = exp.tags or {}
        whose = (f"another privbench ledger (ledger {tags[LEDGER_ID_TAG]})" if LEDGER_ID_TAG in tags
                 else "no privbench sweep")
        raise Conflict(f"the MLflow experiment {sweep!r} on {location.display} belongs to {whose}, and this "
                       f"user has no ledger for it yet ({ledger} does not exist). To resume that sweep, pass its "
                       "ledger with --ledger; otherwise give the sweep another name (`name:` in the grid)")


F = TypeVar("F", bound=Callable[..., Any])


def _translating(method: F) -> F:
    """Run a `Store` method inside the store's error translation: a driver or MLflow error is one line."""

    @functools.wraps(method)
    def wrapper(self: Store, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            with translated(self.where):
                return method(self, *args, **kwargs)
        except Locked:
            raise locked(self.location, time.monotonic() - started) from None

    return wrapper  # type: ignore[return-value]


def locked(location: StoreLocation, waited: float) -> Locked:
    """The one line for a store file another process kept locked while a command waited: which file (the one
    still locked when asked; SQLite's error does not say), how long it waited, and that a rerun resumes."""
    paths = [p for p in dict.fromkeys((sqlite_path(location.ledger_uri), sqlite_path(location.tracking_uri))) if p]
    held = [p for p in paths if files.write_locked(p)] or paths
    which = " or ".join(str(p) for p in held) or location.display
    return Locked(f"store file {which} is locked by another process (an open transaction, a backup tool; waited "
                  f"{waited:.0f} s for it); what was recorded is kept: end that process and run the command again "
                  "(a sweep resumes where it stopped)")


def damaged(location: StoreLocation, path: Path, problem: str, consequence: str = "nothing was written") -> Damaged:
    """The one line for a damaged store file: which file, what SQLite found, what the command did about it
    (`consequence`), and how to recover it: the command `store check` names for the same damage."""
    command = mend_command(location, path)
    if command is None:
        recovery = ("the file holds both the ledger and the MLflow runs: restore it from a backup "
                    "(docs/store.md, damaged stores)")
    elif "rebuild-ledger" in command:
        recovery = f"the MLflow mirror holds every recorded result: `{command}` rebuilds the ledger from it " \
                   "(the damaged file is kept beside it)"
    else:
        recovery = f"the ledger holds every recorded result: `{command}` rebuilds the MLflow runs from it " \
                   "(the damaged file is kept beside it)"
    return Damaged(f"store file {path} is damaged ({problem[:160]}); {consequence}. Stop every driver of "
                   f"this store, then: {recovery}")


def _half_migrated(path: Path) -> bool:
    """Whether MLflow's migrations stopped halfway in this file (alembic's batch tables are still there)."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return db.execute("select count(*) from sqlite_master where name like '\\_alembic\\_tmp\\_%' escape '\\'"
                          ).fetchone()[0] > 0


def refuse_odd_files(location: StoreLocation, *, reading: bool = False, locks: bool = False) -> None:
    """The store's SQLite files are regular files of their own, or absent (`storage.files.refuse_odd`);
    `reading`: the ledger only (read commands never open MLflow's file). `locks`: and no other process
    holds SQLite's write lock on one (`storage.files.sqlite_locked`), for a driver about to write."""
    ledger = sqlite_path(location.ledger_uri)
    paths = (ledger,) if reading else (ledger, sqlite_path(location.tracking_uri))
    files.refuse_odd(paths, location.display,
                     lock=ledger.with_name(ledger.name + ".lock") if ledger is not None and not reading else None)
    for path in dict.fromkeys(paths) if locks else ():
        if path is not None:
            files.sqlite_locked(path, location.display)


def check_files(location: StoreLocation, *paths: Path | None) -> None:
    """The store's verdict on some of its SQLite files, the one `store check` gives (`recovery.problem_of`:
    SQLite's full integrity check, each file's length read with its log, the ledger's rows, and MLflow's file
    being MLflow's): a damaged file is said (`damaged`) before anything reads fewer rows than it holds, or
    writes over it. An absent or empty file is a new store's, or is said where it is opened."""
    for path in dict.fromkeys(paths):
        if path is not None and path.is_file() and path.stat().st_size > 0:
            problem = problem_of(location, path)
            if problem is not None:
                raise damaged(location, path, problem)


def mirror_damage(location: StoreLocation) -> str | None:
    """For a command that reads only the ledger: the line saying that MLflow's file is damaged and that the
    command goes on without it (None: sound, absent, or the ledger's own file)."""
    path, ledger = sqlite_path(location.tracking_uri), sqlite_path(location.ledger_uri)
    if path is None or path == ledger or not path.is_file() or path.stat().st_size == 0:
        return None
    with translated(location.display):
        problem = problem_of(location, path)
    return None if problem is None else str(damaged(location, path, problem, "this command reads only the ledger, "
                                                                             "which is sound, and goes on"))


def fold_logs(location: StoreLocation) -> None:
    """Copy each sound SQLite file's write-ahead log into it (a passive checkpoint, which waits for no one):
    a driver stopped by a full disk leaves its last commits in the log, and the file shorter than its header
    says until they are copied in. Called by a driver after the check, before it writes; a disk still full is
    one line naming the command to run once space is freed."""
    for path in dict.fromkeys((sqlite_path(location.ledger_uri), sqlite_path(location.tracking_uri))):
        if path is not None and not files.fold_log(path):
            raise StoreError(f"store {location.display}: the disk is full: the last commits of {path.name} are in "
                             f"its write-ahead log and cannot be copied into it yet (nothing is lost: SQLite reads "
                             "both); free some space and run `privbench sweep run` again")


def check_tracking_file(location: StoreLocation, ledger: Ledger) -> None:
    """A store whose MLflow database vanished or was truncated while the ledger lists sweeps must not be
    silently re-created: every trial would look finished with no run behind it."""
    path = sqlite_path(location.tracking_uri)
    if path is None or path == ledger.path or (path.exists() and path.stat().st_size > 0):
        return
    if ledger.path is not None and ledger.path.exists() and ledger.has_schema() and ledger.sweep_names():
        state = "is empty (0 bytes: truncated?)" if path.exists() else "is missing"
        raise StoreError(f"store {path} {state} but the ledger lists sweeps; nothing was written. The ledger "
                         f"holds every recorded result: `{mend_command(location, path)}` rebuilds the MLflow runs "
                         "from it")


def grid_key(keys: Iterable[str]) -> str:
    """The identity of a grid as a sweep sees it: the hash of its trial keys (a comment or a resource
    change is the same grid; another seed or learning rate is another)."""
    return hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class TrialRow:
    """One trial as the ledger holds it. `record` is its result record (None until it has one)."""

    trial_key: str
    status: str
    dataset: str
    model: str
    mechanism: str
    epsilon: float | None
    seed: int
    attempts: int
    run_id: str | None
    error: str | None
    lease_owner: str | None
    record: Mapping[str, Any] | None


@dataclasses.dataclass(frozen=True)
class Reconciled:
    """What reconciling a sweep's MLflow runs with its ledger did (each a list of trial keys)."""

    adopted: tuple[str, ...] = ()  # a complete run the ledger did not know became the trial's result
    restored: tuple[str, ...] = ()  # a recorded trial's deleted run was restored
    rewritten: tuple[str, ...] = ()  # a recorded trial's missing run was written again from the ledger
    deleted: tuple[str, ...] = ()  # leftover runs (cut off mid-write, or a second run of a recorded trial)

    def __bool__(self) -> bool:
        return bool(self.adopted or self.restored or self.rewritten or self.deleted)


@dataclasses.dataclass(frozen=True)
class LeaseWatch:
    """Other drivers' leases on the trials a driver could not run: (owner, seconds until it lapses), and
    whether those drivers are alive (they renewed while watched)."""

    leases: tuple[tuple[str, float], ...]
    alive: bool


class Store:
    """Open a store. `create=True` (the driver) initialises it once under a lock, before any fan-out;
    otherwise (the read commands) it is opened read-only and never written, MLflow included. Either way
    the files are integrity-checked first: a damaged one is a `Damaged` error naming its recovery."""

    def __init__(self, location: StoreLocation | str | None = None, *, create: bool = False) -> None:
        self.location = location if isinstance(location, StoreLocation) else resolve(location)
        self.where = self.location.display
        self.owner = new_owner()
        self.started = time.time()
        self.sink = MlflowSink(self.location.tracking_uri, self.where, writer=create,  # the MLflow mirror
                               artifacts_folder=self.location.artifacts_folder)
        self._identity: dict[str, tuple[str, str]] = {}  # sweep -> (experiment_id, sweep_id)
        self._claimed: set[tuple[str, str]] = set()
        self._renewed = 0.0
        self._files: dict[Path, tuple[int, int]] = {}
        self.reconciled: dict[str, Reconciled] = {}
        with translated(self.where):
            if create:
                self._create()
            else:
                if not self.location.exists():
                    raise StoreError(f"no privbench store at {self.where}")
                refuse_odd_files(self.location, reading=True)
                self._ledger = Ledger(self.location.ledger_uri, read_only=True)
                self._own_damage()
                check_files(self.location, self._ledger.path)
                self._ledger.check()
            self.started = self._ledger.now()  # the database's clock (claims compare with it)

    @_translating  # a file locked while the store is opened is named, with the wait, as at any later moment
    def _create(self) -> None:
        loc = self.location
        refuse_odd_files(loc)
        for path in (sqlite_path(loc.ledger_uri), sqlite_path(loc.tracking_uri)):
            if path is not None and path.exists() and not os.access(path, os.W_OK):
                raise StoreError(f"store {path} is read-only: `sweep run` {WRITE_ACCESS}")
        if loc.folder is not None:
            try:
                loc.folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreError(f"cannot create the store folder {loc.folder}: {e.strerror}") from None
        self._ledger = Ledger(loc.ledger_uri)
        self._own_damage()
        with self._ledger.lock():
            refuse_odd_files(loc)  # again under the lock: a rebuild may have run meanwhile
            check_files(self.location, self._ledger.path, sqlite_path(loc.tracking_uri))
            refuse_odd_files(loc, locks=True)
            fold_logs(loc)
            check_tracking_file(self.location, self._ledger)
            self._ledger.migrate()
            self._create_tracking_file()
            self.ledger_id = self._ledger.ledger_id()
            self.artifact_root = loc.artifact_root
            if loc.kind == "database" and self.artifact_root is None:
                self.artifact_root = self._ledger.ensure_meta("artifact_root", _default_artifacts(loc))
            self.sink.connect()  # MLflow creates its schema here: under the lock
        self._files = self._file_identities()

    def _own_damage(self) -> None:
        """A damaged ledger row names this store's recovery command, as `store check` does."""
        path = self._ledger.path
        if path is not None:
            self._ledger.damaged = lambda problem: damaged(self.location, path, problem)

    def _create_tracking_file(self) -> None:
        """A new SQLite store's MLflow database, made whole or not at all (`MlflowSink.create_file`); one that
        an older privbench left half-migrated (a full disk during creation: `_alembic_tmp_*` tables) while
        the ledger holds no sweep is privbench's own unfinished file: it is set aside and made again."""
        path = sqlite_path(self.location.tracking_uri)
        if path is None or path == self._ledger.path:
            return
        if path.is_file() and path.stat().st_size > 0 and not self._ledger.sweep_names() and _half_migrated(path):
            os.replace(path, path.with_name(f"{path.name}.incomplete-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"))
        if not path.exists() or path.stat().st_size == 0:
            self.sink.create_file(path)

    def _file_identities(self) -> dict[Path, tuple[int, int]]:
        """(device, inode) of the store's SQLite files: a file deleted or replaced under a running driver
        keeps taking its writes through the open connection, and every result would be lost."""
        found = {}
        for path in {sqlite_path(self.location.ledger_uri), sqlite_path(self.location.tracking_uri)} - {None}:
            with contextlib.suppress(FileNotFoundError):
                info = path.stat()
                found[path] = (info.st_dev, info.st_ino)
        return found

    @_translating
    def check_intact(self) -> None:
        """Raise `StoreLost` when the store this driver opened was deleted or replaced since (checked at
        each record: the driver stops instead of reporting results that no longer exist)."""
        for path, ident in self._files.items():
            try:
                info = path.stat()
            except FileNotFoundError:
                raise StoreLost(f"store {self.where} was deleted while the sweep ran ({path} is gone); "
                                "stopping: results recorded from now on would be lost") from None
            if (info.st_dev, info.st_ino) != ident:
                raise StoreLost(f"store {self.where} was replaced while the sweep ran ({path} is another "
                                "file now); stopping: results would go to the old, deleted file")
        if self._files.get(self._ledger.path) is None and self._ledger.meta_value("ledger_id") != self.ledger_id:
            raise StoreLost(f"the ledger {self._ledger.where} was replaced while the sweep ran (another "
                            "ledger identity); stopping")

    def close(self) -> None:
        """Close the store's database connections; on SQLite the last one checkpoints the WAL into the files."""
        self._ledger.engine.dispose()
        self.sink.close()

    # sweeps -------------------------------------------------------------------------------------
    @_translating
    def open_sweep(self, name: str, grid_yaml: str, configs: Iterable[Mapping[str, Any]],
                   key_of: Callable[[dict[str, Any]], str] | None = None, *, keys: Sequence[str] | None = None) -> str:
        """Create (once) or reopen the sweep's experiment and ledger rows, checking that both belong to
        this ledger and that no live driver runs the sweep with another grid; reconcile MLflow with the
        ledger. Raises Conflict/StoreError before any training.

        `keys`: the trial keys, given when `configs` is a stream (a large grid's trials, made as they are read:
        it is then read once, after the checks, and only when the ledger lacks some of its trials)."""
        if keys is None:
            configs = list(configs)
            keys = [c["trial_key"] for c in configs]
        with self._ledger.lock():
            others = self._ledger.register_driver(name, self.owner, grid_key(keys), len(keys))
            if others:
                owners = ", ".join(f"{o} ({n} trials)" for o, n in others[:3])
                raise Conflict(f"sweep {name!r} is being run right now by another driver with a different grid "
                               f"({owners}; this grid has {len(keys)} trials). A sweep name belongs to one grid "
                               "at a time: wait until that driver finishes, or give this grid another name "
                               "(`name:` in the grid)")
            experiment_id, sweep_id = self._own_experiment(name, grid_yaml)
            self._identity[name] = (experiment_id, sweep_id)
            superseded, renamed = self._ledger.sync_trials(name, configs, key_of, current=set(keys))
            for run_id in superseded:  # kept for history, flagged in the UI
                self.sink.tag_quietly(run_id, SUPERSEDED_TAG, "true")
            for run_id, key in renamed.items():
                self.sink.tag_quietly(run_id, TRIAL_KEY_TAG, key)
            self._ledger.clear_dead_leases(name)
            self.reconciled[name] = self._reconcile(name, experiment_id, sweep_id)
            self.sink.sweep_run(name, experiment_id, grid_yaml)
        return experiment_id

    @_translating
    def log_sweep_files(self, sweep: str, files: Mapping[str, str | bytes]) -> str:
        """Store summary files (leaderboard CSV, figures; path -> content) on the sweep's parent run and
        mark it finished. Returns its run id."""
        return self.sink.log_sweep_files(sweep, self._sweep_identity(sweep)[0], files)

    def _own_experiment(self, name: str, grid_yaml: str) -> tuple[str, str]:
        row = self._ledger.sweep(name)
        for _ in range(2):
            exp = self.sink.experiment(name)
            if exp is not None:
                return self._check_owner(name, exp, row, grid_yaml)
            if row is not None and row["experiment_id"]:
                tracking = sqlite_path(self.location.tracking_uri)
                command = mend_command(self.location, tracking, force=True) if tracking is not None else None
                rebuild = f", rebuild the MLflow runs from the ledger (`{command}`)" if command else ""
                raise StoreError(
                    f"the ledger lists sweep {name!r} (MLflow experiment {row['experiment_id']}) but {self.where} "
                    "has no experiment of that name: it was deleted permanently, renamed, or the tracking "
                    f"store was replaced. Restore it{rebuild}, or give the sweep another name (`name:` in the grid)")
            if row is None:  # the ledger row first: a crash after it leaves an experiment we recognise
                self._ledger.create_sweep(name, uuid.uuid4().hex, "", grid_yaml)
                row = self._ledger.sweep(name)
            artifacts = f"{self.artifact_root.rstrip('/')}/{name}" if self.artifact_root else None
            experiment_id = self.sink.create_experiment(name, artifacts, row["sweep_id"], self.ledger_id)
            if experiment_id is None:
                continue  # someone else created it a moment ago: check whose it is
            self._ledger.update_sweep(name, experiment_id=experiment_id)
            return experiment_id, row["sweep_id"]
        raise StoreError(f"could not create the MLflow experiment {name!r} on {self.where}")

    def _check_owner(self, name: str, exp: Any, row: dict[str, Any] | None, grid_yaml: str) -> tuple[str, str]:
        tags = exp.tags or {}
        owner_id = tags.get(SWEEP_ID_TAG)
        legacy = (owner_id is None and tags.get(KIND_TAG) == "sweep" and row is not None and not row.get("sweep_id")
                  and row["experiment_id"] == exp.experiment_id)
        if legacy:  # a sweep recorded before sweeps had an identity: this ledger made it, give it one
            owner_id = uuid.uuid4().hex
            self.sink.set_experiment_tag(exp.experiment_id, SWEEP_ID_TAG, owner_id)
            self.sink.set_experiment_tag(exp.experiment_id, LEDGER_ID_TAG, self.ledger_id)
            self._ledger.update_sweep(name, sweep_id=owner_id)
        elif owner_id is None:
            raise Conflict(
                f"{self.where} already has an MLflow experiment {name!r} that no privbench sweep created; "
                "privbench leaves its runs alone. Give the sweep another name (`name:` in the grid) or use "
                "another store")
        elif row is None or row.get("sweep_id") != owner_id or (row["experiment_id"] not in ("", exp.experiment_id)):
            raise Conflict(
                f"the MLflow experiment {name!r} on {self.where} belongs to another privbench ledger "
                f"(ledger {tags.get(LEDGER_ID_TAG, '?')}, sweep {owner_id}), not to {self._ledger.where}. To "
                "resume that sweep, pass its ledger with --ledger (a team shares one database); otherwise give "
                "the sweep another name (`name:` in the grid)")
        if exp.lifecycle_stage == "deleted":
            raise StoreError(
                f"the MLflow experiment {name!r} (id {exp.experiment_id}) of this sweep was deleted; restore it "
                f"(MLflow UI, or `mlflow experiments restore --experiment-id {exp.experiment_id}` with "
                f"MLFLOW_TRACKING_URI set to the store) or give the sweep another name (`name:` in the grid)")
        self.sink.mark_experiment_kind(exp)  # experiments made by older privbench versions
        if not row["experiment_id"]:
            self._ledger.update_sweep(name, experiment_id=exp.experiment_id)
        self._ledger.update_sweep(name, grid_yaml=grid_yaml)
        return exp.experiment_id, owner_id

    def _reconcile(self, sweep: str, experiment_id: str, sweep_id: str) -> Reconciled:
        """Make MLflow agree with the ledger: exactly one active run per recorded trial, changing MLflow only.

        Only runs carrying this sweep's identity are looked at, and none that a live driver is writing
        (a trial another driver leases). In order:
        1. adopt: a complete run (its `recorded` tag set) of a trial the ledger holds no result for, or only
           a failed one whose run is gone, or a failed one where the run finished: its record becomes the
           trial's result (a restored ledger backup, a driver killed between the run and the ledger row);
        2. restore: a recorded trial whose run was deleted gets it back; rewrite: one whose run is missing
           altogether (MLflow's database replaced) is written again from the ledger's record;
        3. delete: any other run of a trial of this sweep (cut off mid-write, or a second run of a
           recorded trial). A complete run of a trial the ledger never knew is kept, flagged superseded.
        """
        rows = {t["trial_key"]: t for t in self._ledger.trials(sweep, recorded=True)}  # not a large sweep's every row
        busy = self._ledger.leased_by_others(sweep, self.owner)
        runs = {r.info.run_id: r for r in self.sink.runs(experiment_id) if r.data.tags.get(SWEEP_RUN_TAG) != "true"}
        active = {i: r for i, r in runs.items() if r.info.lifecycle_stage != "deleted"}
        recorded = {t["run_id"] for t in rows.values() if t["run_id"]}
        loose: dict[str, list[Any]] = {}  # trial key -> this sweep's active runs the ledger does not list
        for run_id, run in active.items():
            key = run.data.tags.get(TRIAL_KEY_TAG)
            if run_id not in recorded and run.data.tags.get(SWEEP_ID_TAG) == sweep_id and key not in busy:
                loose.setdefault(key, []).append(run)
        unread = [key for key in loose if key is not None and key not in rows]  # rows with no run the ledger names
        rows |= {t["trial_key"]: t for t in self._ledger.trials(sweep, keys=unread)}
        adopted, restored, rewritten, deleted = [], [], [], []
        for key, candidates in loose.items():
            row = rows.get(key)
            complete = sorted((r for r in candidates if r.data.tags.get(RECORDED_TAG) == "true"),
                              key=lambda r: (r.data.tags.get("status") == "finished", r.info.start_time or 0))
            if row is None:
                for run in complete:  # a trial this ledger never knew (a backup older than a grid edit): keep
                    self.sink.tag_quietly(run.info.run_id, SUPERSEDED_TAG, "true")
                candidates = [r for r in candidates if r not in complete]
            elif complete and self._adoptable(row, complete[-1], active):
                run = complete[-1]
                record = self.sink.read_record(run.info.run_id)
                if record is not None and record.get("trial_key") == key and record.get("sweep") == sweep \
                        and self._ledger.record(record, run.info.run_id, unless_finished=True):
                    adopted.append(key)
                    candidates = [r for r in candidates if r is not run]
                    if row["run_id"] and row["run_id"] in active:
                        candidates.append(active[row["run_id"]])  # the older attempt's run: one run per trial
                    row = rows[key] = {**row, "run_id": run.info.run_id, "status": record["status"]}
            for run in candidates:
                self.sink.delete_run(run.info.run_id)
                deleted.append(key)
        for key, row in rows.items():
            if row["status"] not in ("finished", "failed") or not row["run_id"] or row["run_id"] in active \
                    or key in busy:
                continue
            if row["run_id"] in runs:  # deleted in MLflow (the UI, a killed driver): the ledger still has it
                self.sink.restore_run(row["run_id"])
                restored.append(key)
            elif row.get("result_json"):  # gone from MLflow altogether: written again from the ledger
                new = self.sink.write_run(self._ledger.loads(row, "result_json"), experiment_id, sweep_id)
                self._ledger.set_run_id(sweep, key, new)
                rewritten.append(key)
        return Reconciled(tuple(adopted), tuple(restored), tuple(rewritten), tuple(deleted))

    @staticmethod
    def _adoptable(row: Mapping[str, Any], run: Any, active: Mapping[str, Any]) -> bool:
        """Whether a complete run the ledger does not list is a better result than the ledger's row: the
        row has none, or a failed one whose own run is gone, or a failed one where this run finished."""
        if row["status"] in DONE:
            return False
        if not row.get("result_json"):
            return True
        return row["run_id"] not in active or run.data.tags.get("status") == "finished"

    def _sweep_identity(self, sweep: str) -> tuple[str, str]:
        if sweep not in self._identity:
            info = self._ledger.sweep(sweep) or {}
            self._identity[sweep] = (info.get("experiment_id", ""), info.get("sweep_id") or "")
        return self._identity[sweep]

    # trials -------------------------------------------------------------------------------------
    @_translating
    def pending(self, sweep: str) -> list[dict[str, Any]]:
        """Configs of trials not finished (pending, running when the driver died, or failed), each under its
        row's key (a row renamed to the canonical key by an older privbench kept the old key in its config,
        and a failed trial must still be retried)."""
        return [self._ledger.loads(t, "config_json") | {"trial_key": t["trial_key"]} for t in self._ledger.trials(sweep)
                if t["status"] not in ("finished", "superseded")]

    @_translating
    def unfinished(self, sweep: str, keys: Sequence[str], statuses: Sequence[str] | None = None) -> set[str]:
        """Which of `keys` the ledger does not mark finished, or marks with one of `statuses` (`pending`, for a
        batch of a large grid's trials)."""
        return self._ledger.unfinished(sweep, keys, statuses)

    @_translating
    def claim(self, sweep: str, trial_key: str) -> bool:
        """Lease the trial for this driver; False when another driver has it or it is done."""
        ok = self._ledger.claim(sweep, trial_key, self.owner, self.started)
        if ok:
            self._claimed.add((sweep, trial_key))
        return ok

    @_translating
    def heartbeat(self, sweep: str) -> None:
        """Renew this driver's leases and its registration on the sweep when a third of their lifetime has
        passed (cheap to call often; timed on this process's monotonic clock, written in the database's)."""
        if time.monotonic() - self._renewed > lease_seconds() / 3:
            self._ledger.renew(sweep, self.owner)
            self._renewed = time.monotonic()

    @_translating
    def release(self, sweep: str) -> None:
        """Give back this driver's leases and registration on the sweep."""
        self._ledger.release(sweep, self.owner)
        self._claimed = {c for c in self._claimed if c[0] != sweep}

    @_translating
    def steal_leases(self, sweep: str) -> None:
        """Free every lease of the sweep (`--steal-leases`: its drivers are known to be dead)."""
        self._ledger.release(sweep, owner=None)

    @_translating
    def load_phase(self, sweep: str, trial_key: str) -> dict[str, Any] | None:
        """The accelerator-phase output an earlier attempt stored for this unrecorded trial, if any."""
        stored = self._ledger.phase(sweep, trial_key)
        if stored is None:
            return None
        return self._ledger.loads({"phase_json": stored, "trial_key": trial_key, "sweep": sweep}, "phase_json")

    @_translating
    def save_phase(self, sweep: str, trial_key: str, output: Mapping[str, Any]) -> bool:
        """Keep a trial's accelerator-phase output while this driver holds its lease (False: it does not)."""
        return self._ledger.save_phase(sweep, trial_key, self.owner, json.dumps(output))

    @_translating
    def record(self, record: Mapping[str, Any]) -> str | None:
        """Log one result as one MLflow run, then (last) the ledger row. Returns the run id (None when
        this driver lost the trial's lease to another driver, which records it instead).

        A retried trial keeps one run: the earlier attempt's run (the ledger's) is deleted once the new
        one is complete and before the ledger row points at it, so a driver killed at any moment leaves at
        most a complete run the ledger does not list, which the next driver adopts (`_reconcile`).

        Raises `StoreLost` when the store was deleted or replaced since it was opened, and a one-line
        `StoreError` for a full disk or a tracking server that stopped answering."""
        from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

        sweep, key = record["sweep"], record["trial_key"]
        owner = self.owner if (sweep, key) in self._claimed else None
        self.check_intact()
        if owner is not None and not self._ledger.renew(sweep, owner, key):
            return None  # the lease expired and another driver took the trial over: it records it
        previous, attempts = self._ledger.run_state(sweep, key)
        try:
            run_id = self.sink.write_run(record, *self._sweep_identity(sweep))
            if previous and previous != run_id:
                self.sink.delete_quietly(previous)  # the earlier attempt's run, superseded by a complete one
            fault("before_ledger_record")
            recorded = self._ledger.record(record, run_id, owner)
            fault("after_ledger_record")
        except MlflowException:
            # Paused past its lease (SIGSTOP, a suspended laptop): the driver that took the trial over
            # deleted this half-written run. Stand down; the trial is that driver's now.
            if owner is not None and not self._ledger.renew(sweep, owner, key):
                return None
            raise
        if not recorded:
            self.sink.delete_quietly(run_id)  # our own run, for a trial another driver took over
            return None
        self._claimed.discard((sweep, key))
        if attempts > 1:  # a trial taken over from a dead driver may have its complete, unlisted run
            for other in self.sink.trial_runs(self._sweep_identity(sweep)[0], key):
                if other != run_id:
                    self.sink.delete_quietly(other)
        self.check_intact()  # deleted while this result was written: it is lost, say so now
        return run_id

    # reading ------------------------------------------------------------------------------------
    @_translating
    def records(self, sweep: str) -> list[dict[str, Any]]:
        """Results of the sweep's current grid (not of trials an edited grid superseded)."""
        return [self._ledger.loads(t, "result_json") for t in self._ledger.trials(sweep)
                if t["result_json"] and t["status"] != "superseded"]

    @_translating
    def trials(self, sweep: str) -> list[TrialRow]:
        """Every trial of the sweep as the ledger holds it, superseded ones included."""
        return [TrialRow(trial_key=t["trial_key"], status=t["status"], dataset=t["dataset"], model=t["model"],
                         mechanism=t["mechanism"], epsilon=t["epsilon"], seed=t["seed"], attempts=t["attempts"],
                         run_id=t["run_id"], error=t["error"], lease_owner=t.get("lease_owner"),
                         record=self._ledger.loads(t, "result_json") if t["result_json"] else None)
                for t in self._ledger.trials(sweep)]

    @_translating
    def driver_runs(self, sweep: str) -> list[dict[str, Any]]:
        """The sweep's driver runs, oldest first: owner, started_at, wall_s and `timing` (the driver's account)."""
        return [{k: v for k, v in row.items() if k != "timing_json"} | {"timing": json.loads(row["timing_json"])}
                for row in self._ledger.driver_runs(sweep)]

    @_translating
    def add_driver_run(self, sweep: str, started_at: float, wall_s: float, timing: Mapping[str, float]) -> None:
        """Keep this driver's account of its run of the sweep (`sweep status --timing` reads it)."""
        self._ledger.add_driver_run(sweep, self.owner, started_at, wall_s, json.dumps(dict(timing)))

    @_translating
    def calibration(self, key: str) -> bytes | None:
        """A cached plan (orchestrator/plan_cache.py), or None."""
        return self._ledger.calibration(key)

    @_translating
    def add_calibration(self, key: str, view: Mapping[str, Any], blob: bytes) -> None:
        self._ledger.add_calibration(key, json.dumps(dict(view), sort_keys=True, default=str), blob)

    @_translating
    def status_counts(self, sweep: str) -> dict[str, int]:
        """Trials per status: finished, failed, pending, running, superseded."""
        return self._ledger.status_counts(sweep)

    @_translating
    def sweep_names(self) -> list[str]:
        """The sweeps of the store, the most recently opened first."""
        return self._ledger.sweep_names() if self._ledger.has_schema() else []

    @_translating
    def grid_yaml(self, sweep: str) -> str:
        """The grid file the sweep was last run with ('' when unknown)."""
        return (self._ledger.sweep(sweep) or {}).get("grid_yaml") or ""

    @_translating
    def experiments(self) -> list[tuple[str, str, Mapping[str, str]]]:
        """(sweep, MLflow experiment id, experiment tags) of every sweep, for the MLflow UI's links."""
        found = []
        for name in self.sweep_names():
            experiment_id = (self._ledger.sweep(name) or {}).get("experiment_id") or ""
            exp = self.sink.client.get_experiment(experiment_id) if experiment_id else None
            found.append((name, experiment_id, dict(exp.tags or {}) if exp is not None else {}))
        return found

    @_translating
    def lease_watch(self, sweep: str) -> LeaseWatch:
        """The other drivers' leases on the trials this driver could not run, and whether those drivers are
        alive: each renews its leases every third of their lifetime, so one such period tells (a driver on
        this host whose process is gone is dead at once). Measured on this process's monotonic clock, the
        leases in the database's: no two clocks are compared."""

        def unfinished() -> dict[str, tuple[str | None, float | None]]:
            return self._ledger.open_leases(sweep)

        first = unfinished()
        if not first:  # the other driver recorded them meanwhile
            return LeaseWatch((), True)
        now = self._ledger.now()
        held = [(owner, expires - now) for owner, expires in first.values() if owner and (expires or 0) >= now]
        if len(held) < len(first) or any(owner_dead(owner) for owner, _ in held):
            return LeaseWatch(tuple(held), False)  # a trial nobody holds, or a dead holder: a rerun takes them
        deadline = time.monotonic() + lease_seconds() / 3 + 2
        while time.monotonic() < deadline:
            time.sleep(0.5)  # poll interval: the other driver's renewal or record shows in the ledger
            later = unfinished()
            if all(key not in later or (later[key][1] or 0) > (expires or 0) for key, (_, expires) in first.items()):
                return LeaseWatch(tuple(self._ledger.leases(sweep)), True)
        return LeaseWatch(tuple(self._ledger.leases(sweep)), False)


def finished_already(location: StoreLocation, sweep: str, grid_yaml: str, keys: Iterable[str]) -> int | None:
    """How many trials the sweep has when the ledger alone shows every one of `keys` finished under this
    very grid text (read-only, MLflow's file only checked); None when there may be work (or a file is damaged:
    opening the store properly reports why). The ledger's counts are read first and `keys` (a large grid's are
    made as they are read) only when they could all be finished; of its rows only keys and statuses."""
    try:
        ledger = Ledger(location.ledger_uri, read_only=True)
        try:
            if any(path.is_file() and problem_of(location, path) is not None for path in
                   {sqlite_path(location.ledger_uri), sqlite_path(location.tracking_uri)} - {None}):
                return None  # the full path refuses it, in the line `store check` gives
            if not ledger.has_schema():
                return None
            row = ledger.sweep(sweep)
            if row is None or row["grid_yaml"] != grid_yaml or not row["experiment_id"]:
                return None  # a new or edited grid: the full path syncs the ledger
            counts = ledger.status_counts(sweep)
            if any(n for status, n in counts.items() if status not in DONE):
                return None
            live = ledger.finished_keys(sweep)
        finally:
            ledger.engine.dispose()
    except Exception:  # noqa: BLE001 - whatever it is, the full path reports it properly
        return None
    count = 0
    for key in keys:
        if key not in live:
            return None
        count += 1
    return count if count == len(live) else None
