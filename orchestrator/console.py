"""Where output goes: results on stdout, progress and errors on stderr (so `--json` stays parseable), and
the one place where text from a user is made safe to print.

Sweep names, paths, store URIs, plugin ids, option values and the error messages that quote them reach
the terminal. rich would read `[/bold]` in them as markup (a `MarkupError`, or `exp[old]y` printed as
`expy`), and a terminal obeys escape sequences (an OSC sequence sets its title). So the consoles here
never read markup in a plain string, and show every control character of it as an escape (`\\x1b`):
`SafeConsole.render_str` is where rich turns any string it prints (a message, a table cell, a title)
into text. privbench's own styling is built by `styled(template, **values)`: the template is markup, the
values are user text, escaped once there.
"""

from __future__ import annotations

import os
import re
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

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


out = SafeConsole(highlight=False)
err = SafeConsole(stderr=True, highlight=False)
for _c in (out, err):  # wide tables stay readable when piped or logged, unless COLUMNS says how wide
    if not _c.is_terminal and not os.environ.get("COLUMNS"):
        _c.width = max(_c.width, 180)


def fail(message: str, code: int = 2) -> NoReturn:
    """One clear line on stderr, then exit (2: invalid input, nothing written)."""
    err.print(styled("[bold red]error:[/] {message}", message=message), soft_wrap=True)
    raise typer.Exit(code=code)
