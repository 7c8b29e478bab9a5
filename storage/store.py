"""The store: MLflow runs (one per trial) plus the ledger, written by the driver alone.

`Store` takes result records as plain mappings; it does not import `workers`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Iterable, Mapping
from typing import Any

from storage.ledger import Ledger
from storage.location import StoreLocation, resolve

TRIAL_KEY_TAG = "privbench.trial_key"
SWEEP_TAG = "privbench.sweep"
RECORDED_TAG = "privbench.recorded"  # set last: a run without it was cut off mid-write
SUPERSEDED_TAG = "privbench.superseded"  # the trial left its sweep's grid (the grid was edited)
SWEEP_RUN_TAG = "privbench.sweep_run"  # the sweep's parent run (grid, leaderboard, figures); not a trial
# MLflow 3's UI opens an experiment without this tag on its GenAI "Traces" page; with it, on the runs table.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
MAX_PARAM_LEN = 6000


def _quiet_mlflow() -> None:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    import mlflow  # noqa: F401  (configures its loggers on import; we lower them afterwards)

    for name in ("mlflow", "mlflow.store.db.utils", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)


def flatten(prefix: str, value: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value
    return out


class Store:
    """Open (and with `create=True`, initialise once, before any fan-out) a store."""

    def __init__(self, location: StoreLocation | str | None = None, *, create: bool = False) -> None:
        _quiet_mlflow()
        from mlflow.tracking import MlflowClient

        self.location = location if isinstance(location, StoreLocation) else resolve(location)
        if create:
            self.location.create()
        elif not self.location.exists():
            raise FileNotFoundError(f"no privbench store at {self.location.folder}")
        self.ledger = Ledger(self.location.ledger_uri, create=create)
        self.client = MlflowClient(tracking_uri=self.location.tracking_uri)

    # sweeps -------------------------------------------------------------------------------------
    def open_sweep(self, name: str, grid_yaml: str, configs: Iterable[Mapping[str, Any]]) -> str:
        """Create (once) the sweep's experiment and ledger rows; reconcile runs cut off by a crash."""
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            experiment_id = self.client.create_experiment(
                name, artifact_location=f"{self.location.artifact_root}/{name}" if self.location.artifact_root
                else None, tags={"privbench.kind": "sweep"} | EXPERIMENT_KIND)
        else:
            experiment_id = experiment.experiment_id
            for key, value in EXPERIMENT_KIND.items():  # experiments made by older privbench versions
                if experiment.tags.get(key) != value:
                    self.client.set_experiment_tag(experiment_id, key, value)
        self.ledger.upsert_sweep(name, experiment_id, grid_yaml)
        for run_id in self.ledger.sync_trials(name, configs):  # kept for history, flagged in the UI
            self.client.set_tag(run_id, SUPERSEDED_TAG, "true")
        self._reconcile(name, experiment_id)
        self._sweep_run(name, experiment_id, grid_yaml)
        return experiment_id

    def _sweep_run(self, sweep: str, experiment_id: str, grid_yaml: str | None = None) -> str:
        """The sweep's parent run (created once): trial runs nest under it in the UI, and it holds the
        grid file and, after each `sweep run`, the leaderboard and figures (`log_sweep_files`)."""
        found = self.client.search_runs([experiment_id], filter_string=f"tags.`{SWEEP_RUN_TAG}` = 'true'",
                                        max_results=1)
        if found:
            run_id = found[0].info.run_id
        else:
            run_id = self.client.create_run(experiment_id, run_name=f"{sweep} (sweep)",
                                            tags={SWEEP_RUN_TAG: "true", SWEEP_TAG: sweep} | _source_tags()).info.run_id
        if grid_yaml is not None:
            self.client.log_text(run_id, grid_yaml, "grid.yaml")
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

    def _reconcile(self, sweep: str, experiment_id: str) -> None:
        """Make MLflow agree with the ledger after a killed driver: exactly one run per recorded trial.

        A run whose trial the ledger does not mark finished/failed with that run id is a leftover
        (the driver died between creating it and writing the ledger row): it is deleted, and the
        trial is redone.
        """
        kept = ("finished", "failed", "superseded")
        recorded = {t["run_id"] for t in self.ledger.trials(sweep) if t["status"] in kept}
        for run in self._runs(experiment_id):
            if run.info.run_id not in recorded and run.data.tags.get(SWEEP_RUN_TAG) != "true":
                self.client.delete_run(run.info.run_id)

    def _runs(self, experiment_id: str) -> list[Any]:
        runs, token = [], None
        while True:
            page = self.client.search_runs([experiment_id], max_results=1000, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    # trials -------------------------------------------------------------------------------------
    def pending(self, sweep: str) -> list[dict[str, Any]]:
        """Configs of trials not finished (pending, running when the driver died, or failed)."""
        return [json.loads(t["config_json"]) for t in self.ledger.trials(sweep)
                if t["status"] not in ("finished", "superseded")]

    def mark_running(self, sweep: str, trial_key: str) -> None:
        self.ledger.mark_running(sweep, trial_key)

    def record(self, record: Mapping[str, Any]) -> str:
        """Log one result as one MLflow run, then (last) the ledger row. Returns the run id."""
        from mlflow.entities import Metric, Param, RunTag

        sweep, key = record["sweep"], record["trial_key"]
        info = self.ledger.sweep(sweep)
        previous = [t["run_id"] for t in self.ledger.trials(sweep) if t["trial_key"] == key and t["run_id"]]
        config = record["config"]
        eps = config.get("epsilon")
        run_name = f"{config['mechanism']}-{config['dataset']}-{config['model']}" + (
            f"-eps{eps:g}" if eps is not None else "") + f"-seed{config['seed']}"
        env = record.get("environment") or {}
        started, ended = _ms(env.get("started_at")), _ms(env.get("finished_at"))  # the trial's own wall clock
        run = self.client.create_run(
            info["experiment_id"], run_name=run_name, start_time=started,
            tags={TRIAL_KEY_TAG: key, SWEEP_TAG: sweep,
                  "mlflow.parentRunId": self._sweep_run(sweep, info["experiment_id"])} | _source_tags())
        run_id = run.info.run_id
        now = ended or int(time.time() * 1000)
        privacy = record.get("privacy") or {}
        params = {k: v for k, v in flatten("", config, {}).items() if k not in ("sweep", "trial_key")}
        params |= {f"privacy.{k}": privacy.get(k) for k in
                   ("sigma", "sample_rate", "steps", "sampler", "accountant", "claimed_by", "grad_sample_mode")}
        metrics = dict(record.get("metrics") or {})
        metrics |= {k: privacy.get(k) for k in
                    ("epsilon_claimed", "epsilon_certified", "epsilon_audited", "epsilon_audited_step", "mu_audited",
                     "mu_claimed")}
        tags = {"status": record["status"], "mechanism": config["mechanism"], "device": env.get("device"),
                "claim_status": privacy.get("claim_status"), "error": (record.get("error") or None),
                "node_ip": env.get("node_ip"), "hostname": env.get("hostname")}
        tags |= {f"version.{k}": v for k, v in (env.get("versions") or {}).items()}
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items() if _is_number(v)]
            + [Metric(k, float(v), now, i + 1) for k, curve in (record.get("curves") or {}).items()
               for i, v in enumerate(curve) if _is_number(v)],
            params=[Param(k, _param(v)) for k, v in params.items() if v is not None],
            tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items() if v is not None],
        )
        self.client.log_inputs(run_id, datasets=[_dataset_input(config, metrics.get("n_train"))])
        self.client.log_dict(run_id, dict(record), "result.json")
        if record.get("traceback"):
            self.client.log_text(run_id, record["traceback"], "traceback.txt")
        self.client.set_tag(run_id, RECORDED_TAG, "true")
        self.client.set_terminated(run_id, "FINISHED" if record["status"] == "finished" else "FAILED",
                                   end_time=ended)
        self.ledger.record(record, run_id)
        for old in previous:  # a retried trial keeps one run: the latest attempt
            if old != run_id:
                self.client.delete_run(old)
        return run_id

    # reading ------------------------------------------------------------------------------------
    def records(self, sweep: str) -> list[dict[str, Any]]:
        """Results of the sweep's current grid (not of trials an edited grid superseded)."""
        return [json.loads(t["result_json"]) for t in self.ledger.trials(sweep)
                if t["result_json"] and t["status"] != "superseded"]

    def sweep_names(self) -> list[str]:
        return self.ledger.sweep_names() if self.ledger.has_schema() else []


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
