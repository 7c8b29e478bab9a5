"""Where output goes: results on stdout, progress and errors on stderr (so `--json` stays parseable)."""

from __future__ import annotations

import os
from typing import NoReturn

import typer
from rich.console import Console

out = Console()
err = Console(stderr=True)
for _c in (out, err):  # wide tables stay readable when piped or logged, unless COLUMNS says how wide
    if not _c.is_terminal and not os.environ.get("COLUMNS"):
        _c.width = max(_c.width, 180)


def fail(message: str, code: int = 2) -> NoReturn:
    """One clear line on stderr, then exit (2: invalid input, nothing written)."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=code)
