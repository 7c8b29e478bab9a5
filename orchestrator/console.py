"""Where output goes: results on stdout, progress and errors on stderr (so `--json` stays parseable), and
the one place where text from a user is made safe to print.

Output survives any stream: a character the stream's encoding lacks (`±` under PYTHONIOENCODING=ascii) is
written as its ASCII spelling (`+-`) instead of raising, and output that is not a terminal (a pipe, a
file) carries no trailing spaces (rich pads a table's lines to its width).

Sweep names, paths, store URIs, plugin ids, option values and the error messages that quote them reach
the terminal. rich would read `[/bold]` in them as markup (a `MarkupError`, or `exp[old]y` printed as
`expy`), and a terminal obeys escape sequences (an OSC sequence sets its title). So the consoles here
never read markup in a plain string, and show every control character of it as an escape (`\\x1b`):
`SafeConsole.render_str` is where rich turns any string it prints (a message, a table cell, a title)
into text. privbench's own styling is built by `styled(template, **values)`: the template is markup, the
values are user text, escaped once there.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import io
import os
import re
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.file_proxy import FileProxy
from rich.markup import escape
from rich.text import Text

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
        stream = getattr(stream, "wrapped", stream)  # through `guard_streams`
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors=ERRORS)


class _TrimmedLines(io.TextIOBase):
    """The stream rich writes to: `sys.stdout` (or `sys.stderr`) looked up at each write, so that a stream
    swapped later (a test runner's) is the one written; where it is not a terminal, the spaces that end a
    line are dropped.

    A live display (rich's `Progress`, `Live`) swaps `sys.stdout` and `sys.stderr` for a `FileProxy` that
    prints to its console, which is one of ours: writing to the proxy would print to the console, which
    writes to the proxy again, forever (`sweep run` hung in every terminal). So the lookup sees through
    such proxies to the stream they wrap."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name
        self._held = ""  # spaces at the end of the last write: dropped if a newline follows them

    @property
    def _stream(self) -> io.TextIOBase:
        stream = getattr(sys, self._name)
        while isinstance(stream, FileProxy):
            stream = stream.rich_proxied_file
        return stream

    def write(self, text: str) -> int:
        stream = self._stream
        if stream is None:  # closed before privbench started (`>&-`): said by `guard_streams`'s stream
            raise OSError(errno.EBADF, "closed")
        if stream.isatty():
            return stream.write(text)
        *lines, last = (self._held + text).split("\n")
        kept = last.rstrip(" ")
        self._held = last[len(kept):]
        stream.write("".join(line.rstrip(" ") + "\n" for line in lines) + kept)
        return len(text)

    def flush(self) -> None:
        if self._stream is not None:
            self._stream.flush()

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", None) or "utf-8"


# C0 and C1 controls but newline and tab, DEL, bidirectional overrides (text that displays reordered) and
# lone surrogates (which no terminal encoding can write).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def visible(text: str) -> str:
    """`text` with every control character shown as a Python escape (`\\x1b`, `\\u202e`), newlines kept."""
    return _UNSAFE.sub(lambda m: repr(m.group())[1:-1], str(text))


def styled(template: str, **values: Any) -> Text:
    """privbench's markup `template` with `{name}` fields filled by `values`, each escaped for markup and for
    the terminal: `styled("[bold red]error:[/] {message}", message=text)`."""
    return Text.from_markup(template.format(**{k: escape(visible(str(v))) for k, v in values.items()}))


class SafeConsole(Console):
    """A rich console that prints a plain string as it is: no markup read, control characters escaped."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        kwargs["markup"] = False
        return super().render_str(visible(text), **kwargs)


out = SafeConsole(file=_TrimmedLines("stdout"), highlight=False)
err = SafeConsole(file=_TrimmedLines("stderr"), highlight=False)
for _c in (out, err):  # wide tables stay readable when piped or logged, unless COLUMNS says how wide
    if not _c.is_terminal and not os.environ.get("COLUMNS"):
        _c.width = max(_c.width, 180)


def one_line(text: str) -> str:
    """`text` as one line: control characters escaped (`visible`), and line breaks too (`\\n`): a path or
    name with a newline in it must not turn one error line into several."""
    return visible(str(text)).replace("\r", "\\r").replace("\n", "\\n")


def error(message: str) -> None:
    """One `error:` line on stderr."""
    err.print(styled("[bold red]error:[/] {message}", message=one_line(message)), soft_wrap=True)


PIPE_GONE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader left (`| head`)
OUTPUT_LOST = 1


class OutputLost(Exception):  # not an OSError: the store's error translation must not read it as the store's
    """stdout cannot be written (closed, a full disk, its reader gone): the command's output is lost."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error.strerror or str(error))
        self.errno = error.errno


class _Guarded:
    """`sys.stdout` or `sys.stderr` as the CLI writes them. A write to stdout that fails (or to no stdout at
    all: `>&-` leaves Python none) raises `OutputLost`, which the CLI's entry turns into one line and its exit
    code; a write to stderr that fails is dropped, for nothing could say so: the command's own exit code stands."""

    def __init__(self, name: str, stream: Any) -> None:
        self.name, self.wrapped = name, stream

    def _do(self, what: str, *args: Any) -> Any:
        try:
            if self.wrapped is None:
                raise OSError(errno.EBADF, "it is closed")
            return getattr(self.wrapped, what)(*args)
        except OSError as e:
            if self.name == "stdout":
                raise OutputLost(e) from None
            return len(args[0]) if args else None

    def write(self, text: str) -> int:
        return self._do("write", text)

    def flush(self) -> None:
        if self.wrapped is not None:  # no stream holds nothing to flush
            self._do("flush")

    def isatty(self) -> bool:
        try:
            return self.wrapped is not None and self.wrapped.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


def guard_streams() -> tuple[Any, Any]:
    """Put `_Guarded` streams in place of `sys.stdout` and `sys.stderr`; returns the streams they replace."""
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Guarded("stdout", sys.stdout), _Guarded("stderr", sys.stderr)
    return before


def output_lost(e: OutputLost) -> int:
    """What the CLI does when stdout failed: one line on stderr (none for a reader that left: `| head` is not an
    error), the standard output made harmless for the interpreter's last flush, and the exit code."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # Python flushes stdout as it exits: that flush must not fail again
    if e.errno == errno.EPIPE:
        return PIPE_GONE
    error(f"the output could not be written to stdout ({e}); run it again with stdout on a terminal or a file "
          "with space")
    return OUTPUT_LOST


def warning(message: str) -> None:
    """One `warning:` line on stderr: the command goes on."""
    err.print(styled("[yellow]warning:[/] {message}", message=one_line(message)), soft_wrap=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """One clear line on stderr, then exit (2: invalid input, nothing written)."""
    error(message)
    raise typer.Exit(code=code)
