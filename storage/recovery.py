"""Mending a damaged store: one of its two SQLite files rebuilt from the other, on the user's request.

The ledger is the source of truth and MLflow its mirror, but each holds every recorded result: a trial's
MLflow run stores its whole result record (`result.json`), and the ledger row stores the same record.
So a damaged `ledger.db` is rebuilt from the runs (`rebuild_ledger`), and a damaged or lost `mlflow.db`
from the ledger (`rebuild_mirror`). Nothing is deleted: the old file is kept beside it, named for why it
was replaced (`ledger.db.damaged-20250101T120000`, or `.replaced-...` for a sound file rebuilt with
`--force`), with its log. Each rebuild builds the new file beside the old one and renames it into place
when complete (`storage.files.replace_whole`): a rebuild killed at any moment leaves the old file or the
new one, and one that fails leaves the old file in place. Both refuse a sound file unless forced, and
judge "sound" as `store check` does (`check`). Both run under the lock drivers take to open the store;
drivers that are still running must be stopped first (a running driver keeps writing into the file it
opened).

What a rebuilt ledger does not have: trials that had no result yet (pending, running) and leases; the
next `sweep run` adds the grid's missing trials as pending, as for a new grid.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from storage import files
from storage.errors import StoreError, translated
from storage.faults import fault
from storage.ledger import Ledger, _sqlite_ro_connect, file_lock, ledger_row_damage, sqlite_damage
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
    _forget_store,
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


def problem_of(location: StoreLocation, path: Path, *, quick: bool = False) -> str | None:
    """What is wrong with one SQLite file of the store, as every command would find it, or None.

    The full check (`store check`, and what the rebuilds call sound): SQLite's `integrity_check`, the
    file's length against its header and its log's header, and for the ledger every row (JSON that
    parses, keys that match their index); a rebuilt MLflow database the ledger does not point at yet
    is unfinished. `quick`: SQLite's `quick_check` and the file checks only, for large stores."""
    if not path.exists() and not path.is_symlink():
        return "missing"
    if path.is_file() and path.stat().st_size == 0:
        return "empty (0 bytes)"
    ledger = sqlite_path(location.ledger_uri)
    if path != ledger and files.unfinished(path):
        return ("an interrupted rebuild-mirror left it unfinished: the ledger does not point at its runs yet "
                "(the old file is kept beside it)")
    problem = sqlite_damage(path, full=not quick)
    if problem is None and path == ledger and not quick:
        problem = ledger_row_damage(path)
    if problem is None and path != ledger:
        problem = foreign_tables(path)
    return problem


MLFLOW_TABLES = ("alembic_version", "experiments", "runs")
NOT_MLFLOW = "not an MLflow database"


def foreign_tables(path: Path) -> str | None:
    """What another program's SQLite database in MLflow's place holds, or None: a file with tables but not
    MLflow's would get MLflow's 66 tables created inside it by the next driver. A file with no tables yet is
    a new one (privbench makes MLflow's schema in it). Read-only."""
    with contextlib.closing(_sqlite_ro_connect(path)()) as conn:
        tables = sorted(r[0] for r in conn.execute("select name from sqlite_master where type = 'table'"))
    if not tables or set(MLFLOW_TABLES) <= set(tables):
        return None
    shown = ", ".join(tables[:4]) + (f" and {len(tables) - 4} more" if len(tables) > 4 else "")
    return f"{NOT_MLFLOW}: another program's SQLite file (its tables: {shown}), without MLflow's runs"


def check(location: StoreLocation, *, quick: bool = False) -> dict[Path, str | None]:
    """Each SQLite file of the store: its first problem (`problem_of`), or None when it is sound."""
    paths = [p for p in dict.fromkeys((sqlite_path(location.ledger_uri), sqlite_path(location.tracking_uri)))
             if p is not None]
    with translated(location.display):
        files.refuse_odd(paths, location.display)
        return {p: problem_of(location, p, quick=quick) for p in paths}


