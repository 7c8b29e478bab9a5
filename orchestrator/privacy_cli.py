"""`privbench privacy epsilon|sigma|agm` (owned by the accountants work)."""

import typer

app = typer.Typer(help="Privacy accounting and noise calibration.", no_args_is_help=True)
