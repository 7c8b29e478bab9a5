"""Mending a damaged store: one of its two SQLite files rebuilt from the other, on the user's request.

The ledger is the source of truth and MLflow its mirror, but each holds every recorded result: a trial's
MLflow run stores its whole result record (`result.json`), and the ledger row stores the same record.
So a damaged `ledger.db` is rebuilt from the runs (`rebuild_ledger`), and a damaged or lost `mlflow.db`
from the ledger (`rebuild_mirror`). Nothing is deleted: the damaged file is renamed beside it
(`ledger.db.damaged-20250101T120000`), with its `-wal` and `-shm` files. Both run under the lock drivers
take to open the store; drivers that are still running must be stopped first (a running driver keeps
writing into the file it opened).

What a rebuilt ledger does not have: trials that had no result yet (pending, running) and leases; the
next `sweep run` adds the grid's missing trials as pending, as for a new grid.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from storage.errors import StoreError, translated
from storage.ledger import Ledger, file_lock, sqlite_damage
from storage.location import StoreLocation, sqlite_path
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


@dataclasses.dataclass(frozen=True)
class Rebuilt:
    """What a rebuild wrote: sweeps and trials (by status), and where the damaged file was kept."""

    sweeps: int
    trials: dict[str, int]
    kept: Path | None

    def summary(self, what: str) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.trials.items())) or "no trials"
        kept = f"; the old file is kept as {self.kept}" if self.kept is not None else ""
        return f"rebuilt {what}: {self.sweeps} sweep(s), {counts}{kept}"


def check(location: StoreLocation) -> dict[Path, str | None]:
    """`PRAGMA quick_check` of each SQLite file of the store: its first problem, or None when it is sound."""
    files = [p for p in dict.fromkeys((sqlite_path(location.ledger_uri), sqlite_path(location.tracking_uri)))
             if p is not None]
    with translated(location.display):
        return {p: (sqlite_damage(p) if p.is_file() and p.stat().st_size > 0 else
                    "missing" if not p.exists() else "empty (0 bytes)") for p in files}


def _files(location: StoreLocation, what: str) -> tuple[Path, Path]:
    ledger, tracking = sqlite_path(location.ledger_uri), sqlite_path(location.tracking_uri)
    if ledger is None or tracking is None:
        raise StoreError(f"rebuild-{what} works on SQLite stores (a folder, or --ledger sqlite:///...); on "
                         "PostgreSQL, restore the database from its backups")
    if ledger == tracking:
        raise StoreError(f"store {location.display} keeps the ledger and the MLflow runs in one file: neither "
                         "can be rebuilt from the other; restore the file from a backup")
    return ledger, tracking


def _set_aside(path: Path) -> Path | None:
    """Rename a damaged file (and its -wal/-shm) beside itself; None when there is no such file."""
    if not path.exists() and not path.is_symlink():
        return None
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    kept = path.with_name(f"{path.name}.damaged-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        src = path.with_name(path.name + suffix)
        if src.exists() or src.is_symlink():
            os.replace(src, kept.with_name(kept.name + suffix))
    return kept


def _ledger_id_of(path: Path) -> str | None:
    """The identity a damaged ledger recorded, when that much of it still reads."""
    try:
        ledger = Ledger(f"sqlite:///{path}", read_only=True)
        try:
            return ledger.meta_value("ledger_id")
        finally:
            ledger.engine.dispose()
    except Exception:  # noqa: BLE001 - a damaged file may fail in any way; the experiments' tags tell instead
        return None


def rebuild_ledger(location: StoreLocation, *, force: bool = False) -> Rebuilt:
    """A new ledger from the MLflow runs of this ledger's sweeps: each sweep (its identity, experiment
    and grid file from its parent run) and each trial with a complete run (its result record, status and
    run). Refused while the ledger is sound (unless `force`) or MLflow is damaged too."""
    path, tracking = _files(location, "ledger")
    with translated(location.display), file_lock(path):
        if tracking.is_file() and (problem := sqlite_damage(tracking)):
            raise StoreError(f"{tracking} is damaged too ({problem[:120]}): the ledger cannot be rebuilt from it; "
                             "restore one of the two files from a backup")
        if not tracking.is_file():
            raise StoreError(f"{tracking} is missing: the ledger cannot be rebuilt without it")
        sound = path.is_file() and path.stat().st_size > 0 and sqlite_damage(path) is None
        if sound and not force:
            raise StoreError(f"{path} passes SQLite's integrity check: nothing to rebuild (pass --force to "
                             "rebuild it from MLflow anyway, losing its pending trials and leases)")
        sink = MlflowSink(location.tracking_uri, location.display, writer=True)
        experiments = _experiments(sink, _ledger_id_of(path) if path.exists() else None)
        kept = _set_aside(path)
        ledger = Ledger(location.ledger_uri, create=True)
        try:
            ledger_id = experiments[0].tags[LEDGER_ID_TAG] if experiments else None
            if ledger_id:
                ledger.ensure_meta("ledger_id", ledger_id)
            counts: dict[str, int] = {}
            for exp in experiments:
                for status in _rebuild_sweep(ledger, sink, exp):
                    counts[status] = counts.get(status, 0) + 1
        finally:
            ledger.engine.dispose()
            sink.close()
    return Rebuilt(len(experiments), counts, kept)


def _experiments(sink: MlflowSink, ledger_id: str | None) -> list[Any]:
    """The privbench sweeps' experiments of one ledger: `ledger_id` when the damaged ledger still says it,
    else the only ledger the store's experiments name (several: the user must say which)."""
    from mlflow.entities import ViewType

    found = [e for e in sink.client.search_experiments(view_type=ViewType.ALL, max_results=50_000)
             if (e.tags or {}).get(KIND_TAG) == "sweep" and (e.tags or {}).get(SWEEP_ID_TAG)]
    ids = sorted({e.tags.get(LEDGER_ID_TAG, "") for e in found})
    if ledger_id is None and len(ids) > 1:
        raise StoreError(f"the MLflow experiments here belong to {len(ids)} ledgers ({', '.join(ids[:4])}): the "
                         "damaged ledger does not say which was its own; restore it from a backup")
    return [e for e in found if ledger_id is None or e.tags.get(LEDGER_ID_TAG) == ledger_id]


