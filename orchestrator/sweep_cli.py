"""`privbench sweep run|status|list`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from orchestrator.console import err, fail, out

app = typer.Typer(help="Run and inspect sweeps.", no_args_is_help=True)

STORE_HELP = ("Folder, postgresql:// URI or http(s):// MLflow server "
              "(default ./privbench-store or $PRIVBENCH_STORE).")
StoreOpt = Annotated[str | None, typer.Option("--store", help=STORE_HELP)]
LEDGER_HELP = ("Database URI of the sweep ledger (default: inside the store; for an http(s):// server, a "
               "per-user file). A team sharing a tracking server shares one ledger database "
               "($PRIVBENCH_LEDGER).")
LedgerOpt = Annotated[str | None, typer.Option("--ledger", help=LEDGER_HELP)]
ARTIFACTS_HELP = ("Artifact root for new sweeps (folder or URI; default: next to the store, or what the "
                  "tracking server decides; $PRIVBENCH_ARTIFACTS).")
ArtifactsOpt = Annotated[str | None, typer.Option("--artifacts", help=ARTIFACTS_HELP)]


def _label(cfg: dict[str, Any]) -> str:
    eps = f" eps={cfg['epsilon']:g}" if cfg.get("epsilon") is not None else ""
    return f"{cfg['mechanism']} {cfg['dataset']}/{cfg['model']}{eps} seed={cfg['seed']}"


def locate(store: str | None, ledger: str | None = None, artifacts: str | None = None) -> Any:
    from storage.errors import StoreError
    from storage.location import resolve

    try:
        return resolve(store, ledger=ledger, artifacts=artifacts)
    except StoreError as e:
        fail(str(e))


@app.command("run")
def run(
    grid_file: Annotated[Path, typer.Argument(help="Grid YAML file.")],
    store: StoreOpt = None,
    ledger: LedgerOpt = None,
    artifacts: ArtifactsOpt = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster: auto, ray://host:10001 or host:port "
                                                     "(default: start a local Ray instance).")] = None,
    max_concurrent: Annotated[int | None, typer.Option(min=1, help="Trials in flight at once "
                                                                   "(default: cluster CPUs / cpus per trial).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the trials and exit.")] = False,
    retries: Annotated[int, typer.Option(min=0, help="Retries of a failed trial within this run.")] = 0,
    steal_leases: Annotated[bool, typer.Option(
        "--steal-leases", help="Take over the trials other drivers hold leases on (for a driver you know is "
                               "dead on another machine; a live one loses its results for them).")] = False,
    reconcile: Annotated[bool, typer.Option(
        "--reconcile", help="Check MLflow against the ledger even when every trial is finished (a rerun "
                            "with nothing to do reads only the ledger).")] = False,
) -> None:
    """Run every trial of GRID_FILE that the ledger does not already mark finished.

    Several drivers (terminals, people sharing a store) can run the same grid at once: each trial is
    leased by one driver, and a driver that dies gives its trials back when its lease expires.
    """
    from orchestrator import grid
    from storage.errors import StoreError

    try:
        spec = grid.load(grid_file)
    except grid.GridError as e:
        for problem in e.problems:
            err.print(f"[bold red]error:[/] {problem}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None
    location = locate(store, ledger, artifacts)
    if dry_run:
        table = Table(title=f"sweep {spec.name}: {len(spec.trials)} trials")
        for col in ("trial_key", "dataset", "model", "mechanism", "epsilon", "seed"):
            table.add_column(col)
        for t in spec.trials:
            table.add_row(t.trial_key, t.dataset, t.model, t.mechanism,
                          "-" if t.epsilon is None else f"{t.epsilon:g}", str(t.seed))
        out.print(table)
        return
    from storage.store import Store, preflight

    with store_errors(location.display):
        present = location.exists()
    if present and location.kind == "folder":  # a damaged store is reported before Ray starts
        _open_store(location).close()
    if not (steal_leases or reconcile):
        _exit_if_nothing_to_do(location, spec)
    try:
        preflight(location, spec.name)  # nothing is created before the server answers and the sweep is ours
    except StoreError as e:
        fail(str(e))
    from orchestrator import cluster

    try:
        resources = cluster.connect(address, spec.plugins)
    except cluster.ClusterError as e:
        fail(str(e))
    problems = cluster.resource_problems(list(spec.trials), resources)
    if problems:
        for p in problems:
            err.print(f"[bold red]error:[/] {p}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2)

    try:
        st = Store(location, create=True)  # schema and experiment exist before any trial starts
        st.open_sweep(spec.name, spec.text, [t.to_dict() for t in spec.trials], key_of=grid.stored_key)
        if steal_leases:
            st.ledger.release(spec.name, owner=None)
        by_key = {t.trial_key: t for t in spec.trials}  # the grid's current settings (e.g. resources)
        todo = [by_key[c["trial_key"]] for c in st.pending(spec.name) if c["trial_key"] in by_key]
    except StoreError as e:
        fail(str(e))
    todo.sort(key=lambda c: not grid.mechanism_private(c.mechanism))  # long (private) trials first
    finished_before = len(spec.trials) - len(todo)
    memory = {}
    if resources.get("GPU", 0.0) >= 1 and any(c.resources.gpus == "auto" for c in todo):
        from orchestrator.submit import measure_memory  # `gpus: auto` packs trials by their measured memory

        memory = measure_memory([c for c in todo if c.resources.gpus == "auto"], 1.0)
    todo = cluster.resolve_gpus(todo, resources.get("GPU", 0.0), memory)
    per_trial = max((float(c.resources.cpus) for c in todo), default=1.0)
    limit = max_concurrent or max(1, int(resources.get("CPU", 1) // per_trial))
    err.print(f"sweep [bold]{spec.name}[/]: {len(spec.trials)} trials, {finished_before} already finished, "
              f"{len(todo)} to run, up to {limit} at once; store {location.display}", highlight=False)
    failures: list[dict[str, Any]] = []
    try:
        if todo:
            failures = _run_with_progress(st, spec.name, todo, limit, retries)
        counts = st.ledger.status_counts(spec.name)
        st.check_intact()
    except StoreError as e:  # the store failed mid-sweep: what was recorded is kept, a rerun resumes
        fail(str(e), code=1)
    finally:
        try:
            st.release(spec.name)
        except StoreError:
            pass
    err.print(f"sweep [bold]{spec.name}[/]: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    _log_sweep_summary(st, spec.name)
    unrun = sum(n for s, n in counts.items() if s in ("pending", "running"))
    if unrun:
        with store_errors(st.where):
            leases, alive = _watch_leases(st, spec.name)
        if not alive:
            fail(_not_run_message(spec.name, unrun, leases), code=1)
        owners = ", ".join(sorted({owner for owner, _ in leases})[:3])
        err.print(f"sweep [bold]{spec.name}[/]: {unrun} trial(s) are being run by another driver ({owners}), "
                  "which records them", highlight=False)
    if failures:
        err.print(f"[bold red]{len(failures)} trial(s) failed:[/]")
        for rec in failures:
            err.print(f"  {rec['trial_key']} {_label(rec['config'])}: {rec['error']}", highlight=False,
                      soft_wrap=True)
        raise typer.Exit(code=1)


def _not_run_message(sweep: str, count: int, leases: list[tuple[str, float]]) -> str:
    """Why trials of a finished `sweep run` were not run, and when they can be."""
    import time

    if not leases:
        return f"sweep {sweep}: {count} trial(s) not run; run the sweep again"
    wait = max(0.0, max(expires for _, expires in leases) - time.time())
    owners = sorted({owner for owner, _ in leases})
    return (f"sweep {sweep}: {count} trial(s) not run: leased by {len(owners)} other driver(s) "
            f"({', '.join(owners[:3])}) whose leases lapse in {wait:.0f} s unless renewed; run again then, "
            "or pass --steal-leases if that driver is dead")


def _watch_leases(st: Any, sweep: str) -> tuple[list[tuple[str, float]], bool]:
    """The other drivers' leases on the trials this driver could not run, and whether those drivers are
    alive: each renews its leases every third of their lifetime, so one such period tells (a driver on
    this host whose process is gone is dead at once)."""
    import time

    from storage.ledger import lease_seconds, owner_dead

    def unfinished() -> dict[str, tuple[str | None, float | None]]:
        return {t["trial_key"]: (t["lease_owner"], t["lease_expires"]) for t in st.ledger.trials(sweep)
                if t["status"] in ("pending", "running")}

    first = unfinished()
    if not first:  # the other driver recorded them meanwhile
        return [], True
    now = time.time()
    held = [(owner, expires) for owner, expires in first.values() if owner and (expires or 0) >= now]
    if len(held) < len(first) or any(owner_dead(owner) for owner, _ in held):
        return held, False  # a trial nobody holds, or a dead holder: this driver's rerun takes them
    deadline = time.monotonic() + lease_seconds() / 3 + 2
    while time.monotonic() < deadline:
        time.sleep(0.5)  # poll interval: the other driver's renewal or record shows in the ledger
        later = unfinished()
        if all(key not in later or (later[key][1] or 0) > (expires or 0) for key, (_, expires) in first.items()):
            return st.ledger.leases(sweep), True
    return st.ledger.leases(sweep), False


def _exit_if_nothing_to_do(location: Any, spec: Any) -> None:
    """A rerun whose trials are all finished ends here: from the ledger alone, read-only, without starting
    Ray or opening MLflow (a no-op rerun is a second, not half a minute)."""
    from storage.ledger import Ledger

    try:
        ledger = Ledger(location.ledger_uri, read_only=True)
        try:
            if not ledger.has_schema():
                return
            row = ledger.sweep(spec.name)
            trials = ledger.trials(spec.name)
        finally:
            ledger.engine.dispose()
    except Exception:  # noqa: BLE001 - whatever it is, the full path below reports it properly
        return
    if row is None or row["grid_yaml"] != spec.text or not row["experiment_id"]:
        return  # a new or edited grid: the full path syncs the ledger
    live = {t["trial_key"]: t for t in trials if t["status"] != "superseded"}
    if set(live) != {t.trial_key for t in spec.trials}:
        return
    if all(t["status"] == "finished" for t in live.values()):
        err.print(f"sweep [bold]{spec.name}[/]: {len(live)} trials, {len(live)} already finished, 0 to run; "
                  f"nothing to do (store {location.display})", highlight=False)
        raise typer.Exit(code=0)


def _log_sweep_summary(st: Any, sweep: str) -> None:
    """Leaderboard and figures onto the sweep's parent MLflow run (matplotlib is imported only here)."""
    from dashboards.summary import sweep_files

    try:
        st.log_sweep_files(sweep, sweep_files(st.records(sweep)))
    except Exception as e:  # noqa: BLE001 - the trials are recorded; a summary problem must not fail the sweep
        err.print(f"[yellow]warning:[/] could not store the sweep summary: {e}", highlight=False, soft_wrap=True)


