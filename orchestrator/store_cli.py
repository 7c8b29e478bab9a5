"""`privbench store check|rebuild-ledger|rebuild-mirror`: find and mend a damaged store (docs/store.md).

Both files of a SQLite store hold every recorded result: the ledger its rows, MLflow a `result.json` per
run. So a damaged one is rebuilt from the other (`storage.recovery`), the damaged file kept beside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.console import error, fail, out
from orchestrator.sweep_cli import StoreOpt, locate, store_errors

if TYPE_CHECKING:
    from storage.location import StoreLocation

app = typer.Typer(help="Check a store's files, and rebuild a damaged one from the other.", no_args_is_help=True)
LedgerOpt = Annotated[str | None, typer.Option("--ledger", help="Database URI of the ledger, when not in the store "
                                                                "(sqlite:///... only for rebuilds).")]


def _location(store: str | None, ledger: str | None):  # noqa: ANN202 - a StoreLocation

    return locate(store, ledger)


QuickOpt = Annotated[bool, typer.Option("--quick", help="SQLite's quick_check and the file checks only, without "
                                                          "the full integrity check and the ledger's rows (large "
                                                          "stores).")]


@app.command("check")
def check(store: StoreOpt = None, ledger: LedgerOpt = None, quick: QuickOpt = False) -> None:
    """Check the ledger and MLflow's database as every command reads them: SQLite's full integrity check,
    each file's length and log, and every ledger row (JSON that parses, keys that match their index). Exit 2
    when one is damaged, naming the damage and the command that mends it. Reads only."""
    from storage import recovery  # lazy: keeps privbench --help light
    from storage.store import damaged  # lazy: keeps privbench --help light

    location = _location(store, ledger)
    with store_errors(location.display):
        if not location.exists():
            fail(f"no privbench store at {location.display}")
        found = recovery.check(location, quick=quick)
    bad = {path: problem for path, problem in found.items() if problem is not None}
    for path, problem in found.items():
        if problem is None:
            out.print(f"{path}: ok", soft_wrap=True)
    for path, problem in bad.items():
        error(str(damaged(location, path, problem)))
    if not found:
        out.print(f"{location.display}: not a SQLite store; PostgreSQL and MLflow servers check their own pages")
    if bad:
        raise typer.Exit(code=2)


def _force_opt(losing: str) -> object:
    return typer.Option("--force", help=f"Rebuild even a sound file ({losing}; the old file is kept beside the "
                                        "new one as .replaced-<time>).")


@app.command("rebuild-ledger")
def rebuild_ledger(store: StoreOpt = None, ledger: LedgerOpt = None,
                   force: Annotated[bool, _force_opt("its pending trials and leases are lost")] = False) -> None:
    """Rebuild a damaged ledger from the MLflow runs (each complete run holds its trial's result record).
    Stop every driver of the store first. The new ledger is built beside the old one and renamed into place
    when complete; the old file is kept beside it (.damaged-<time>)."""
    from storage import recovery  # lazy: keeps privbench --help light

    location = _location(store, ledger)
    with store_errors(location.display):
        rebuilt = recovery.rebuild_ledger(location, force=force)
    out.print(rebuilt.summary("the ledger"), soft_wrap=True)


@app.command("rebuild-mirror")
def rebuild_mirror(store: StoreOpt = None, ledger: LedgerOpt = None,
                   force: Annotated[bool, _force_opt("experiments and runs privbench did not make are left out")]
                   = False) -> None:
    """Rebuild a damaged or lost MLflow database from the ledger (one run per recorded trial, from its
    result record). Stop every driver of the store first. The new file is built beside the old one and
    renamed into place when complete; the old file is kept beside it (.damaged-<time>)."""
    from storage import recovery  # lazy: keeps privbench --help light

    location = _location(store, ledger)
    with store_errors(location.display):
        rebuilt = recovery.rebuild_mirror(location, force=force)
        _summarise(location)
    out.print(rebuilt.summary("the MLflow runs"), soft_wrap=True)


def _summarise(location: StoreLocation) -> None:
    """Each sweep's summary files (leaderboard, figures, `summary.md`, which is also the experiment's description)
    written again on the rebuilt parent runs, as `sweep run` writes them: the ledger keeps the records, not the
    files, so the storage layer rebuilds the runs and this command, above the dashboards, redraws the rest."""
    from dashboards.summary import sweep_files  # lazy: keeps privbench --help light
    from storage.store import Store  # lazy: keeps privbench --help light

    st = Store(location)
    try:
        for sweep in st.sweep_names():
            if records := st.records(sweep):
                st.log_sweep_files(sweep, sweep_files(records))
    finally:
        st.close()
