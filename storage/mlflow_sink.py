"""The MLflow mirror of the ledger: every MLflow read and write of the store goes through `MlflowSink`.

The ledger is the source of truth; MLflow shows the same trials in its UI (one run per trial, under one
parent run per sweep), as Ray Tune's `MLflowLoggerCallback` mirrors a tuning run. `Store` decides what
is owned, leased and recorded, and in which order; the sink only talks to MLflow. MLflow is imported
when the first client is made, never at import time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import sqlalchemy

from storage import schema
from storage.errors import translated
from storage.faults import fault
from storage.ledger import write_like_the_driver
from storage.location import RELATIVE_ARTIFACTS, data_home
from storage.mlflow_view import NOTE_TAG, RUNS_VIEW_TAG, display_params, runs_view, trial_summary

TRIAL_KEY_TAG = "privbench.trial_key"
SWEEP_TAG = "privbench.sweep"
SWEEP_ID_TAG = "privbench.sweep_id"  # the sweep's identity: privbench touches only runs carrying it
LEDGER_ID_TAG = "privbench.ledger_id"  # which ledger owns the experiment (said in conflict messages)
KIND_TAG = "privbench.kind"
RECORDED_TAG = "privbench.recorded"  # set last: a run without it was cut off mid-write
SUPERSEDED_TAG = "privbench.superseded"  # the trial left its sweep's grid (the grid was edited)
SWEEP_RUN_TAG = "privbench.sweep_run"  # the sweep's parent run (grid, leaderboard, figures); not a trial
SWEEP_RUN_ID_TAG = "privbench.sweep_run_id"  # on a trial run: its sweep's parent run (not nested, see write_run)
# A model-training experiment (MLflow's own UI switch decides which page opens: `privbench ui` sets it, see
# dashboards/ui.py), and the runs view (storage/mlflow_view.py) that gives its runs table the trials' columns.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development", RUNS_VIEW_TAG: runs_view(TRIAL_KEY_TAG)}
SWEEP_SECONDS_TAG = "privbench.sweep_seconds"  # on the sweep's run: the seconds its completed attempts took
SUMMARY_FILE = "summary.md"  # a sweep file that is also the experiment's description (the sweep's summary)
MAX_PARAM_LEN = 6000


def fitted(text: str, limit: int) -> str:
    """`text` within MLflow's `limit` characters for a tag: cut at a line's end, with a last line saying where
    the whole of it is. Why: MLflow cuts a longer tag mid-line itself, and warns on the driver's terminal (a
    114-trial sweep's summary is 9,165 characters, a run tag holds 8,000)."""
    if len(text) <= limit:
        return text
    tail = f"\n\n(cut to MLflow's {limit:,}-character limit: the whole summary is this run's `{SUMMARY_FILE}`)\n"
    head = text[: limit - len(tail)]
    return head[: head.rfind("\n") + 1 or len(head)].rstrip("\n") + tail


