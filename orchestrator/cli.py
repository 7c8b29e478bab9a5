"""`privbench`: the command line. Exit codes: 0 ok, 1 ran but something failed, 2 invalid input."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.measure import Measurement
from rich.table import Table
from typer._click import exceptions as click  # Typer's own copy of click (Typer >= 0.22)

from orchestrator import audit_cli, privacy_cli, store_cli, sweep_cli
from orchestrator.console import OutputLost, error, fail, guard_streams, out, output_lost, use_ascii_spelling
from orchestrator.sweep_cli import ArtifactsOpt, LedgerOpt, StoreOpt, _open_store, locate, resolve_sweep, store_errors


class _Cli(typer.Typer):
    """The `privbench` program: a value Typer rejects (an unknown option, `--port 0`, a missing argument) is
    one `error:` line naming the command's `--help` and exit 2, like every other error, instead of click's
    five-line usage box."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("prog_name", "privbench")
        command = typer.main.get_command(self)
        streams = guard_streams()
        try:
            code = command.main(*args, standalone_mode=False, **kwargs)
            sys.stdout.flush()
        except OutputLost as e:
            sys.exit(output_lost(e))
        except click.NoArgsIsHelpError:
            return command(*args, **kwargs)  # no arguments: the help, as Typer shows it
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else kwargs["prog_name"]
            error(f"{e.format_message()} (`{where} --help` says what it takes)")
            sys.exit(e.exit_code)
        except click.ClickException as e:
            error(e.format_message())
            sys.exit(e.exit_code)
        except (typer.Abort, KeyboardInterrupt):
            error("interrupted")
            sys.exit(130)
        finally:
            sys.stdout, sys.stderr = streams
        sys.exit(code if isinstance(code, int) else 0)


app = _Cli(help="Benchmark differentially private training mechanisms: claimed, certified and "
                "audited epsilon side by side.", no_args_is_help=True, pretty_exceptions_enable=False)


@app.callback()
def _entry() -> None:
    """Process-wide settings, set here (the CLI's entry) rather than on import: Hugging Face offline
    unless PRIVBENCH_HF_OFFLINE=0 (trials apply the rest in `workers.environment.configure`)."""
    os.environ.setdefault("HF_HUB_OFFLINE", os.environ.get("PRIVBENCH_HF_OFFLINE", "1"))
    use_ascii_spelling()  # `±` as `+-` where the output's encoding lacks it, not a traceback


app.add_typer(sweep_cli.app, name="sweep")
app.add_typer(privacy_cli.app, name="privacy")
app.add_typer(store_cli.app, name="store")
app.command("audit")(audit_cli.audit)


SweepsArg = Annotated[list[str] | None, typer.Argument(help="Sweep names; several are compared side by side "
                                                           "(default: the latest).", show_default=False)]


def _records(st, sweeps: list[str] | None) -> tuple[list[str], list[dict]]:
    """The named sweeps (or the latest) and their result records, in the order given."""
    names = [resolve_sweep(st, s) for s in sweeps] if sweeps else [resolve_sweep(st, None)]
    names = list(dict.fromkeys(names))
    return names, [r for n in names for r in st.records(n)]


def _read_for(out_file: Path | None, store: Any, ledger: str | None, sweeps: list[str] | None,
              metric: str) -> tuple[Any, list[str], list[dict]]:
    """What leaderboard, report and plot share: a writable output, the store opened read-only, the
    sweeps' records, and a metric they have."""
    _writable_parent(out_file)
    st = _open_store(store, ledger)
    sweep_cli.not_into_store(out_file, st)
    with store_errors(st.where):
        names, records = _records(st, sweeps)
    _known_metric(records, metric)
    return st, names, records


