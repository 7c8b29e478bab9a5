"""`privbench audit MECHANISM` (owned by the auditing work)."""

import typer


def audit(mechanism: str = typer.Argument(..., help="Mechanism id.")) -> None:
    """Audit one privatisation step of MECHANISM empirically."""
    raise typer.Exit(code=2)
