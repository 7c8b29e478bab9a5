"""`privbench sweep run|status|list`."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from orchestrator import runner
from orchestrator.console import err, error, fail, out, styled, visible, warning
from orchestrator.runner import Callback, SweepError, SweepSummary, trial_rows
from orchestrator.runner import locate as resolve

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


def _numbers(record: dict[str, Any]) -> str:
    """A finished trial's accuracy and certified epsilon as the leaderboard writes them (the schema's one
    format per quantity: accuracy in %, ` acc 76.0%`, never the fraction 0.7604; epsilon rounded up)."""
    from storage import schema  # lazy: keeps privbench --help light

    acc = (record.get("metrics") or {}).get("accuracy")
    eps = (record.get("privacy") or {}).get("epsilon_certified")
    return ((f" acc {schema.shown(acc, schema.utility_field('accuracy'))}%" if acc is not None else "")
            + (f" eps {schema.shown(eps, schema.field('privacy', 'epsilon_certified'))}" if eps is not None else ""))


def locate(store: str | None, ledger: str | None = None, artifacts: str | None = None) -> Any:
    try:
        return resolve(store, ledger, artifacts)
    except SweepError as e:
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
    only: Annotated[list[str] | None, typer.Option(
        "--only", metavar="AXIS=VALUE",
        help="Run only the trials with this dataset, model, mechanism, epsilon or seed (repeat it: values of one "
             "axis are alternatives, axes combine). The sweep stays the whole grid's, so a long grid runs in "
             "parts, one after another or side by side, without one part superseding another.")] = None,
) -> None:
    """Run every trial of GRID_FILE that the ledger does not already mark finished.

    Several drivers (terminals, people sharing a store) can run the same grid at once: each trial is
    leased by one driver, and a driver that dies gives its trials back when its lease expires. A sweep
    name belongs to one grid at a time: a driver with another grid under a running sweep's name exits 2.

    A grid with `plugins:` is code: its modules are imported while the grid is read, --dry-run included.
    SIGTERM and Ctrl-C stop after recording what arrived (exit 143 and 130).
    """
    if dry_run and not only:
        _dry_run(grid_file, store, ledger, artifacts)
        return
    try:
        spec = runner.load_grid(grid_file)
        location = runner.locate(store, ledger, artifacts)
        selected = runner.select(spec, only or ())
        if dry_run:
            _list_trials(f"sweep {spec.name}: {len(spec.trials):,} trials ({len(selected):,} selected by --only)",
                         len(selected), iter(selected))
            return
        if getattr(spec.trials, "lazy", False):  # a large grid: say so before the passes over it (minutes at 10^6)
            err.print(styled("sweep [bold]{name}[/]: {n} trials; opening them in the store (each is made twice, about "
                             "0.1 ms apiece), then running those not finished", name=spec.name,
                             n=f"{len(spec.trials):,}"), soft_wrap=True)
        with RichProgress() as display:
            summary = runner.run(spec, location, address=address, max_concurrent=max_concurrent,
                                 retries=retries, steal_leases=steal_leases, reconcile=reconcile,
                                 callbacks=[display], only=only or ())
    except runner.SweepError as e:
        for problem in e.problems:
            error(problem)
        raise typer.Exit(code=e.code) from None
    except KeyboardInterrupt:  # a second Ctrl-C: stopped at once (the first one stops after recording)
        fail("interrupted; what was recorded is kept: run the sweep again to resume", code=130)
    if summary.not_run and not summary.running_elsewhere:
        fail(summary.not_run_message or f"sweep {summary.sweep}: {summary.not_run} trial(s) not run", code=1)
    if summary.running_elsewhere and summary.not_run:
        drivers = f" ({', '.join(summary.leased_by[:3])})" if summary.leased_by else ""
        err.print(styled("sweep [bold]{sweep}[/]: {n} trial(s) are being run by another driver{drivers}, which "
                         "records them", sweep=summary.sweep, n=summary.not_run, drivers=drivers))
    if summary.failures:
        err.print(styled("[bold red]{n} trial(s) failed:[/]", n=len(summary.failures)))
        for rec in summary.failures:
            err.print(f"  {rec['trial_key']} {_label(rec['config'])}: {rec['error']}", soft_wrap=True)
        raise typer.Exit(code=1)


DRY_RUN_TABLE = 200  # above this many trials, --dry-run streams plain lines instead of one rich table


def _dry_run(grid_file: Path, store: str | None, ledger: str | None, artifacts: str | None) -> None:
    """`sweep run --dry-run`: the grid checked and its trials listed as they are made, never all held at
    once: a grid of 10^6 trials prints its first line in seconds. A small grid is one table; a large one
    streams a line per trial (on a terminal, one screenful and then a count of the rest)."""
    from orchestrator import grid as grids  # lazy: keeps privbench --help light

    try:
        planned = grids.check(grids.read(grid_file), source=str(grid_file))
        runner.locate(store, ledger, artifacts)
    except grids.GridError as e:
        for problem in e.problems:
            error(problem)
        raise typer.Exit(code=2) from None
    except runner.SweepError as e:
        for problem in e.problems:
            error(problem)
        raise typer.Exit(code=e.code) from None

    _list_trials(f"sweep {planned.name}: {planned.count:,} trials" if planned.count is not None else
                 f"sweep {planned.name}", planned.count, planned.trials())


def _list_trials(title: str, count: int | None, trials: Iterator[Any]) -> None:
    """The dry run's listing: one table for a few trials, else a line per trial as they are made (on a terminal,
    one screenful and then a count of the rest)."""
    def cells(t: Any) -> tuple[str, ...]:
        return (t.trial_key, t.dataset, t.model, t.mechanism, "-" if t.epsilon is None else f"{t.epsilon:g}",
                str(t.seed))

    names = ("trial_key", "dataset", "model", "mechanism", "epsilon", "seed")
    if count is None or count <= DRY_RUN_TABLE:
        rows = [cells(t) for t in trials]
        table = Table(title=title if count is not None else f"{title}: {len(rows)} trials")
        for col in names:
            table.add_column(col)
        for row in rows:
            table.add_row(*row)
        out.print(table)
        return
    out.print(title, highlight=False, soft_wrap=True)
    first = [cells(t) for t in itertools.islice(trials, 100)]
    widths = [max(len(c) for c in column) for column in zip(names, *first, strict=False)]

    def line(row: tuple[str, ...]) -> str:
        return visible("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())

    shown_rows = max(out.height - 4, 10) if out.is_terminal else None
    stream = sys.stdout
    stream.write(line(names) + "\n")
    rows = itertools.chain(first, (cells(t) for t in trials))
    try:
        for n, row in enumerate(rows, 1):
            stream.write(line(row) + "\n")
            if shown_rows is not None and n >= shown_rows:
                stream.write(f"... and {count - n:,} more trials (not shown on a terminal: pipe the "
                             "output to see every one)\n")
                break
        stream.flush()
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


class RichProgress(Callback):
    """The terminal's view of a sweep: bars for the trials in flight only (a finished trial becomes one
    printed line), so that drawing costs the same at 60 trials as at 1,000. A context manager, so that
    the bars stop when a run ends in an error."""

    def __init__(self) -> None:
        self.progress: Progress | None = None
        self.overall: Any = None
        self.bars: dict[str, Any] = {}
        self.skipped = 0
        self.total = 0

    def __enter__(self) -> RichProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def on_sweep_start(self, spec: Any, todo: Any, max_concurrent: int, store: str) -> None:
        err.print(styled("sweep [bold]{name}[/]: {n} trials, {done} already finished, {todo} to run, up to {limit} at "
                         "once; store {store}", name=spec.name, n=len(spec.trials), done=len(spec.trials) - len(todo),
                         todo=len(todo), limit=max_concurrent, store=store))
        if not todo:
            return
        # The bar gives way first: on 80 columns a trial's label, its fixed 40-wide bar, its steps, epoch, loss and
        # time did not fit, and rich cut the numbers ("585/…", "0:00:…"). Now the bar takes what is left, up to 40.
        kept = Column(no_wrap=True)  # rich copies a column's settings into each table it draws
        columns = (TextColumn("{task.description}", markup=False, table_column=kept),
                   BarColumn(bar_width=None, table_column=Column(ratio=1, max_width=40)),
                   MofNCompleteColumn(table_column=kept),
                   TextColumn("{task.fields[info]}", markup=False, table_column=kept),
                   TimeElapsedColumn(table_column=kept))
        self.progress = Progress(*columns, console=err, transient=False)
        self.progress.start()
        self.total = len(todo)
        self.overall = self.progress.add_task(visible(spec.name), total=self.total, info="")

    def on_trial_skipped(self, config: Any) -> None:
        self.skipped += 1
        if self.progress is not None:
            self.progress.update(self.overall, total=self.total - self.skipped)

    def on_trial_start(self, config: Any) -> None:
        if self.progress is not None and config.trial_key not in self.bars:
            self.bars[config.trial_key] = self.progress.add_task(visible(config.label), total=None, info="starting")
            if not self.progress.console.is_terminal:  # piped: no live bars, so a line says the trial is under way
                self.progress.console.print(styled("  {label}: started", label=config.label),
                                            soft_wrap=True)

    def on_trial_progress(self, key: str, done: int, total: int, info: Any) -> None:
        if self.progress is not None and key in self.bars:
            self.progress.update(self.bars[key], completed=done, total=total,
                                 info=f"epoch {info.get('epoch')} loss {info.get('loss', 0):.3f}")

    def on_trial_result(self, record: Any, run_id: str | None) -> None:
        label = _label(record["config"])
        if run_id is None:
            line = styled("  {label}: [yellow]taken over by another driver[/]", label=label)
        elif record["status"] == "finished":
            line = styled("  {label}: [green]done[/]{numbers}", label=label, numbers=_numbers(record))
        else:
            line = styled("  {label}: [red]failed[/] {error}", label=label, error=(record.get("error") or "")[:60])
        if self.progress is None:
            err.print(line, soft_wrap=True)
            return
        task = self.bars.pop(record["trial_key"], None)
        if task is not None:
            self.progress.remove_task(task)
        self.progress.console.print(line, soft_wrap=True)
        self.progress.advance(self.overall)

    def on_sweep_end(self, summary: SweepSummary) -> None:
        self._stop()
        if summary.nothing_to_do:
            err.print(styled("sweep [bold]{sweep}[/]: {n} trials, {n} already finished, 0 to run; nothing to do "
                             "(store {store})", sweep=summary.sweep, n=summary.trials, store=summary.store))
            return
        if summary.skipped:
            err.print(f"{len(summary.skipped)} trial(s) were run by another driver at the same time")
        err.print(styled("sweep [bold]{sweep}[/]: {counts}", sweep=summary.sweep,
                         counts=", ".join(f"{n} {s}" for s, n in sorted(summary.counts.items()))))

    def on_warning(self, message: str) -> None:
        err.print(styled("[yellow]warning:[/] {message}", message=message), soft_wrap=True)


@contextlib.contextmanager
def store_errors(where: str = "store") -> Iterator[None]:
    """A damaged, missing or unreachable store: one line and exit 2 instead of a traceback."""
    from storage.errors import StoreError, translated  # lazy: keeps privbench --help light

    try:
        with translated(where):
            yield
    except StoreError as e:
        fail(str(e))


def not_into_store(out_file: Path | None, st: Any) -> None:
    """An output file must not overwrite the store's own files (`--out STORE/ledger.db` would destroy
    the ledger: privbench never deletes data it did not create). A file is the same file when its device
    and inode are: a hard link to `ledger.db` has another path and the same inode."""
    from storage.location import sqlite_path  # lazy: keeps privbench --help light

    if out_file is None:
        return
    target = Path(out_file).expanduser()
    own = [p for p in {sqlite_path(st.location.ledger_uri), sqlite_path(st.location.tracking_uri)} if p]
    files = [p.with_name(p.name + suffix) for p in own for suffix in ("", "-wal", "-shm", ".lock")]
    inodes = set()
    for path in files:
        with contextlib.suppress(OSError):
            info = path.stat()
            inodes.add((info.st_dev, info.st_ino))
    try:
        info = target.stat()
        same = (info.st_dev, info.st_ino) in inodes
    except OSError:
        same = False
    resolved = target.resolve()
    folder = st.location.folder
    if same or resolved in {p.resolve() for p in own} or (
            folder is not None and folder.resolve() in resolved.parents
            and resolved.name.startswith(("ledger.db", "mlflow.db"))):
        fail(f"--out {out_file} is a file of the store itself; write the output elsewhere")


def _open_store(store: Any, ledger: str | None = None, *, mirror: bool = False) -> Any:
    """Open a store for reading: read-only, nothing created or changed, after the verdict `store check` gives.
    A damaged ledger is refused; a damaged MLflow file too when the command reads it (`mirror`: the UI), and
    otherwise said in one warning line before the command goes on with the ledger alone."""
    from storage.location import StoreLocation, sqlite_path  # lazy: keeps privbench --help light
    from storage.store import Store, check_files, mirror_damage  # lazy: keeps privbench --help light

    location = store if isinstance(store, StoreLocation) else locate(store, ledger)
    with store_errors(location.display):
        st = Store(location)
        if mirror:
            check_files(location, sqlite_path(location.tracking_uri))
        elif (line := mirror_damage(location)) is not None:
            warning(line)
        return st


@app.command("list")
def list_sweeps(store: StoreOpt = None, ledger: LedgerOpt = None,
                as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False) -> None:
    """List the sweeps in the store with their trial counts."""
    st = _open_store(store, ledger)
    with store_errors(st.where):
        rows = [{"sweep": n, "trials": st.status_counts(n)} for n in st.sweep_names()]
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
           as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
           timing: Annotated[bool, typer.Option("--timing", help="Where the sweep's wall time went: each part of "
                                                "its trials and drivers, and the unexplained share.")] = False) -> None:
    """Show every trial of a sweep with its status, accuracy and error (reads the ledger, writes nothing)."""
    st = _open_store(store, ledger)
    name = resolve_sweep(st, sweep)
    if timing:
        from orchestrator.timing_report import lines, sweep_timing  # lazy: keeps privbench --help light

        with store_errors(st.where):
            report = sweep_timing(st.records(name), st.driver_runs(name))
        if as_json:
            print(json.dumps({"sweep": name, "timing": report}))
        else:
            for line in lines(name, report):
                out.print(line, highlight=False)
        return
    with store_errors(st.where):
        rows = trial_rows(st, name)
        counts = st.status_counts(name)
    if as_json:
        print(json.dumps({"sweep": name, "counts": counts, "trials": rows}))
        return
    from dashboards.render import fitted_table  # lazy: keeps privbench --help light
    from storage import schema  # lazy: keeps privbench --help light

    def cells(key: str, show: Any = str) -> list[str]:
        return ["-" if r[key] is None else show(r[key]) for r in rows]

    def number(f: schema.Field) -> Any:
        return lambda x: schema.shown(float(x), f)  # as the leaderboard writes it: accuracy in %

    # The trial key, status and numbers stay whole; errors, then dataset and model, then the mechanism are
    # shortened (or left out) to fit a terminal.
    columns = [("trial_key", cells("trial_key"), None), ("status", cells("status"), None),
               ("mechanism", cells("mechanism"), 2), ("dataset", cells("dataset"), 1), ("model", cells("model"), 1),
               ("epsilon", cells("epsilon", number(schema.field("config", "epsilon"))), None),
               ("seed", cells("seed"), None),
               ("accuracy", cells("accuracy", number(schema.utility_field("accuracy"))), None)]
    if any(r["error"] for r in rows):
        columns.append(("error", [r["error"].splitlines()[0][:80] if r["error"] else "" for r in rows], 0))
    table, left_out = fitted_table(f"sweep {name}", columns,
                                   out.width if out.is_terminal or os.environ.get("COLUMNS") else None)
    out.print(table)
    if left_out:
        out.print(f"(left out to fit {out.width} columns: {', '.join(left_out)}; --json shows every field)",
                  style="dim", highlight=False)
