"""`privbench store check|rebuild-ledger|rebuild-mirror`: find and mend a damaged store (docs/store.md).

Both files of a SQLite store hold every recorded result: the ledger its rows, MLflow a `result.json` per
run. So a damaged one is rebuilt from the other (`storage.recovery`), the damaged file kept beside it.
"""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.console import err, fail, out, styled
from orchestrator.sweep_cli import StoreOpt, store_errors

app = typer.Typer(help="Check a store's files, and rebuild a damaged one from the other.", no_args_is_help=True)
LedgerOpt = Annotated[str | None, typer.Option("--ledger", help="Database URI of the ledger, when not in the store "
                                                                "(sqlite:///... only for rebuilds).")]


def _location(store: str | None, ledger: str | None):  # noqa: ANN202 - a StoreLocation
    from orchestrator.sweep_cli import locate

    return locate(store, ledger)


@app.command("check")
def check(store: StoreOpt = None, ledger: LedgerOpt = None) -> None:
    """SQLite's integrity check (`PRAGMA quick_check`) of the ledger and of MLflow's database; exit 2 when
    one is damaged, with the command that rebuilds it. Reads only."""
    from storage import recovery
    from storage.store import damaged

    location = _location(store, ledger)
    if not location.exists():
        fail(f"no privbench store at {location.display}")
    with store_errors(location.display):
        found = recovery.check(location)
    bad = {path: problem for path, problem in found.items() if problem is not None}
    for path, problem in found.items():
        if problem is None:
            out.print(f"{path}: ok")
    for path, problem in bad.items():
        err.print(styled("[bold red]error:[/] {message}", message=str(damaged(location, path, problem))),
                  soft_wrap=True)
    if not found:
        out.print(f"{location.display}: not a SQLite store; PostgreSQL and MLflow servers check their own pages")
    if bad:
        raise typer.Exit(code=2)


ForceOpt = Annotated[bool, typer.Option("--force", help="Rebuild even a sound ledger (its pending trials and "
                                                         "leases are lost).")]


@app.command("rebuild-ledger")
def rebuild_ledger(store: StoreOpt = None, ledger: LedgerOpt = None, force: ForceOpt = False) -> None:
    """Rebuild a damaged ledger from the MLflow runs (each complete run holds its trial's result record).
    Stop every driver of the store first. The damaged file is kept beside the new one."""
    from storage import recovery

    location = _location(store, ledger)
    with store_errors(location.display):
        rebuilt = recovery.rebuild_ledger(location, force=force)
    out.print(rebuilt.summary("the ledger"))


@app.command("rebuild-mirror")
def rebuild_mirror(store: StoreOpt = None, ledger: LedgerOpt = None) -> None:
    """Rebuild a damaged or lost MLflow database from the ledger (one run per recorded trial, from its
    result record). Stop every driver of the store first. The damaged file is kept beside the new one."""
    from storage import recovery

    location = _location(store, ledger)
    with store_errors(location.display):
        rebuilt = recovery.rebuild_mirror(location)
    out.print(rebuilt.summary("the MLflow runs"))
