"""`privbench`: the command line. Exit codes: 0 ok, 1 ran but something failed, 2 invalid input."""

from __future__ import annotations

import typer

from orchestrator import audit_cli, privacy_cli

app = typer.Typer(help="Benchmark differentially private training mechanisms.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
app.add_typer(privacy_cli.app, name="privacy")
app.command("audit")(audit_cli.audit)