def _rebuild_sweep(ledger: Ledger, sink: MlflowSink, exp: Any) -> list[str]:
    """One sweep's ledger rows from its experiment; returns the statuses of the trials restored."""
    runs = sink.runs(exp.experiment_id)
    parent = next((r for r in runs if r.data.tags.get(SWEEP_RUN_TAG) == "true"
                   and r.info.lifecycle_stage != "deleted"), None)
    grid_yaml = (sink.read_text(parent.info.run_id, "grid.yaml") or "") if parent is not None else ""
    sweep_id = exp.tags[SWEEP_ID_TAG]
    ledger.create_sweep(exp.name, sweep_id, exp.experiment_id, grid_yaml)
    best: dict[str, Any] = {}
    for run in runs:
        tags = run.data.tags
        if run.info.lifecycle_stage == "deleted" or tags.get(SWEEP_RUN_TAG) == "true" \
                or tags.get(RECORDED_TAG) != "true" or tags.get(SWEEP_ID_TAG) != sweep_id:
            continue
        key = tags.get(TRIAL_KEY_TAG)
        rank = (tags.get("status") == "finished", run.info.start_time or 0)
        if key and (key not in best or rank > best[key][0]):
            best[key] = (rank, run)
    statuses = []
    for key, (_, run) in best.items():
        record = sink.read_record(run.info.run_id)
        if record is None or record.get("trial_key") != key or record.get("status") not in ("finished", "failed"):
            continue
        record = {**record, "sweep": exp.name}
        status = "superseded" if run.data.tags.get(SUPERSEDED_TAG) == "true" else record["status"]
        ledger.restore(exp.name, record, run.info.run_id, status)
        statuses.append(status)
    return statuses


def rebuild_mirror(location: StoreLocation) -> Rebuilt:
    """A new MLflow database from the ledger: each sweep's experiment (with its identity), its parent run
    with the grid file, and one run per recorded trial written from the ledger's result record."""
    path, tracking = _files(location, "mirror")
    with translated(location.display), file_lock(path):
        if not path.is_file() or (problem := sqlite_damage(path)):
            raise StoreError(f"{path} is damaged or missing ({problem if path.is_file() else 'missing'}): the "
                             "MLflow runs cannot be rebuilt from it; rebuild the ledger from them instead")
        kept = _set_aside(tracking)
        ledger = Ledger(location.ledger_uri)
        sink = MlflowSink(location.tracking_uri, location.display, writer=True)
        try:
            ledger.migrate()
            sink.connect(new_file=True)
            ledger_id = ledger.ledger_id()
            counts: dict[str, int] = {}
            names = ledger.sweep_names()
            for name in names:
                row = ledger.sweep(name) or {}
                artifacts = f"{location.artifact_root.rstrip('/')}/{name}" if location.artifact_root else None
                experiment_id = sink.create_experiment(name, artifacts, row["sweep_id"], ledger_id)
                if experiment_id is None:
                    raise StoreError(f"MLflow already has an experiment {name!r}: the mirror was not rebuilt")
                ledger.update_sweep(name, experiment_id=experiment_id)
                sink.sweep_run(name, experiment_id, row.get("grid_yaml") or "")
                for t in ledger.trials(name):
                    if not t["result_json"] or t["status"] not in ("finished", "failed", "superseded"):
                        continue
                    run_id = sink.write_run(ledger.loads(t, "result_json"), experiment_id, row["sweep_id"])
                    ledger.set_run_id(name, t["trial_key"], run_id)
                    if t["status"] == "superseded":
                        sink.tag_quietly(run_id, SUPERSEDED_TAG, "true")
                    counts[t["status"]] = counts.get(t["status"], 0) + 1
        finally:
            ledger.engine.dispose()
            sink.close()
    return Rebuilt(len(names), counts, kept)


__all__ = ["Rebuilt", "check", "rebuild_ledger", "rebuild_mirror"]