def _run_with_progress(st: Any, sweep: str, todo: list[Any], limit: int,
                       retries: int) -> list[dict[str, Any]]:
    """Bars for the trials in flight only (a finished trial becomes one printed line), so that drawing
    costs the same at 60 trials as at 1,000."""
    from orchestrator.submit import run_all
    from storage.faults import fault

    failures: list[dict[str, Any]] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=err, transient=False) as progress:
        overall = progress.add_task(f"[bold]{sweep}", total=len(todo), info="")
        bars: dict[str, Any] = {}
        skipped: list[str] = []

        def on_start(cfg: Any) -> bool:
            key = cfg.trial_key
            if not st.claim(sweep, key):  # another driver runs it (or just finished it)
                skipped.append(key)
                progress.update(overall, total=len(todo) - len(skipped))
                return False
            fault("after_claim")
            if key not in bars:
                bars[key] = progress.add_task(cfg.label, total=None, info="starting")
            return True

        def on_progress(state: dict[str, tuple[int, int, dict[str, Any]]]) -> None:
            for key, (done, total, info) in state.items():
                if key in bars:
                    progress.update(bars[key], completed=done, total=total,
                                    info=f"epoch {info.get('epoch')} loss {info.get('loss', 0):.3f}")

        def on_result(record: dict[str, Any]) -> None:
            key = record["trial_key"]
            run_id = st.record(record)
            if run_id is None:
                info = "[yellow]taken over by another driver[/]"
            elif record["status"] == "finished":
                acc = (record.get("metrics") or {}).get("accuracy")
                eps = (record.get("privacy") or {}).get("epsilon_certified")
                info = "[green]done[/]" + (f" acc {acc:.4f}" if acc is not None else "") + (
                    f" eps {eps:.3g}" if eps is not None else "")
            else:
                failures.append(record)
                info = f"[red]failed[/] {(record.get('error') or '')[:60]}"
            task = bars.pop(key, None)
            if task is not None:
                progress.remove_task(task)
            progress.console.print(f"  {_label(record['config'])}: {info}", highlight=False, soft_wrap=True)
            progress.advance(overall)

        def load_phase(cfg: Any) -> dict[str, Any] | None:
            stored = st.ledger.phase(sweep, cfg.trial_key)
            if stored is None:
                return None
            output = json.loads(stored)
            output["environment"]["accelerator_restored"] = True  # trained by an earlier driver
            return output

        def save_phase(cfg: Any, output: dict[str, Any]) -> None:
            st.ledger.save_phase(sweep, cfg.trial_key, st.owner, json.dumps(output))
            fault("after_phase_saved")

        run_all(todo, max_concurrent=limit, retries=retries, on_start=on_start, on_result=on_result,
                on_progress=on_progress, on_tick=lambda: st.heartbeat(sweep), load_phase=load_phase,
                save_phase=save_phase)
    if skipped:
        err.print(f"{len(skipped)} trial(s) were run by another driver at the same time")
    return failures


