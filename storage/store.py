"""The store: MLflow runs (one per trial) plus the ledger, written by the driver alone.

`Store` takes result records as plain mappings; it does not import `workers`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import logging
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from storage import schema
from storage.errors import WRITE_ACCESS, Conflict, StoreError, StoreLost, translated
from storage.ledger import Ledger, lease_seconds, new_owner, write_like_the_driver
from storage.location import StoreLocation, data_home, mask_uri, resolve, split_credentials, sqlite_path
from storage.mlflow_view import RUNS_VIEW_TAG, runs_view

TRIAL_KEY_TAG = "privbench.trial_key"
SWEEP_TAG = "privbench.sweep"
SWEEP_ID_TAG = "privbench.sweep_id"  # the sweep's identity: privbench touches only runs carrying it
LEDGER_ID_TAG = "privbench.ledger_id"  # which ledger owns the experiment (said in conflict messages)
KIND_TAG = "privbench.kind"
RECORDED_TAG = "privbench.recorded"  # set last: a run without it was cut off mid-write
SUPERSEDED_TAG = "privbench.superseded"  # the trial left its sweep's grid (the grid was edited)
SWEEP_RUN_TAG = "privbench.sweep_run"  # the sweep's parent run (grid, leaderboard, figures); not a trial
SWEEP_RUN_ID_TAG = "privbench.sweep_run_id"  # on a trial run: its sweep's parent run (not nested, see record())
# MLflow 3's UI opens an experiment without this tag on its GenAI "Traces" page; with it, on the runs table.
# The runs view (storage/mlflow_view.py) gives that table its columns when the link names it.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development", RUNS_VIEW_TAG: runs_view()}
MAX_PARAM_LEN = 6000
FAULT_ENV = "PRIVBENCH_FAULT"


def fault(point: str) -> None:
    """Test hook: `PRIVBENCH_FAULT=after_create_run` (or `after_create_run:3`, the third time) kills
    this process with SIGKILL at that point, so kill tests hit exact moments instead of random ones.
    A third field picks another fault: `:stop` (SIGSTOP: a paused driver, resumed with SIGCONT) or
    `:enospc` (the disk is full: OSError 28 at that write)."""
    wanted = os.environ.get(FAULT_ENV)
    if not wanted or wanted.split(":", 1)[0] != point:
        return
    _, nth, action = (wanted.split(":") + ["", ""])[:3]
    count = _FAULT_COUNTS[point] = _FAULT_COUNTS.get(point, 0) + 1
    if count != int(nth or 1):
        return
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    else:
        os.kill(os.getpid(), signal.SIGKILL)


_FAULT_COUNTS: dict[str, int] = {}


def _quiet_mlflow() -> None:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")  # an unreachable server fails in seconds
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    # A benchmark of private training reports nothing home unless its user opts in (false turns it back on).
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow  # noqa: F401  (configures its loggers on import; we lower them afterwards)

    for name in ("mlflow", "mlflow.store.db.utils", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # A server that stops answering is said once, by the driver, in one line: not per retry.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


def flatten(prefix: str, value: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value
    return out


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
    _quiet_mlflow()
    from mlflow.tracking import MlflowClient

    with translated(location.display):
        exp = MlflowClient(tracking_uri=location.tracking_uri).get_experiment_by_name(sweep)
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
        self._client: Any = None
        self._identity: dict[str, tuple[str, str]] = {}  # sweep -> (experiment_id, sweep_id)
        self._parents: dict[str, str] = {}  # sweep -> its parent run id (one lookup per driver)
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
            self._client = self._make_client()  # MLflow creates its schema here: under the lock
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

    def _make_client(self) -> Any:
        _quiet_mlflow()
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.location.tracking_uri)
        engine = _mlflow_engine(client)
        if not self.ledger.read_only and engine is not None and engine.dialect.name == "sqlite":
            write_like_the_driver(engine)  # the driver writes mlflow.db as it writes the ledger
        return client

    def close(self) -> None:
        """Close the store's database connections; on SQLite the last one checkpoints the WAL into the files."""
        self.ledger.engine.dispose()
        engine = _mlflow_engine(self._client) if self._client is not None else None
        if engine is not None:
            engine.dispose()

    @property
    def client(self) -> Any:
        if self._client is None:
            with translated(self.where):
                self._client = self._make_client()
        return self._client

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
                self._tag_quietly(run_id, SUPERSEDED_TAG, "true")
            for run_id, key in renamed.items():
                self._tag_quietly(run_id, TRIAL_KEY_TAG, key)
            self.ledger.clear_dead_leases(name)
            self._reconcile(name, experiment_id, sweep_id)
            self._sweep_run(name, experiment_id, grid_yaml)
        return experiment_id

    def _sweep_run(self, sweep: str, experiment_id: str, grid_yaml: str | None = None) -> str:
        """The sweep's parent run (created once): trial runs name it in a tag, and it holds the
        grid file and, after each `sweep run`, the leaderboard and figures (`log_sweep_files`)."""
        if grid_yaml is None and sweep in self._parents:
            return self._parents[sweep]
        found = self.client.search_runs([experiment_id], filter_string=f"tags.`{SWEEP_RUN_TAG}` = 'true'",
                                        max_results=1)
        if found:
            run_id = found[0].info.run_id
        else:
            run_id = self.client.create_run(experiment_id, run_name=f"{sweep} (sweep)",
                                            tags={SWEEP_RUN_TAG: "true", SWEEP_TAG: sweep} | _source_tags()).info.run_id
        if grid_yaml is not None:
            self.client.log_text(run_id, grid_yaml, "grid.yaml")
        self._parents[sweep] = run_id
        return run_id

    def log_sweep_files(self, sweep: str, files: Mapping[str, str | bytes]) -> str:
        """Store summary files (leaderboard CSV, figures; path -> content) on the sweep's parent run and
        mark it finished. Returns its run id."""
        import tempfile
        from pathlib import Path

        run_id = self._sweep_run(sweep, self.ledger.sweep(sweep)["experiment_id"])
        with tempfile.TemporaryDirectory() as tmp:
            for rel, content in files.items():
                path = Path(tmp) / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content.encode() if isinstance(content, str) else content)
            self.client.log_artifacts(run_id, tmp)
        self.client.set_terminated(run_id, "FINISHED")
        return run_id

    def _own_experiment(self, name: str, grid_yaml: str) -> tuple[str, str]:
        from mlflow.exceptions import MlflowException

        row = self.ledger.sweep(name)
        for _ in range(2):
            exp = self.client.get_experiment_by_name(name)
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
            try:
                experiment_id = self.client.create_experiment(
                    name, artifact_location=artifacts,
                    tags={KIND_TAG: "sweep", SWEEP_ID_TAG: row["sweep_id"], LEDGER_ID_TAG: self.ledger_id}
                    | EXPERIMENT_KIND)
            except MlflowException as e:
                if e.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
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
            self.client.set_experiment_tag(exp.experiment_id, SWEEP_ID_TAG, owner_id)
            self.client.set_experiment_tag(exp.experiment_id, LEDGER_ID_TAG, self.ledger_id)
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
        for key, value in EXPERIMENT_KIND.items():  # experiments made by older privbench versions
            if tags.get(key) != value:
                self.client.set_experiment_tag(exp.experiment_id, key, value)
        if not row["experiment_id"]:
            self.ledger.update_sweep(name, experiment_id=exp.experiment_id)
        self.ledger.update_sweep(name, grid_yaml=grid_yaml)
        return exp.experiment_id, owner_id

    def _tag_quietly(self, run_id: str, key: str, value: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.set_tag(run_id, key, value)
        except MlflowException:  # the run was deleted in MLflow: nothing to flag
            pass

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
        for run in self._runs(experiment_id):
            run_id, tags = run.info.run_id, run.data.tags
            if run.info.lifecycle_stage == "deleted" or tags.get(SWEEP_RUN_TAG) == "true":
                continue
            if run_id in recorded:
                alive.add(run_id)
            elif tags.get(SWEEP_ID_TAG) == sweep_id and tags.get(TRIAL_KEY_TAG) not in busy:
                self.client.delete_run(run_id)
        gone = [t["trial_key"] for t in trials
                if t["status"] in ("finished", "failed") and t["run_id"] and t["run_id"] not in alive]
        self.ledger.redo(sweep, gone)
        return gone

    def _runs(self, experiment_id: str) -> list[Any]:
        from mlflow.entities import ViewType

        runs, token = [], None
        while True:
            page = self.client.search_runs([experiment_id], run_view_type=ViewType.ALL, max_results=1000,
                                           page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

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
                run_id = self._write_run(record)
                fault("before_ledger_record")
                recorded = self.ledger.record(record, run_id, owner)
            except MlflowException:
                # Paused past its lease (SIGSTOP, a suspended laptop): the driver that took the trial over
                # deleted this half-written run. Stand down; the trial is that driver's now.
                if owner is not None and not self.ledger.renew(sweep, owner, key):
                    return None
                raise
            if not recorded:
                self._delete_quietly(run_id)  # our own run, for a trial another driver took over
                return None
            self._claimed.discard((sweep, key))
            for old in previous:  # a retried trial keeps one run: the latest attempt
                if old != run_id:
                    self._delete_quietly(old)
        self.check_intact()  # deleted while this result was written: it is lost, say so now
        return run_id

    def _delete_quietly(self, run_id: str) -> None:
        from mlflow.exceptions import MlflowException

        with contextlib.suppress(MlflowException):  # already deleted (by the driver that took over)
            self.client.delete_run(run_id)

    def _write_run(self, record: Mapping[str, Any]) -> str:
        """The trial's MLflow run, complete (its `recorded` tag set last); returns its id."""
        from mlflow.entities import Metric, Param, RunTag

        sweep, key = record["sweep"], record["trial_key"]
        experiment_id, sweep_id = self._sweep_identity(sweep)
        config = record["config"]
        eps = config.get("epsilon")
        run_name = f"{config['mechanism']}-{config['dataset']}-{config['model']}" + (
            f"-eps{eps:g}" if eps is not None else "") + f"-seed{config['seed']}"
        env = record.get("environment") or {}
        started, ended = _ms(env.get("started_at")), _ms(env.get("finished_at"))  # the trial's own wall clock
        now = ended or int(time.time() * 1000)
        privacy = record.get("privacy") or {}
        params = {k: v for k, v in flatten("", config, {}).items() if k not in ("sweep", "trial_key")}
        params |= {f"privacy.{k}": privacy.get(k) for k in
                   ("sigma", "sample_rate", "steps", "sampler", "accountant", "claimed_by", "grad_sample_mode")}
        metrics = dict(record.get("metrics") or {})
        metrics |= {f.key: schema.value(privacy, f) for f in schema.mlflow_metrics("privacy")}
        tags = {"status": record["status"], "mechanism": config["mechanism"], "device": env.get("device"),
                "claim_status": privacy.get("claim_status"), "error": (record.get("error") or None),
                "node_ip": env.get("node_ip"), "hostname": env.get("hostname")}
        tags |= {f"version.{k}": v for k, v in (env.get("versions") or {}).items()}
        # Few round trips per run (each is a database transaction): every tag at creation, the
        # artifacts, then metrics, params and the `recorded` mark in one batch, then the end.
        run = self.client.create_run(
            experiment_id, run_name=run_name, start_time=started,
            tags={TRIAL_KEY_TAG: key, SWEEP_TAG: sweep, SWEEP_ID_TAG: sweep_id,
                  # a tag, not mlflow.parentRunId: nested trials sit collapsed under the sweep's row in the UI
                  SWEEP_RUN_ID_TAG: self._sweep_run(sweep, experiment_id)} | _source_tags()
            | {k: str(v)[:5000] for k, v in tags.items() if v is not None})
        run_id = run.info.run_id
        fault("after_create_run")
        self.client.log_inputs(run_id, datasets=[_dataset_input(config, metrics.get("n_train"))])
        self.client.log_dict(run_id, dict(record), "result.json")
        if record.get("traceback"):
            self.client.log_text(run_id, record["traceback"], "traceback.txt")
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items() if _is_number(v)]
            + [Metric(k, float(v), now, i + 1) for k, curve in (record.get("curves") or {}).items()
               for i, v in enumerate(curve) if _is_number(v)],
            params=[Param(k, _param(v)) for k, v in params.items() if v is not None],
            tags=[RunTag(RECORDED_TAG, "true")],  # last of the run's content: without it, it was cut off
        )
        fault("after_log_batch")
        self.client.set_terminated(run_id, "FINISHED" if record["status"] == "finished" else "FAILED",
                                   end_time=ended)
        return run_id

    # reading ------------------------------------------------------------------------------------
    def records(self, sweep: str) -> list[dict[str, Any]]:
        """Results of the sweep's current grid (not of trials an edited grid superseded)."""
        return [self.ledger.loads(t, "result_json") for t in self.ledger.trials(sweep)
                if t["result_json"] and t["status"] != "superseded"]

    def sweep_names(self) -> list[str]:
        return self.ledger.sweep_names() if self.ledger.has_schema() else []


