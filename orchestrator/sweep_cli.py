"""`privbench sweep run|status|list`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from orchestrator import cluster, grid
from orchestrator.console import err, fail, out

app = typer.Typer(help="Run and inspect sweeps.", no_args_is_help=True)

STORE_HELP = ("Folder, postgresql:// URI or http(s):// MLflow server "
              "(default ./privbench-store or $PRIVBENCH_STORE).")
StoreOpt = Annotated[str | None, typer.Option("--store", help=STORE_HELP)]


def _label(cfg: dict[str, Any]) -> str:
    eps = f" eps={cfg['epsilon']:g}" if cfg.get("epsilon") is not None else ""
    return f"{cfg['mechanism']} {cfg['dataset']}/{cfg['model']}{eps} seed={cfg['seed']}"


@app.command("run")
def run(
    grid_file: Annotated[Path, typer.Argument(help="Grid YAML file.")],
    store: StoreOpt = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster: auto, ray://host:10001 or host:port "
                                                     "(default: start a local Ray instance).")] = None,
    max_concurrent: Annotated[int | None, typer.Option(min=1, help="Trials in flight at once "
                                                                   "(default: cluster CPUs / cpus per trial).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the trials and exit.")] = False,
    retries: Annotated[int, typer.Option(min=0, help="Retries of a failed trial within this run.")] = 0,
) -> None:
    """Run every trial of GRID_FILE that the ledger does not already mark finished."""
    from storage.location import resolve

    try:
        spec = grid.load(grid_file)
        location = resolve(store)
    except grid.GridError as e:
        for problem in e.problems:
            err.print(f"[bold red]error:[/] {problem}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None
    except ValueError as e:
        fail(str(e))
    if dry_run:
        table = Table(title=f"sweep {spec.name}: {len(spec.trials)} trials")
        for col in ("trial_key", "dataset", "model", "mechanism", "epsilon", "seed"):
            table.add_column(col)
        for t in spec.trials:
            table.add_row(t["trial_key"], t["dataset"], t["model"], t["mechanism"],
                          "-" if t["epsilon"] is None else f"{t['epsilon']:g}", str(t["seed"]))
        out.print(table)
        return
    try:
        resources = cluster.connect(address)
    except Exception as e:  # noqa: BLE001 - any connection failure is a usage problem here
        fail(f"cannot connect to Ray at {address or 'a new local instance'}: {e}".splitlines()[0])
    problems = cluster.resource_problems(list(spec.trials), resources)
    if problems:
        for p in problems:
            err.print(f"[bold red]error:[/] {p}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2)

    from storage.store import Store

    st = Store(location, create=True)  # schema and experiment exist before any trial starts
    st.open_sweep(spec.name, spec.text, spec.trials)
    todo = sorted(st.pending(spec.name), key=lambda c: c["mechanism"] == "nonprivate")  # long trials first
    finished_before = len(spec.trials) - len(todo)
    for cfg in todo:
        cfg["resources"] = cfg["resources"] | {"gpus": cluster.gpus_for(cfg["resources"]["gpus"],
                                                                        resources.get("GPU", 0.0))}
    per_trial = max((float(c["resources"]["cpus"]) for c in todo), default=1.0)
    limit = max_concurrent or max(1, int(resources.get("CPU", 1) // per_trial))
    err.print(f"sweep [bold]{spec.name}[/]: {len(spec.trials)} trials, {finished_before} already finished, "
              f"{len(todo)} to run, up to {limit} at once; store {location.folder or location.tracking_uri}")
    failures: list[dict[str, Any]] = []
    if todo:
        failures = _run_with_progress(st, spec.name, todo, limit, retries)
    counts = st.ledger.status_counts(spec.name)
    err.print(f"sweep [bold]{spec.name}[/]: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    _log_sweep_summary(st, spec.name)
    if failures:
        err.print(f"[bold red]{len(failures)} trial(s) failed:[/]")
        for rec in failures:
            err.print(f"  {rec['trial_key']} {_label(rec['config'])}: {rec['error']}", highlight=False,
                      soft_wrap=True)
        raise typer.Exit(code=1)


def _log_sweep_summary(st: Any, sweep: str) -> None:
    """Leaderboard and figures onto the sweep's parent MLflow run (matplotlib is imported only here)."""
    from dashboards.summary import sweep_files

    try:
        st.log_sweep_files(sweep, sweep_files(st.records(sweep)))
    except Exception as e:  # noqa: BLE001 - the trials are recorded; a summary problem must not fail the sweep
        err.print(f"[yellow]warning:[/] could not store the sweep summary: {e}", highlight=False, soft_wrap=True)