def _files(location: StoreLocation, what: str) -> tuple[Path, Path]:
    ledger, tracking = sqlite_path(location.ledger_uri), sqlite_path(location.tracking_uri)
    if ledger is None or tracking is None:
        raise StoreError(f"rebuild-{what} works on SQLite stores (a folder, or --ledger sqlite:///...); on "
                         "PostgreSQL, restore the database from its backups")
    if ledger == tracking:
        raise StoreError(f"store {location.display} keeps the ledger and the MLflow runs in one file: neither "
                         "can be rebuilt from the other; restore the file from a backup")
    files.refuse_odd((ledger, tracking), location.display, lock=ledger.with_name(ledger.name + ".lock"))
    return ledger, tracking


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


def mend_command(location: StoreLocation, path: Path, *, force: bool = False) -> str | None:
    """The command that mends the store file at `path` by rebuilding it from the other file (None: the
    store keeps both in one file, or on a database server, and only a backup mends it)."""
    tracking, ledger = sqlite_path(location.tracking_uri), sqlite_path(location.ledger_uri)
    if tracking is None or ledger is None or tracking == ledger or path not in (tracking, ledger):
        return None
    what = "rebuild-ledger" if path == ledger else "rebuild-mirror"
    own = location.folder is not None and ledger == location.folder / "ledger.db"
    ledger_opt = "" if own else f" --ledger {quote(location.ledger_uri)}"
    return f"privbench store {what} --store {quote(location.display)}{ledger_opt}{' --force' if force else ''}"


def quote(text: str) -> str:
    """A path as a shell would need it typed (`'my store'`), control characters escaped."""
    import shlex  # lazy: keeps the read commands light

    return shlex.quote(text)


def _refuse_sound(location: StoreLocation, path: Path, losing: str) -> StoreError:
    return StoreError(f"{path} passes privbench's integrity check (`privbench store check`): nothing to rebuild. "
                      f"`{mend_command(location, path, force=True)}` rebuilds it anyway ({losing}; the file is "
                      "kept beside the new one as .replaced-<time>)")


def rebuild_ledger(location: StoreLocation, *, force: bool = False) -> Rebuilt:
    """A new ledger from the MLflow runs of this ledger's sweeps: each sweep (its identity, experiment
    and grid file from its parent run) and each trial with a complete run (its result record, status and
    run). Refused while the ledger is sound (unless `force`) or MLflow is damaged too. Built as
    `ledger.db.rebuilding` and renamed into place when complete."""
    path, tracking = _files(location, "ledger")
    with translated(location.display), file_lock(path):
        if not tracking.is_file():
            raise StoreError(f"{tracking} is missing: the ledger cannot be rebuilt without it")
        if problem := problem_of(location, tracking, quick=True):
            raise StoreError(f"{tracking} is damaged too ({problem[:120]}): the ledger cannot be rebuilt from it; "
                             "restore one of the two files from a backup")
        sound = problem_of(location, path) is None
        if sound and not force:
            raise _refuse_sound(location, path, "its pending trials and leases are lost")
        sink = MlflowSink(location.tracking_uri, location.display, writer=False,
                          artifacts_folder=location.artifacts_folder)
        built = path.with_name(path.name + ".rebuilding")
        files.remove_leftovers(built)
        try:
            experiments = _experiments(sink, _ledger_id_of(path) if path.exists() else None)
            ledger = Ledger(f"sqlite:///{built}", create=True)
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
            files.seal(built)
            fault("rebuild_built")
            kept = files.replace_whole(path, built, "replaced" if sound else "damaged", sound=sound)
        except BaseException:
            files.remove_leftovers(built)  # a failed rebuild: the old file is still in place
            raise
        finally:
            sink.close()
    return Rebuilt(len(experiments), counts, kept)


def _experiments(sink: MlflowSink, ledger_id: str | None) -> list[Any]:
    """The privbench sweeps' experiments of one ledger: `ledger_id` when the damaged ledger still says it,
    else the only ledger the store's experiments name (several: the user must say which)."""
    from mlflow.entities import ViewType  # lazy: heavy (mlflow)

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
        fault("rebuild_row")
        statuses.append(status)
    return statuses