@contextlib.contextmanager
def store_errors(where: str = "store") -> Iterator[None]:
    """A damaged, missing or unreachable store: one line and exit 2 instead of a traceback."""
    from storage.errors import StoreError, translated

    try:
        with translated(where):
            yield
    except StoreError as e:
        fail(str(e))


def not_into_store(out_file: Path | None, st: Any) -> None:
    """An output file must not overwrite the store's own files (`--out STORE/ledger.db` would destroy
    the ledger: privbench never deletes data it did not create)."""
    from storage.location import sqlite_path

    if out_file is None:
        return
    target = Path(out_file).expanduser().resolve()
    own = {sqlite_path(st.location.ledger_uri), sqlite_path(st.location.tracking_uri)} - {None}
    folder = st.location.folder
    if target in {p.resolve() for p in own} or (folder is not None and folder.resolve() in target.parents
                                                 and target.name.startswith(("ledger.db", "mlflow.db"))):
        fail(f"--out {out_file} is a file of the store itself; write the output elsewhere")


def _open_store(store: Any, ledger: str | None = None) -> Any:
    """Open a store for reading: read-only, nothing created or changed (MLflow is not even opened)."""
    from storage.location import StoreLocation
    from storage.store import Store

    location = store if isinstance(store, StoreLocation) else locate(store, ledger)
    with store_errors(location.display):
        return Store(location)