def _run_with_progress(st: Any, sweep: str, todo: list[dict[str, Any]], limit: int,
                       retries: int) -> list[dict[str, Any]]:
    from orchestrator.submit import run_all

    failures: list[dict[str, Any]] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=err, transient=False) as progress:
        overall = progress.add_task(f"[bold]{sweep}", total=len(todo), info="")
        bars: dict[str, Any] = {}
        labels = {c["trial_key"]: _label(c) for c in todo}
        recorded: set[str] = set()

        def on_start(cfg: dict[str, Any]) -> None:
            st.mark_running(sweep, cfg["trial_key"])
            if cfg["trial_key"] not in bars:
                bars[cfg["trial_key"]] = progress.add_task(labels[cfg["trial_key"]], total=None, info="starting")

        def on_progress(state: dict[str, tuple[int, int, dict[str, Any]]]) -> None:
            for key, (done, total, info) in state.items():
                if key in bars and key not in recorded:
                    progress.update(bars[key], completed=done, total=total,
                                    info=f"epoch {info.get('epoch')} loss {info.get('loss', 0):.3f}")

        def on_result(record: dict[str, Any]) -> None:
            st.record(record)
            key = record["trial_key"]
            recorded.add(key)
            if record["status"] == "finished":
                acc = (record.get("metrics") or {}).get("accuracy")
                eps = (record.get("privacy") or {}).get("epsilon_certified")
                info = "[green]done[/]" + (f" acc {acc:.4f}" if acc is not None else "") + (
                    f" eps {eps:.3g}" if eps is not None else "")
            else:
                failures.append(record)
                info = f"[red]failed[/] {record['error'][:60]}"
            task = bars.get(key)
            if task is not None:
                total = progress.tasks[task].total or 1
                progress.update(task, completed=total, total=total, info=info)
            progress.advance(overall)

        run_all(todo, max_concurrent=limit, retries=retries, on_start=on_start, on_result=on_result,
                on_progress=on_progress)
    return failures


def _open_store(store: str | None) -> Any:
    from storage.store import Store

    try:
        return Store(store)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))


@app.command("list")
def list_sweeps(store: StoreOpt = None,
                as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False) -> None:
    """List the sweeps in the store with their trial counts."""
    st = _open_store(store)
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
           store: StoreOpt = None,
           as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False) -> None:
    """Show every trial of a sweep with its status, accuracy and error."""
    st = _open_store(store)
    name = resolve_sweep(st, sweep)
    trials = st.ledger.trials(name)
    rows = []
    for t in trials:
        rec = json.loads(t["result_json"]) if t["result_json"] else {}
        rows.append({"trial_key": t["trial_key"], "status": t["status"], "dataset": t["dataset"],
                     "model": t["model"], "mechanism": t["mechanism"], "epsilon": t["epsilon"], "seed": t["seed"],
                     "attempts": t["attempts"], "run_id": t["run_id"],
                     "accuracy": (rec.get("metrics") or {}).get("accuracy"), "error": t["error"]})
    if as_json:
        print(json.dumps({"sweep": name, "counts": st.ledger.status_counts(name), "trials": rows}))
        return
    table = Table(title=f"sweep {name}")
    for col in ("trial_key", "status", "mechanism", "dataset", "model", "epsilon", "seed", "accuracy", "error"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["trial_key"], r["status"], r["mechanism"], r["dataset"], r["model"],
                      "-" if r["epsilon"] is None else f"{r['epsilon']:g}", str(r["seed"]),
                      "-" if r["accuracy"] is None else f"{r['accuracy']:.4f}", (r["error"] or "")[:80])
    out.print(table)