def rebuild_mirror(location: StoreLocation, *, force: bool = False) -> Rebuilt:
    """A new MLflow database from the ledger: each sweep's experiment (with its identity), its parent run
    with the grid file, and one run per recorded trial written from the ledger's result record. Refused
    while MLflow's file is sound (unless `force`: experiments and runs not made by privbench are then only
    in the file kept beside it). Built as `mlflow.db.rebuilding`, renamed into place when complete; the
    ledger is pointed at the new runs in one transaction after that, and until it is, the new file is
    marked unfinished (`storage.files.unfinished`): every check names it, and running this again mends it."""
    path, tracking = _files(location, "mirror")
    with translated(location.display), file_lock(path):
        if problem := problem_of(location, path):
            instead = ("MLflow's file is damaged too: restore one of the two files from a backup"
                       if not tracking.is_file() or problem_of(location, tracking, quick=True)
                       else f"`{mend_command(location, path)}` rebuilds the ledger from the MLflow runs instead")
            raise StoreError(f"{path} is damaged or missing ({problem[:120]}): the MLflow runs cannot be rebuilt "
                             f"from it; {instead}")
        mirror_problem = problem_of(location, tracking)
        sound = mirror_problem is None
        if sound and not force:
            raise _refuse_sound(location, tracking, "experiments and runs that privbench did not make are left "
                                                    "out of it")
        built = tracking.with_name(tracking.name + ".rebuilding")
        files.remove_leftovers(built)
        built_uri = f"sqlite:///{built}"
        ledger = Ledger(location.ledger_uri)
        sink = MlflowSink(built_uri, location.display, writer=True, artifacts_folder=location.artifacts_folder)
        try:
            ledger.migrate()
            sink.create_file(built)
            sink.connect(new_file=True)
            ledger_id = ledger.ledger_id()
            counts: dict[str, int] = {}
            names = ledger.sweep_names()
            experiments: dict[str, str] = {}
            runs: dict[tuple[str, str], str] = {}
            for name in names:
                row = ledger.sweep(name) or {}
                artifacts = f"{location.artifact_root.rstrip('/')}/{name}" if location.artifact_root else None
                experiment_id = sink.create_experiment(name, artifacts, row["sweep_id"], ledger_id)
                if experiment_id is None:
                    raise StoreError(f"two sweeps named {name!r} in the ledger: the mirror was not rebuilt")
                experiments[name] = experiment_id
                sink.sweep_run(name, experiment_id, row.get("grid_yaml") or "")
                for t in ledger.trials(name):
                    if not t["result_json"] or t["status"] not in ("finished", "failed", "superseded"):
                        continue
                    run_id = sink.write_run(ledger.loads(t, "result_json"), experiment_id, row["sweep_id"])
                    runs[(name, t["trial_key"])] = run_id
                    if t["status"] == "superseded":
                        sink.tag_quietly(run_id, SUPERSEDED_TAG, "true")
                    counts[t["status"]] = counts.get(t["status"], 0) + 1
                    fault("rebuild_row")
            sink.close()
            _forget_store(built_uri)
            files.seal(built)
            fault("rebuild_built")
            files.mark_unfinished(tracking, built)
            why = "replaced" if sound else "foreign" if mirror_problem.startswith(NOT_MLFLOW) else "damaged"
            kept = files.replace_whole(tracking, built, why, sound=sound)
            _forget_store(location.tracking_uri)  # this process's MLflow still has the old file open
            ledger.repoint(experiments, runs)
            fault("rebuild_repointed")
            files.finished(tracking)
        except BaseException:
            sink.close()
            _forget_store(built_uri)
            files.remove_leftovers(built)  # a failed rebuild: the old file is still in place
            raise
        finally:
            ledger.engine.dispose()
    return Rebuilt(len(names), counts, kept)


__all__ = ["Rebuilt", "check", "problem_of", "rebuild_ledger", "rebuild_mirror"]