@app.command("leaderboard")
def leaderboard(
    sweeps: SweepsArg = None,
    store: StoreOpt = None,
    ledger: LedgerOpt = None,
    metric: Annotated[str, typer.Option(help="Utility metric of the result records.")] = "accuracy",
    by: Annotated[str, typer.Option(help="Comma-separated grouping shown as separate tables "
                                         "(dataset,model).")] = "dataset,model",
    view: Annotated[str, typer.Option(help="Rank by the certified or the claimed epsilon, or `tuned`: tuned "
                                           "cells' selected candidates at epsilon including tuning.")] = "certified",
    fmt: Annotated[str, typer.Option("--format", help="table|csv|markdown|latex|json|html")] = "table",
    out_file: Annotated[Path | None, typer.Option("--out", help="Write to FILE instead of stdout.")] = None,
    columns: Annotated[str, typer.Option(help="Column groups besides core (what, utility, eps certified and "
                                              "audited, status, step x, runs): privacy, audit, overhead or all, "
                                              "and/or single columns by header ('utility,eps claimed,eps "
                                              "certified' shows those beside mechanism and eps target), "
                                              "comma-separated. CSV and JSON always hold every field.")] = "core",
    float_env: Annotated[str, typer.Option("--float", help="LaTeX only: none (bare tables), table (one column) "
                                                           "or 'table*' (both columns; quoted, or the shell "
                                                           "expands it).")] = "none",
    width: Annotated[str | None, typer.Option(help="LaTeX only: the width the table is made to fit: single (one "
                                                   "column), double (both) or a number of points; default: single, "
                                                   "double for --float 'table*'.")] = None,
    venue: Annotated[str, typer.Option(help="LaTeX only: whose column widths and font size: article (LaTeX's "
                                            "two-column article), acm (sigconf) or ieee (conference).")] = "article",
    caption: Annotated[str | None, typer.Option(help="LaTeX only: the float's caption (LaTeX).")] = None,
    label: Annotated[str | None, typer.Option(help="LaTeX only: the float's \\label.")] = None,
) -> None:
    """Mean +- std over seeds per (dataset, model, mechanism, epsilon), with the three epsilons."""
    from dashboards import leaderboard as lb  # lazy: keeps privbench --help light
    from dashboards import tuned_cells  # lazy: keeps privbench --help light
    from dashboards.render import render  # lazy: keeps privbench --help light

    groups_chosen, groups = _leaderboard_options(fmt, columns, venue, width, float_env, caption, label, view, by)
    _, names, records = _read_for(out_file, store, ledger, sweeps, metric)
    name = " + ".join(names)
    if view == tuned_cells.TUNED_VIEW:
        tuned = tuned_cells.rows(records, metric)
        text = (json.dumps([dataclasses.asdict(r) for r in tuned], indent=1) if fmt == "json"
                else tuned_cells.markdown(tuned))
        if out_file is None:
            print(text, end="")
        else:
            _write(out_file, text)
        return
    board = lb.rows(records, metric=metric, view=view)
    if len(names) > 1 and "sweep" not in groups:
        groups = ["sweep", *groups]
    if fmt == "table" and out_file is None:
        _print_leaderboard_tables(board, groups, groups_chosen, f"{name} ", f" ({metric}, {view} view)")
        return
    text = render(board, "markdown" if fmt == "table" else fmt, title=f"privbench leaderboard: {name}",
                  columns=groups_chosen, float_env=float_env, width=width, venue_name=venue, caption=caption,
                  label=label)
    if fmt in ("table", "markdown"):
        text += "".join(f"\n{r.mechanism} eps {_eps(r.epsilon_target)}: {r.tuning}" for r in board if r.tuning)
    if out_file is None:
        print(text, end="" if text.endswith("\n") else "\n")
    else:
        _write(out_file, text)