@app.command("list")
def list_sweeps(store: StoreOpt = None, ledger: LedgerOpt = None,
                as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False) -> None:
    """List the sweeps in the store with their trial counts."""
    st = _open_store(store, ledger)
    with store_errors(st.where):
        rows = [{"sweep": n, "trials": st.ledger.status_counts(n)} for n in st.sweep_names()]
    if as_json:
        print(json.dumps({"sweeps": rows}))
        return
    table = Table(title="sweeps")
    for col in ("sweep", "finished", "failed", "pending", "running"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["sweep"], *(str(r["trials"].get(s, 0)) for s in ("finished", "failed", "pending", "running")))
    out.print(table)


def resolve_sweep(st: Any, sweep: str | None) -> str:
    with store_errors(st.where):
        names = st.sweep_names()
    if sweep is None:
        if not names:
            fail("the store has no sweeps yet; run `privbench sweep run GRID.yaml` first")
        return names[0]
    if sweep not in names:
        fail(f"unknown sweep {sweep!r}; known: {', '.join(names) or 'none'}")
    return sweep


@app.command("status")
def status(sweep: Annotated[str | None, typer.Argument(help="Sweep name (default: the latest).")] = None,
           store: StoreOpt = None, ledger: LedgerOpt = None,
           as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False) -> None:
    """Show every trial of a sweep with its status, accuracy and error (reads the ledger, writes nothing)."""
    st = _open_store(store, ledger)
    name = resolve_sweep(st, sweep)
    with store_errors(st.where):
        trials = st.ledger.trials(name)
        counts = st.ledger.status_counts(name)
        results = [st.ledger.loads(t, "result_json") if t["result_json"] else {} for t in trials]
    rows = []
    for t, rec in zip(trials, results, strict=True):
        rows.append({"trial_key": t["trial_key"], "status": t["status"], "dataset": t["dataset"],
                     "model": t["model"], "mechanism": t["mechanism"], "epsilon": t["epsilon"], "seed": t["seed"],
                     "attempts": t["attempts"], "run_id": t["run_id"],
                     "accuracy": (rec.get("metrics") or {}).get("accuracy"), "error": t["error"]})
    if as_json:
        print(json.dumps({"sweep": name, "counts": counts, "trials": rows}))
        return
    table = Table(title=f"sweep {name}")
    for col in ("trial_key", "status", "mechanism", "dataset", "model", "epsilon", "seed", "accuracy", "error"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["trial_key"], r["status"], r["mechanism"], r["dataset"], r["model"],
                      "-" if r["epsilon"] is None else f"{r['epsilon']:g}", str(r["seed"]),
                      "-" if r["accuracy"] is None else f"{r['accuracy']:.4f}", (r["error"] or "")[:80])
    out.print(table)