def _quiet_mlflow() -> None:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")  # an unreachable server fails in seconds
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    # A benchmark of private training reports nothing home unless its user opts in (false turns it back on).
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # MLflow prints "View run ... at: <server URL>" on stdout for every run of a tracking server: the URL
    # holds the store's credentials, and stdout is for results (`--json`).
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    import mlflow  # lazy: heavy (mlflow)  # noqa: F401  (configures its loggers on import; we lower them afterwards)

    for name in ("mlflow", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # It logs each database error it raises (a locked file: two tracebacks, 95 lines); the store says each in one.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    # A server that stops answering is said once, by the driver, in one line: not per retry.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


def flatten(prefix: str, value: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value
    return out


class MlflowSink:
    """The store's MLflow side at `tracking_uri` (`where` names it in messages). `writer=True` (the
    driver) writes MLflow's SQLite file as the driver writes the ledger; readers never write it."""

    def __init__(self, tracking_uri: str, where: str, *, writer: bool, artifacts_folder: Path | None = None) -> None:
        self.tracking_uri = tracking_uri
        self.where = where
        self.writer = writer
        self.artifacts_folder = artifacts_folder  # where the store's relative artifact URIs resolve
        self._client: Any = None
        self._parents: dict[str, str] = {}  # sweep -> its parent run id (one lookup per driver)
        self._attempts: dict[str, float] = {}  # sweep -> when this driver's `sweep run` opened it

    def connect(self, *, new_file: bool = False) -> None:
        """Make the client now (the driver does it under the ledger's lock: MLflow creates its schema here).
        `new_file`: the database file was replaced in this process (a rebuilt mirror); MLflow keeps one
        store and engine per URI for the process, which still believe the old file's schema is there."""
        if new_file:
            _forget_store(self.tracking_uri)
        self._client = self._make_client()

    def create_file(self, path: Path) -> None:
        """Create MLflow's SQLite database at `path` whole or not at all: its schema is made in a file beside
        it, renamed into place when complete. A disk that fills during MLflow's migrations leaves only that
        file (removed by the next attempt), never a half-migrated `mlflow.db` that every later run refuses
        ("table _alembic_tmp_experiments already exists")."""
        from mlflow.tracking import MlflowClient  # lazy: heavy (mlflow)

        _quiet_mlflow()
        partial = path.with_name(path.name + ".creating")
        for leftover in (partial, *(partial.with_name(partial.name + s) for s in ("-wal", "-shm", "-journal"))):
            leftover.unlink(missing_ok=True)  # an earlier attempt's, privbench's own
        uri = f"sqlite:///{partial}"
        _forget_store(uri)  # an earlier attempt's engine still holds the removed file open
        with translated(self.where):
            template = schema_template()
            if template is not None:
                shutil.copyfile(template, partial)  # MLflow finds its schema complete and migrates nothing
            try:
                _mlflow_engine(MlflowClient(tracking_uri=uri))  # MLflow checks (or makes) the schema here
            finally:
                _forget_store(uri)
            os.replace(partial, path)

    def _make_client(self) -> Any:
        _quiet_mlflow()
        from mlflow.tracking import MlflowClient  # lazy: heavy (mlflow)

        client = MlflowClient(tracking_uri=self.tracking_uri)
        engine = _mlflow_engine(client)
        if self.writer and engine is not None and engine.dialect.name == "sqlite":
            write_like_the_driver(engine)  # the driver writes mlflow.db as it writes the ledger
        return client

    def close(self) -> None:
        engine = _mlflow_engine(self._client) if self._client is not None else None
        if engine is not None:
            engine.dispose()

    @property
    def client(self) -> Any:
        if self._client is None:
            with translated(self.where):
                self._client = self._make_client()
        return self._client

    # experiments --------------------------------------------------------------------------------
    def experiment(self, name: str) -> Any:
        """The experiment of that name (with its tags, id and lifecycle stage), or None."""
        return self.client.get_experiment_by_name(name)

    def create_experiment(self, name: str, artifacts: str | None, sweep_id: str, ledger_id: str) -> str | None:
        """Create the sweep's experiment, tagged with its identity; None when someone else created one
        of that name a moment ago (the caller checks whose it is)."""
        from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

        try:
            return self.client.create_experiment(
                name, artifact_location=artifacts,
                tags={KIND_TAG: "sweep", SWEEP_ID_TAG: sweep_id, LEDGER_ID_TAG: ledger_id} | EXPERIMENT_KIND)
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return None

    def set_experiment_tag(self, experiment_id: str, key: str, value: str) -> None:
        self.client.set_experiment_tag(experiment_id, key, value)

    def mark_experiment_kind(self, exp: Any) -> None:
        """Give an experiment made by an older privbench version the tags of the runs-table page."""
        tags = exp.tags or {}
        for key, value in EXPERIMENT_KIND.items():
            if tags.get(key) != value:
                self.client.set_experiment_tag(exp.experiment_id, key, value)

    # runs ---------------------------------------------------------------------------------------
    def sweep_run(self, sweep: str, experiment_id: str, grid_yaml: str | None = None) -> str:
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
        if grid_yaml is not None:  # a `sweep run` opens the sweep: its attempt starts now
            self._attempts[sweep] = time.time()
            self.put_artifacts(run_id, {"grid.yaml": grid_yaml})
        self._parents[sweep] = run_id
        return run_id

    def log_sweep_files(self, sweep: str, experiment_id: str, files: Mapping[str, str | bytes]) -> str:
        """Store summary files (path -> content) on the sweep's parent run and mark it finished; `summary.md`
        is also the experiment's description and the parent run's own (its page shows the summary).

        The parent run's duration is the time of the `sweep run` attempts that got here, summed (the tag
        `privbench.sweep_seconds`): an attempt that was killed never does, so its time is not counted (the
        run's start is the first attempt's, and its end was the last attempt's end: a killed attempt and the
        pause after it made a 5-minute sweep look hours long)."""
        run_id = self.sweep_run(sweep, experiment_id)
        self.put_artifacts(run_id, files)
        if SUMMARY_FILE in files:
            # lazy: heavy (mlflow)
            from mlflow.utils.validation import MAX_EXPERIMENT_TAG_VAL_LENGTH, MAX_TAG_VAL_LENGTH

            summary = files[SUMMARY_FILE]
            text = summary.decode() if isinstance(summary, bytes) else summary
            self.client.set_experiment_tag(experiment_id, NOTE_TAG, fitted(text, MAX_EXPERIMENT_TAG_VAL_LENGTH))
            self.client.set_tag(run_id, NOTE_TAG, fitted(text, MAX_TAG_VAL_LENGTH))
        run = self.client.get_run(run_id)
        attempt = max(0.0, time.time() - self._attempts.pop(sweep, time.time()))
        spent = float(run.data.tags.get(SWEEP_SECONDS_TAG) or 0.0) + attempt
        self.client.set_tag(run_id, SWEEP_SECONDS_TAG, f"{spent:.3f}")
        self.client.set_terminated(run_id, "FINISHED", end_time=run.info.start_time + int(spent * 1000))
        return run_id

    def put_artifacts(self, run_id: str, files: Mapping[str, str | bytes], artifact_uri: str | None = None) -> None:
        """Write files (relative path -> content) as the run's artifacts. A run of this store's own artifacts
        (RELATIVE_ARTIFACTS) gets them under its folder's `artifacts/`; any other location (a folder or
        bucket given with --artifacts, a tracking server's) through MLflow."""
        root = self._own_artifacts(artifact_uri or self.client.get_run(run_id).info.artifact_uri)
        with tempfile.TemporaryDirectory() as tmp:
            for rel, content in files.items():
                path = (root or Path(tmp)) / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content.encode() if isinstance(content, str) else content)
            if root is None:
                self.client.log_artifacts(run_id, tmp)

    def _own_artifacts(self, uri: str) -> Path | None:
        """The folder of a run whose artifacts are this store's own (RELATIVE_ARTIFACTS), else None."""
        if uri.startswith(RELATIVE_ARTIFACTS) and self.artifacts_folder is not None:
            return self.artifacts_folder / uri.removeprefix(RELATIVE_ARTIFACTS).lstrip("/")
        return None

    def tag_quietly(self, run_id: str, key: str, value: str) -> None:
        from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

        try:
            self.client.set_tag(run_id, key, value)
        except MlflowException:  # the run was deleted in MLflow: nothing to flag
            pass

    def runs(self, experiment_id: str) -> list[Any]:
        """Every run of the experiment, deleted ones included."""
        from mlflow.entities import ViewType  # lazy: heavy (mlflow)

        runs, token = [], None
        while True:
            page = self.client.search_runs([experiment_id], run_view_type=ViewType.ALL, max_results=1000,
                                           page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def delete_run(self, run_id: str) -> None:
        self.client.delete_run(run_id)

    def restore_run(self, run_id: str) -> None:
        self.client.restore_run(run_id)

    def trial_runs(self, experiment_id: str, trial_key: str) -> list[str]:
        """The ids of the active runs of one trial (every attempt's, whoever wrote them)."""
        found = self.client.search_runs([experiment_id], filter_string=f"tags.`{TRIAL_KEY_TAG}` = '{trial_key}'",
                                        max_results=1000)
        return [r.info.run_id for r in found]

    def read_text(self, run_id: str, path: str) -> str | None:
        """A text artifact of a run (`result.json`, the parent run's `grid.yaml`), or None when it cannot be read."""
        from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

        try:
            root = self._own_artifacts(self.client.get_run(run_id).info.artifact_uri)
            if root is not None:  # written by put_artifacts under the store's folder, read from there
                return (root / path).read_text()
            with tempfile.TemporaryDirectory() as tmp:
                return Path(self.client.download_artifacts(run_id, path, tmp)).read_text()
        except (MlflowException, OSError, ValueError):
            return None

    def read_record(self, run_id: str) -> dict[str, Any] | None:
        """The result record a complete run stored (`result.json`), or None when it cannot be read."""
        try:
            record = json.loads(self.read_text(run_id, "result.json") or "null")
        except ValueError:
            return None
        return record if isinstance(record, dict) else None

    def delete_quietly(self, run_id: str) -> None:
        from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

        with contextlib.suppress(MlflowException):  # already deleted (by the driver that took over)
            self.client.delete_run(run_id)

    def write_run(self, record: Mapping[str, Any], experiment_id: str, sweep_id: str) -> str:
        """The trial's MLflow run, complete (its `recorded` tag set last); returns its id."""
        from mlflow.entities import Metric, Param, RunTag  # lazy: heavy (mlflow)

        sweep, key = record["sweep"], record["trial_key"]
        config = record["config"]
        eps = config.get("epsilon")
        # the mechanism first: MLflow's run-name column cuts a name after about 20 characters, and a name cut
        # before its mechanism (`eps2 seed0 dpsgd-sh…`) named no run; epsilon and seed have columns of their own
        run_name = f"{config['mechanism']} " + (f"eps{eps:g} " if eps is not None else "") + (
            f"seed{config['seed']} {config['dataset']}/{config['model']}")
        env = record.get("environment") or {}
        started, ended = _ms(env.get("started_at")), _ms(env.get("finished_at"))  # the trial's own wall clock
        now = ended or int(time.time() * 1000)
        privacy = record.get("privacy") or {}
        params = {k: v for k, v in flatten("", config, {}).items() if k not in ("sweep", "trial_key")}
        params |= display_params(record)  # the runs view's rounded columns
        params |= {f"privacy.{k}": privacy.get(k) for k in
                   ("sigma", "sample_rate", "steps", "sampler", "accountant", "claimed_by", "grad_sample_mode")}
        metrics = dict(record.get("metrics") or {})
        metrics |= {f.key: schema.value(privacy, f) for f in schema.mlflow_metrics("privacy")}
        tags = {"status": record["status"], "mechanism": config["mechanism"], "device": env.get("device"),
                "claim_status": privacy.get("claim_status"), "error": (record.get("error") or None),
                "node_ip": env.get("node_ip"), "hostname": env.get("hostname")}
        tags |= {f"version.{k}": v for k, v in (env.get("versions") or {}).items()}
        tags[NOTE_TAG] = trial_summary(record)  # the run page's description: its numbers, grouped and rounded
        # Few round trips per run (each is a database transaction): every tag at creation, the
        # artifacts, then metrics, params and the `recorded` mark in one batch, then the end.
        run = self.client.create_run(
            experiment_id, run_name=run_name, start_time=started,
            tags={TRIAL_KEY_TAG: key, SWEEP_TAG: sweep, SWEEP_ID_TAG: sweep_id,
                  # a tag, not mlflow.parentRunId: nested trials sit collapsed under the sweep's row in the UI
                  SWEEP_RUN_ID_TAG: self.sweep_run(sweep, experiment_id)} | _source_tags()
            | {k: str(v)[:5000] for k, v in tags.items() if v is not None})
        run_id = run.info.run_id
        fault("after_create_run")
        self.client.log_inputs(run_id, datasets=[_dataset_input(config, metrics.get("n_train"))])
        self.put_artifacts(run_id, {"result.json": json.dumps(dict(record), indent=2)}
                           | ({"traceback.txt": record["traceback"]} if record.get("traceback") else {}),
                           run.info.artifact_uri)
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


def schema_template() -> Path | None:
    """An empty MLflow database at the schema this MLflow version migrates to (tables only: no experiment, so
    MLflow makes its default one, with this store's artifact root, on the first open of each copy), made once
    per MLflow version in the user's data folder and copied for each new store. Why: MLflow builds a new
    SQLite database by running its ~50 migrations, 1.5-2 CPU seconds that every new store (every first `sweep
    run`, every test's store) paid again for the same empty schema. None where it cannot be kept (a read-only
    home): the store is then made by MLflow's migrations, as before. MLflow still checks the copy's schema
    revision when it opens it (`_verify_schema`), so a wrong template stops there, never silently."""
    import mlflow  # lazy: heavy (mlflow)
    from mlflow.store.db.utils import _initialize_tables  # lazy: heavy (mlflow)

    path = data_home() / "mlflow-schema" / f"mlflow-{mlflow.__version__}.db"
    if path.is_file():
        return path
    partial = path.with_name(f".{path.name}.{os.getpid()}.creating")  # concurrent makers each rename a whole file
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        engine = sqlalchemy.create_engine(f"sqlite:///{partial}")
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()
        os.replace(partial, path)
    except (OSError, sqlalchemy.exc.SQLAlchemyError):
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        return None
    return path


def _mlflow_engine(client: Any) -> Any:
    """MLflow's SQLAlchemy engine behind a client, None for a tracking server. MLflow has no public hook
    for its database connections, so this is the one place that reaches through the client for it."""
    return getattr(getattr(client._tracking_client, "store", None), "engine", None)


def _forget_store(tracking_uri: str) -> None:
    """Drop MLflow's cached store and engine for a URI (the other place that reaches into MLflow, see
    `_mlflow_engine`): the next client checks, and creates, the schema of the file that is there now."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # lazy: heavy (mlflow)
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry  # lazy: heavy (mlflow)

    _tracking_store_registry._get_store_with_resolved_uri.cache_clear()
    engine = SqlAlchemyStore._engine_map.pop(tracking_uri, None)
    if engine is not None:
        engine.dispose()


def _ms(seconds: Any) -> int | None:
    return int(seconds * 1000) if _is_number(seconds) else None


@functools.lru_cache(maxsize=1)
def _source_tags() -> dict[str, str]:
    """MLflow's Source column: the privbench program, and the git commit of its checkout when it is one."""
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
    from mlflow.entities import Dataset, DatasetInput, InputTag  # lazy: heavy (mlflow)

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