def _mlflow_engine(client: Any) -> Any:
    """MLflow's SQLAlchemy engine behind a client, None for a tracking server. MLflow has no public hook
    for its database connections, so this is the one place that reaches through the client for it."""
    return getattr(getattr(client._tracking_client, "store", None), "engine", None)


def _ms(seconds: Any) -> int | None:
    return int(seconds * 1000) if _is_number(seconds) else None


@functools.lru_cache(maxsize=1)
def _source_tags() -> dict[str, str]:
    """MLflow's Source column: the privbench program, and the git commit of its checkout when it is one."""
    from importlib.metadata import PackageNotFoundError, version

    tags = {"mlflow.source.name": "privbench", "mlflow.source.type": "LOCAL"}
    try:
        tags["privbench.version"] = version("privbench")
    except PackageNotFoundError:
        pass
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    if len(commit) == 40:
        tags["mlflow.source.git.commit"] = commit
    return tags


def _dataset_input(config: Mapping[str, Any], n_train: Any) -> Any:
    """The trial's training set as an MLflow input (the UI's Dataset column): its registry name, the
    number of training examples used, and a digest of what identifies the data (name, options, size)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    ident = {"dataset": config["dataset"], "options": config.get("dataset_options") or {},
             "max_train_examples": (config.get("train") or {}).get("max_train_examples"),
             "n_train": int(n_train) if _is_number(n_train) else None}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:8]
    profile = {"num_rows": ident["n_train"]} if ident["n_train"] is not None else {}
    return DatasetInput(Dataset(name=config["dataset"], digest=digest, source_type="privbench",
                                source=json.dumps(ident, sort_keys=True, default=str), profile=json.dumps(profile)),
                        tags=[InputTag("mlflow.data.context", "training")])


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def _param(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v)
    return text[:MAX_PARAM_LEN]
