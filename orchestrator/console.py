"""Where output goes: results on stdout, progress and errors on stderr (so `--json` stays parseable).

Output survives any stream: a character the stream's encoding lacks (`±` under PYTHONIOENCODING=ascii) is
written as its ASCII spelling (`+-`) instead of raising, and output that is not a terminal (a pipe, a
file) carries no trailing spaces (rich pads a table's lines to its width).
"""

from __future__ import annotations

import codecs
import io
import os
import sys
from typing import NoReturn

import typer
from rich.console import Console

# The ASCII spelling of what privbench prints beyond ASCII (anything else becomes `?`).
ASCII_SPELLING = {"±": "+-", "…": "...", "×": "x", "ε": "eps", "σ": "sigma", "μ": "mu", "δ": "delta", "—": "-",
                  "–": "-", "≤": "<=", "≥": ">=", "→": "->", "✓": "ok", "✗": "x", "•": "*", "━": "-", "─": "-",
                  "│": "|", "┃": "|"}
ERRORS = "privbench-ascii"


def _spell(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    bad = error.object[error.start:error.end]
    return "".join(ASCII_SPELLING.get(ch, "?") for ch in bad), error.end


def use_ascii_spelling() -> None:
    """Make stdout and stderr write what their encoding lacks in ASCII (called by the CLI's entry)."""
    try:
        codecs.lookup_error(ERRORS)
    except LookupError:
        codecs.register_error(ERRORS, _spell)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors=ERRORS)


class _TrimmedLines(io.TextIOBase):
    """The stream rich writes to: `sys.stdout` (or `sys.stderr`) looked up at each write, so that a stream
    swapped later (a test runner's) is the one written; where it is not a terminal, the spaces that end a
    line are dropped."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name
        self._held = ""  # spaces at the end of the last write: dropped if a newline follows them

    @property
    def _stream(self) -> io.TextIOBase:
        return getattr(sys, self._name)

    def write(self, text: str) -> int:
        stream = self._stream
        if stream.isatty():
            return stream.write(text)
        *lines, last = (self._held + text).split("\n")
        kept = last.rstrip(" ")
        self._held = last[len(kept):]
        stream.write("".join(line.rstrip(" ") + "\n" for line in lines) + kept)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", None) or "utf-8"


out = Console(file=_TrimmedLines("stdout"))
err = Console(file=_TrimmedLines("stderr"))
for _c in (out, err):  # wide tables stay readable when piped or logged, unless COLUMNS says how wide
    if not _c.is_terminal and not os.environ.get("COLUMNS"):
        _c.width = max(_c.width, 180)


def fail(message: str, code: int = 2) -> NoReturn:
    """One clear line on stderr, then exit (2: invalid input, nothing written)."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=code)