def _leaderboard_options(fmt: str, columns: str, venue: str, width: str | None, float_env: str, caption: str | None,
                         label: str | None, view: str, by: str) -> tuple[Any, list[str]]:
    """The leaderboard's options, checked before the store is read (each bad one a one-line error, exit 2):
    the column groups chosen, and the `--by` grouping."""
    from dashboards import leaderboard as lb  # lazy: keeps privbench --help light
    from dashboards import tuned_cells  # lazy: keeps privbench --help light
    from dashboards.latex import resolve_width  # lazy: keeps privbench --help light
    from dashboards.render import FLOATS, FORMATS  # lazy: keeps privbench --help light
    from dashboards.venues import venue as venue_of  # lazy: keeps privbench --help light
    from storage import schema  # lazy: keeps privbench --help light

    if fmt not in FORMATS:
        fail(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    try:
        groups_chosen = schema.select(columns)
        chosen_venue = venue_of(venue)
        if width is not None:
            resolve_width(width, chosen_venue)
    except ValueError as e:
        fail(str(e))
    if float_env not in FLOATS:
        fail(f"unknown --float {float_env!r}; known: {', '.join(FLOATS)}")
    if fmt != "latex" and (width or caption or label or float_env != "none"):
        fail("--width, --float, --caption and --label apply to --format latex only")
    if (caption or label) and float_env == "none":
        fail("--caption and --label need a float: --float table or --float 'table*'")
    if label and not caption:
        from dashboards.latex import LABEL_NEEDS_CAPTION  # lazy: keeps privbench --help light

        fail(LABEL_NEEDS_CAPTION)
    if float_env == "table" and width == "double" or float_env == "table*" and width == "single":
        fail(f"--float {float_env} is {'one column' if float_env == 'table' else 'both columns'} wide: "
             f"use --float {'table*' if float_env == 'table' else 'table'} with --width {width}")
    if view not in (*lb.VIEWS, tuned_cells.TUNED_VIEW):
        fail(f"unknown view {view!r}; known: {', '.join((*lb.VIEWS, tuned_cells.TUNED_VIEW))}")
    if view == tuned_cells.TUNED_VIEW and fmt not in ("table", "markdown", "json"):
        fail(f"--view tuned writes table, markdown or json, not {fmt!r}")
    groups = [g.strip() for g in by.split(",") if g.strip()]
    if not set(groups) <= {"dataset", "model"}:
        fail(f"--by takes dataset and/or model, got {by!r}")
    return groups_chosen, groups


def _print_leaderboard_tables(board: list[Any], groups: list[str], groups_chosen: Any, before: str,
                              after: str) -> None:
    """The leaderboard on the terminal: a table per `groups` key, titled `before` + the key + `after`, each sized to
    the terminal (piped: at its natural width), with the notes a sized table leaves out in words below it."""
    from dashboards.render import rich_tables  # lazy: keeps privbench --help light

    keys = sorted({tuple(getattr(r, g) for g in groups) for r in board})
    sized = out.is_terminal or bool(os.environ.get("COLUMNS"))  # piped: one table at its natural width
    for key in keys or [()]:
        part = [r for r in board if tuple(getattr(r, g) for g in groups) == key]
        tables, note = rich_tables(part, before + " / ".join(map(str, key)) + after, groups_chosen,
                                   out.width if sized else None, not out.encoding.startswith("utf"))
        for i, table in enumerate(tables):
            if i:
                out.print()
            _print_whole(table)
        if note:
            out.print(f"({note})", style="dim", highlight=False)
        for r in part:
            if r.audit_violation and sized:  # the `violation` column, left out of a sized table, in words
                out.print(f"{r.mechanism} eps {_eps(r.epsilon_target)}: violated by its audits: "
                          f"{r.audit_violation}", highlight=False)
            if r.tuning:
                out.print(f"{r.mechanism} eps {_eps(r.epsilon_target)}: {r.tuning}", highlight=False)


def _eps(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _print_whole(table: Any) -> None:
    """Piped or logged with no COLUMNS to go by, a table gets the width it needs: no header or cell is
    folded. A terminal (or an explicit COLUMNS) keeps its width, which the default columns fit at 80."""
    if out.is_terminal or os.environ.get("COLUMNS"):
        out.print(table)
        return

    width = out.width
    out.width = max(width, Measurement.get(out, out.options.update(max_width=1000), table).maximum)
    try:
        out.print(table)
    finally:
        out.width = width


def _writable_parent(path: Path | None) -> None:
    """Check `--out` before reading anything: a missing folder is a one-line error, not a traceback."""
    if path is not None and not path.parent.is_dir():
        fail(f"--out {path}: the folder {path.parent} does not exist")
    if path is not None and path.is_dir():
        fail(f"--out {path} is a folder; give a file name")


def _write(path: Path, content: str | bytes) -> None:
    try:
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    except OSError as e:
        fail(f"cannot write {path}: {e.strerror or e}")
    _wrote(path)


def _wrote(path: Path) -> None:
    """What every command that writes `--out` says, once the file is complete."""
    out.print(f"wrote {path}", highlight=False, soft_wrap=True)


def _known_metric(records: list[dict], metric: str) -> None:
    """A metric no record has would give a leaderboard of nulls: say which metrics exist instead (or,
    when no trial finished, that they all failed, and the first error)."""
    if records and all(r.get("status") == "failed" for r in records):
        first = next((str(r.get("error")) for r in records if r.get("error")), "no error recorded").splitlines()
        fail(f"all {len(records)} trials failed: first error {(first or [''])[0][:200]}", code=1)
    known = sorted({k for r in records for k, v in (r.get("metrics") or {}).items() if isinstance(v, int | float)})
    if records and metric not in known:
        fail(f"unknown metric {metric!r}; the records have: {', '.join(known) or 'none'}")


@app.command("report")
def report(
    sweeps: SweepsArg = None,
    store: StoreOpt = None,
    ledger: LedgerOpt = None,
    metric: Annotated[str, typer.Option(help="Utility metric of the result records.")] = "accuracy",
    out_file: Annotated[Path, typer.Option("--out", help="HTML file to write.")] = Path("report.html"),
) -> None:
    """A self-contained HTML report: figures (inline SVG), leaderboard, verdicts and the grid files."""
    from dashboards.report import report as build_report  # lazy: keeps privbench --help light

    st, names, records = _read_for(out_file, store, ledger, sweeps, metric)
    with store_errors(st.where):
        grids = {n: st.grid_yaml(n) for n in names}
    _write(out_file, build_report(records, names, grids, metric=metric))


@app.command("plot")
def plot(
    sweeps: SweepsArg = None,
    kind: Annotated[str, typer.Option(help="privacy-utility|overhead|curves|verdicts|tuning")] = "privacy-utility",
    out_file: Annotated[Path, typer.Option("--out", help="Figure file; the suffix picks the format: "
                                                         ".pdf, .svg, .png or .pgf (needs LaTeX).")] = Path("fig.pdf"),
    store: StoreOpt = None,
    ledger: LedgerOpt = None,
    metric: Annotated[str, typer.Option(help="Utility metric of the result records.")] = "accuracy",
    size: Annotated[str | None, typer.Option(help="single (one column of the venue's two-column page) or double "
                                                  "(its text width); default: the figure's own size.")] = None,
    venue: Annotated[str, typer.Option(help="Whose widths --size takes: article (LaTeX's two-column article: "
                                            "3.18 / 6.49 in), acm (sigconf: 3.34 / 7.01 in) or ieee (conference: "
                                            "3.49 / 7.14 in).")] = "article",
) -> None:
    """One publication figure (matplotlib) from one or more sweeps."""
    # lazy: keeps privbench --help light
    from dashboards import figures  # matplotlib: imported only when a figure is made
    from dashboards.venues import VENUES  # lazy: keeps privbench --help light

    if kind not in (*figures.KINDS, figures.TUNING_KIND):
        fail(f"unknown figure kind {kind!r}; known: {', '.join((*figures.KINDS, figures.TUNING_KIND))}")
    if size is not None and size not in figures.SIZES:
        fail(f"unknown size {size!r}; known: {', '.join(figures.SIZES)}")
    if venue not in VENUES:
        fail(f"unknown venue {venue!r}; known: {', '.join(VENUES)}")
    fmt = out_file.suffix.lstrip(".").lower()
    if fmt not in figures.FORMATS:
        fail(f"unsupported figure format {out_file.suffix!r}; known: .pdf, .svg, .png, .pgf")
    if fmt == "pgf" and figures.tex_engine() is None:
        fail("--out .pgf needs a TeX engine (xelatex, lualatex or pdflatex) on PATH; use .pdf or .svg otherwise")
    _, _, records = _read_for(out_file, store, ledger, sweeps, metric)
    try:
        fig = figures.build(kind, records, metric, size, venue)
    except figures.NoTunedCells as e:
        fail(str(e))
    image = io.BytesIO()  # drawn in memory, then written: a full disk is an OSError here, not matplotlib's
    try:
        figures.save(fig, image, fmt)
    except Exception as e:  # matplotlib's LatexError: the TeX engine is there but could not typeset
        if type(e).__name__ != "LatexError":
            raise
        fail(f"cannot write {out_file}: {figures.tex_engine()} failed ({str(e).splitlines()[0]})")
    _write(out_file, image.getvalue())


@app.command("export")
def export(
    sweep: Annotated[str | None, typer.Argument(help="Sweep name (default: the latest).")] = None,
    store: StoreOpt = None,
    ledger: LedgerOpt = None,
    fmt: Annotated[str, typer.Option("--format", help="csv|parquet|json")] = "json",
    out_file: Annotated[Path | None, typer.Option("--out", help="Output file (default: privbench-export.json, "
                                                               ".csv or .parquet, after --format).")] = None,
) -> None:
    """Every trial record of a sweep (one row per trial, flattened)."""
    if fmt not in ("csv", "parquet", "json"):
        fail(f"unknown format {fmt!r}; known: csv, parquet, json")
    out_file = out_file or Path(f"privbench-export.{fmt}")
    _writable_parent(out_file)
    st = _open_store(store, ledger)
    sweep_cli.not_into_store(out_file, st)
    name = resolve_sweep(st, sweep)
    with store_errors(st.where):
        records = st.records(name)
    if fmt == "json":
        _write(out_file, json.dumps(records, indent=1))
        return
    import pandas as pd  # lazy: heavy (pandas)

    frame = pd.json_normalize(records)
    try:
        frame.to_csv(out_file, index=False) if fmt == "csv" else frame.to_parquet(out_file)
    except ImportError as e:
        fail(f"--format parquet needs pyarrow: {e}".splitlines()[0])
    except OSError as e:
        fail(f"cannot write {out_file}: {e.strerror or e}")
    _wrote(out_file)


@app.command("ui")
def ui(
    store: StoreOpt = None,
    artifacts: ArtifactsOpt = None,
    host: Annotated[str, typer.Option(help="Interface to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port.")] = 5000,
) -> None:
    """Serve the MLflow UI (and REST API) on the store; stops it on Ctrl-C or SIGTERM."""
    # lazy: keeps privbench --help light
    from dashboards.ui import UiError, check_bindable, home_url, runs_table_url, serve
    from storage.mlflow_view import RUNS_VIEW_TAG  # lazy: keeps privbench --help light

    location = locate(store, artifacts=artifacts)
    if location.kind == "server":
        fail(f"{location.display} is already an MLflow server: open it in a browser")
    if not location.exists():
        fail(f"no privbench store at {location.display}")
    st = _open_store(location, mirror=True)
    with store_errors(st.where):
        # the runs view (storage/mlflow_view.py) is on every experiment a sweep run or resume has touched since
        found = st.experiments()
        sweeps = [(name, e) for name, e, _ in found]
        views = {e: tags[RUNS_VIEW_TAG] for _, e, tags in found if RUNS_VIEW_TAG in tags}
    try:
        check_bindable(host, port)
        out.print(f"MLflow UI: {home_url(host, port)}", soft_wrap=True, highlight=False)
        for name, experiment_id in sweeps:  # MLflow's UI opens on its GenAI pages unless told otherwise
            # no share key: the front makes the view the browser's first one (MLflow would say "You're viewing
            # a shared view" over the table)
            url = runs_table_url(host, port, experiment_id)
            out.print(f"{name}: {url}", soft_wrap=True, highlight=False)
        code = serve(location, host, port, views)
    except UiError as e:
        fail(str(e))
    raise typer.Exit(code=code)


def load_plugins(modules: list[str]) -> None:
    """Load plugin modules named on the command line as a grid's `plugins:` key does (from sys.path, else the
    current folder); a module that cannot be loaded is one line and exit 2."""
    if not modules:
        return
    from mechanisms.framework.registry import PluginError  # lazy: keeps privbench --help light
    from workers import plugins  # lazy: keeps privbench --help light

    try:
        plugins.load(modules, search=[Path.cwd()])
    except PluginError as e:
        fail(str(e))


@app.command("list")
def list_names(what: Annotated[str, typer.Argument(help="mechanisms|datasets|models|accountants")],
               hooks: Annotated[bool, typer.Option("--hooks", help="With `mechanisms`: the contract, every hook "
                                                   "a mechanism may write with the guarantee it must keep")] = False,
               plugins: Annotated[list[str] | None, typer.Option(
                   "--plugins", metavar="MODULE", help="Also a plugin module a grid would name under `plugins:` "
                   "(from sys.path or the current folder; repeatable)")] = None,
               ) -> None:
    """List the names a grid file can use: privbench's, installed plugins' (entry points), and the modules
    named with --plugins (as a grid's `plugins:` key loads them)."""
    from mechanisms.accounting.accountant import described  # lazy: keeps privbench --help light
    from mechanisms.framework.mechanism import FINAL, HOOKS, filled_hooks  # lazy: keeps privbench --help light
    from mechanisms.framework.registry import ACCOUNTANTS, MECHANISMS  # lazy: keeps privbench --help light
    from workers import datasets, models  # lazy: keeps privbench --help light

    if hooks and what != "mechanisms":
        fail("--hooks goes with `privbench list mechanisms`")
    load_plugins(plugins or [])
    if hooks:
        table = Table(title="the mechanism contract (docs/plugins.md)")
        for name in ("hook", "used by", "guarantee"):
            table.add_column(name, overflow="fold")
        for hook in HOOKS:
            table.add_row(hook.name, hook.used_by, hook.guarantee)
        out.print(table)
        out.print(f"privbench runs {', '.join(FINAL)} itself: a plugin that overrides one is uncertified.")
        return
    if what == "mechanisms":
        rows = [(n, m.description + (f" (hooks: {', '.join(h)})" if (h := filled_hooks(m)) else ""))
                for n, m in MECHANISMS.items()]
        broken = MECHANISMS.broken()
    elif what == "datasets":
        rows = [(n, f"{kind}: {desc}") for n, kind, desc in datasets.describe()]
        broken = datasets.DATASETS.broken()
    elif what == "models":
        rows = [(n, f"{kinds}: {desc}") for n, kinds, desc in models.describe()]
        broken = models.MODELS.broken()
    elif what == "accountants":
        rows = [(n, described(a)) for n, a in ACCOUNTANTS.items()]
        broken = ACCOUNTANTS.broken()
    else:
        fail(f"unknown list {what!r}; known: mechanisms, datasets, models, accountants")
    rows += [(n, f"failed to load: {why}") for n, why in sorted(broken.items())]
    table = Table(title=what)
    table.add_column("name", no_wrap=True)
    table.add_column("description", overflow="fold")
    for row in rows:
        table.add_row(*row)
    out.print(table)
