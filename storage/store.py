"""The store: the ledger (the source of truth) plus its MLflow mirror, written by the driver alone.

`Store` decides what is owned, leased and recorded, and in which order; every MLflow call goes through
its `MlflowSink` (storage/mlflow_sink.py). It takes result records as plain mappings; it does not
import `workers`.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from storage.errors import WRITE_ACCESS, Conflict, StoreError, StoreLost, translated
from storage.faults import fault
from storage.ledger import Ledger, lease_seconds, new_owner
from storage.location import StoreLocation, data_home, mask_uri, resolve, split_credentials, sqlite_path
from storage.mlflow_sink import (
    KIND_TAG,
    LEDGER_ID_TAG,
    SUPERSEDED_TAG,
    SWEEP_ID_TAG,
    SWEEP_RUN_TAG,
    TRIAL_KEY_TAG,
    MlflowSink,
)


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
    if location.folder is not None and location.folder.exists() and not location.folder.is_dir():
        raise StoreError(f"store {location.display} is a file, not a store folder")
    if location.kind != "server":
        return
    import base64
    import urllib.error
    import urllib.request

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


class Store:
    """Open a store. `create=True` (the driver) initialises it once under a lock, before any fan-out;
    otherwise (the read commands) it is opened read-only and never written, MLflow included."""

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
        with translated(self.where):
            if create:
                self._create()
            else:
                if not self.location.exists():
                    raise StoreError(f"no privbench store at {self.where}")
                self.ledger = Ledger(self.location.ledger_uri, read_only=True)
                self.ledger.check()

    def _create(self) -> None:
        loc = self.location
        for path in (sqlite_path(loc.ledger_uri), sqlite_path(loc.tracking_uri)):
            if path is not None and path.exists() and not os.access(path, os.W_OK):
                raise StoreError(f"store {path} is read-only: `sweep run` {WRITE_ACCESS}")
        if loc.folder is not None:
            try:
                loc.folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreError(f"cannot create the store folder {loc.folder}: {e.strerror}") from None
        self.ledger = Ledger(loc.ledger_uri)
        with self.ledger.lock():
            self._check_tracking_file()
            self.ledger.migrate()
            self.ledger_id = self.ledger.ledger_id()
            self.artifact_root = loc.artifact_root
            if loc.kind == "database" and self.artifact_root is None:
                self.artifact_root = self.ledger.ensure_meta("artifact_root", _default_artifacts(loc))
            self.sink.connect()  # MLflow creates its schema here: under the lock
        self._files = self._file_identities()

    def _file_identities(self) -> dict[Path, tuple[int, int]]:
        """(device, inode) of the store's SQLite files: a file deleted or replaced under a running driver
        keeps taking its writes through the open connection, and every result would be lost."""
        found = {}
        for path in {sqlite_path(self.location.ledger_uri), sqlite_path(self.location.tracking_uri)} - {None}:
            with contextlib.suppress(FileNotFoundError):
                info = path.stat()
                found[path] = (info.st_dev, info.st_ino)
        return found

    def check_intact(self) -> None:
        """Raise `StoreLost` when the store this driver opened was deleted or replaced since (checked at
        each record: the driver stops instead of reporting results that no longer exist)."""
        with translated(self.where):
            for path, ident in self._files.items():
                try:
                    info = path.stat()
                except FileNotFoundError:
                    raise StoreLost(f"store {self.where} was deleted while the sweep ran ({path} is gone); "
                                    "stopping: results recorded from now on would be lost") from None
                if (info.st_dev, info.st_ino) != ident:
                    raise StoreLost(f"store {self.where} was replaced while the sweep ran ({path} is another "
                                    "file now); stopping: results would go to the old, deleted file")
            if self._files.get(self.ledger.path) is None and self.ledger.meta_value("ledger_id") != self.ledger_id:
                raise StoreLost(f"the ledger {self.ledger.where} was replaced while the sweep ran (another "
                                "ledger identity); stopping")

    def _check_tracking_file(self) -> None:
        """A folder store whose MLflow database vanished or was truncated while the ledger lists sweeps
        must not be silently re-created: every trial would look finished with no run behind it."""
        path = sqlite_path(self.location.tracking_uri)
        if path is None or path == self.ledger.path or (path.exists() and path.stat().st_size > 0):
            return
        if self.ledger.path is not None and self.ledger.path.exists() and self.ledger.has_schema() \
                and self.ledger.sweep_names():
            state = "is empty (0 bytes: truncated?)" if path.exists() else "is missing"
            raise StoreError(f"store {path} {state} but the ledger lists sweeps; restore it from a backup, "
                             "or move the store aside to start a new one")

    def close(self) -> None:
        """Close the store's database connections; on SQLite the last one checkpoints the WAL into the files."""
        self.ledger.engine.dispose()
        self.sink.close()

    @property
    def client(self) -> Any:
        """The MLflow client (read commands use it to look at experiments)."""
        return self.sink.client

    # sweeps -------------------------------------------------------------------------------------
    def open_sweep(self, name: str, grid_yaml: str, configs: Iterable[Mapping[str, Any]],
                   key_of: Callable[[dict[str, Any]], str] | None = None) -> str:
        """Create (once) or reopen the sweep's experiment and ledger rows, checking that both belong to
        this ledger; reconcile MLflow with the ledger. Raises Conflict/StoreError before any training."""
        with translated(self.where), self.ledger.lock():
            experiment_id, sweep_id = self._own_experiment(name, grid_yaml)
            self._identity[name] = (experiment_id, sweep_id)
            superseded, renamed = self.ledger.sync_trials(name, configs, key_of)
            for run_id in superseded:  # kept for history, flagged in the UI
                self.sink.tag_quietly(run_id, SUPERSEDED_TAG, "true")
            for run_id, key in renamed.items():
                self.sink.tag_quietly(run_id, TRIAL_KEY_TAG, key)
            self.ledger.clear_dead_leases(name)
            self._reconcile(name, experiment_id, sweep_id)
            self.sink.sweep_run(name, experiment_id, grid_yaml)
        return experiment_id

    def log_sweep_files(self, sweep: str, files: Mapping[str, str | bytes]) -> str:
        """Store summary files (leaderboard CSV, figures; path -> content) on the sweep's parent run and
        mark it finished. Returns its run id."""
        return self.sink.log_sweep_files(sweep, self.ledger.sweep(sweep)["experiment_id"], files)

    def _own_experiment(self, name: str, grid_yaml: str) -> tuple[str, str]:
        row = self.ledger.sweep(name)
        for _ in range(2):
            exp = self.sink.experiment(name)
            if exp is not None:
                return self._check_owner(name, exp, row, grid_yaml)
            if row is not None and row["experiment_id"]:
                raise StoreError(
                    f"the ledger lists sweep {name!r} (MLflow experiment {row['experiment_id']}) but {self.where} "
                    "has no experiment of that name: it was deleted permanently, renamed, or the tracking "
                    "store was replaced. Restore it, or give the sweep another name (`name:` in the grid)")
            if row is None:  # the ledger row first: a crash after it leaves an experiment we recognise
                self.ledger.create_sweep(name, uuid.uuid4().hex, "", grid_yaml)
                row = self.ledger.sweep(name)
            artifacts = f"{self.artifact_root.rstrip('/')}/{name}" if self.artifact_root else None
            experiment_id = self.sink.create_experiment(name, artifacts, row["sweep_id"], self.ledger_id)
            if experiment_id is None:
                continue  # someone else created it a moment ago: check whose it is
            self.ledger.update_sweep(name, experiment_id=experiment_id)
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
            self.ledger.update_sweep(name, sweep_id=owner_id)
        elif owner_id is None:
            raise Conflict(
                f"{self.where} already has an MLflow experiment {name!r} that no privbench sweep created; "
                "privbench leaves its runs alone. Give the sweep another name (`name:` in the grid) or use "
                "another store")
        elif row is None or row.get("sweep_id") != owner_id or (row["experiment_id"] not in ("", exp.experiment_id)):
            raise Conflict(
                f"the MLflow experiment {name!r} on {self.where} belongs to another privbench ledger "
                f"(ledger {tags.get(LEDGER_ID_TAG, '?')}, sweep {owner_id}), not to {self.ledger.where}. To resume "
                "that sweep, pass its ledger with --ledger (a team shares one database); otherwise give the "
                "sweep another name (`name:` in the grid)")
        if exp.lifecycle_stage == "deleted":
            raise StoreError(
                f"the MLflow experiment {name!r} (id {exp.experiment_id}) of this sweep was deleted; restore it "
                f"(MLflow UI, or `mlflow experiments restore --experiment-id {exp.experiment_id}` with "
                f"MLFLOW_TRACKING_URI set to the store) or give the sweep another name (`name:` in the grid)")
        self.sink.mark_experiment_kind(exp)  # experiments made by older privbench versions
        if not row["experiment_id"]:
            self.ledger.update_sweep(name, experiment_id=exp.experiment_id)
        self.ledger.update_sweep(name, grid_yaml=grid_yaml)
        return exp.experiment_id, owner_id

    def _reconcile(self, sweep: str, experiment_id: str, sweep_id: str) -> list[str]:
        """Make MLflow agree with the ledger: exactly one run per recorded trial.

        A run of this sweep (it carries the sweep's identity) that the ledger does not list, and that no
        live driver is writing, is a leftover of a killed driver: it is deleted and the trial redone.
        A recorded trial whose run was deleted in MLflow is redone too. Runs without this sweep's
        identity are never touched. Returns the keys of trials to redo.
        """
        trials = self.ledger.trials(sweep)
        recorded = {t["run_id"] for t in trials if t["status"] in ("finished", "failed", "superseded") and t["run_id"]}
        busy = self.ledger.leased_by_others(sweep, self.owner)
        alive: set[str] = set()
        for run in self.sink.runs(experiment_id):
            run_id, tags = run.info.run_id, run.data.tags
            if run.info.lifecycle_stage == "deleted" or tags.get(SWEEP_RUN_TAG) == "true":
                continue
            if run_id in recorded:
                alive.add(run_id)
            elif tags.get(SWEEP_ID_TAG) == sweep_id and tags.get(TRIAL_KEY_TAG) not in busy:
                self.sink.delete_run(run_id)
        gone = [t["trial_key"] for t in trials
                if t["status"] in ("finished", "failed") and t["run_id"] and t["run_id"] not in alive]
        self.ledger.redo(sweep, gone)
        return gone

    def _sweep_identity(self, sweep: str) -> tuple[str, str]:
        if sweep not in self._identity:
            info = self.ledger.sweep(sweep) or {}
            self._identity[sweep] = (info.get("experiment_id", ""), info.get("sweep_id") or "")
        return self._identity[sweep]

    # trials -------------------------------------------------------------------------------------
    def pending(self, sweep: str) -> list[dict[str, Any]]:
        """Configs of trials not finished (pending, running when the driver died, or failed)."""
        return [self.ledger.loads(t, "config_json") for t in self.ledger.trials(sweep)
                if t["status"] not in ("finished", "superseded")]

    def claim(self, sweep: str, trial_key: str) -> bool:
        """Lease the trial for this driver; False when another driver has it or it is done."""
        with translated(self.where):
            ok = self.ledger.claim(sweep, trial_key, self.owner, self.started)
        if ok:
            self._claimed.add((sweep, trial_key))
        return ok

    def heartbeat(self, sweep: str) -> None:
        """Renew this driver's leases when a third of their lifetime has passed (cheap to call often)."""
        if self._claimed and time.time() - self._renewed > lease_seconds() / 3:
            with translated(self.where):
                self.ledger.renew(sweep, self.owner)
            self._renewed = time.time()

    def release(self, sweep: str) -> None:
        with translated(self.where):
            self.ledger.release(sweep, self.owner)
        self._claimed = {c for c in self._claimed if c[0] != sweep}

    def mark_running(self, sweep: str, trial_key: str) -> None:
        self.ledger.mark_running(sweep, trial_key)

    def record(self, record: Mapping[str, Any]) -> str | None:
        """Log one result as one MLflow run, then (last) the ledger row. Returns the run id (None when
        this driver lost the trial's lease to another driver, which records it instead).

        Raises `StoreLost` when the store was deleted or replaced since it was opened, and a one-line
        `StoreError` for a full disk or a tracking server that stopped answering."""
        from mlflow.exceptions import MlflowException

        sweep, key = record["sweep"], record["trial_key"]
        owner = self.owner if (sweep, key) in self._claimed else None
        self.check_intact()
        with translated(self.where):
            if owner is not None and not self.ledger.renew(sweep, owner, key):
                return None  # the lease expired and another driver took the trial over: it records it
            previous = [r for r in [self.ledger.run_id(sweep, key)] if r]
            try:
                run_id = self.sink.write_run(record, *self._sweep_identity(sweep))
                fault("before_ledger_record")
                recorded = self.ledger.record(record, run_id, owner)
            except MlflowException:
                # Paused past its lease (SIGSTOP, a suspended laptop): the driver that took the trial over
                # deleted this half-written run. Stand down; the trial is that driver's now.
                if owner is not None and not self.ledger.renew(sweep, owner, key):
                    return None
                raise
            if not recorded:
                self.sink.delete_quietly(run_id)  # our own run, for a trial another driver took over
                return None
            self._claimed.discard((sweep, key))
            for old in previous:  # a retried trial keeps one run: the latest attempt
                if old != run_id:
                    self.sink.delete_quietly(old)
        self.check_intact()  # deleted while this result was written: it is lost, say so now
        return run_id

    # reading ------------------------------------------------------------------------------------
    def records(self, sweep: str) -> list[dict[str, Any]]:
        """Results of the sweep's current grid (not of trials an edited grid superseded)."""
        return [self.ledger.loads(t, "result_json") for t in self.ledger.trials(sweep)
                if t["result_json"] and t["status"] != "superseded"]

    def sweep_names(self) -> list[str]:
        return self.ledger.sweep_names() if self.ledger.has_schema() else []

