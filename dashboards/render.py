"""Leaderboard output formats: a rich table for people, csv / markdown / latex / json / html for tools."""

from __future__ import annotations

import dataclasses
import html
import io
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from dashboards import latex as tex
from dashboards.leaderboard import LeaderboardRow, as_dicts
from dashboards.venues import DEFAULT_VENUE, venue
from storage import schema

latex_escape = tex.escape
FLOATS = tex.FLOATS

FORMATS = ("table", "csv", "markdown", "latex", "json", "html")


def _fmt(x: Any, f: schema.Field) -> str:
    """A number as every output writes its quantity (`schema.shown`: the field's decimals and rounding, up
    for upper bounds and down for lower bounds); `-` for none."""
    if x is None:
        return "-"
    return schema.shown(x, f) if isinstance(x, float) else str(x)


def _utility(r: LeaderboardRow) -> str:
    if r.utility_mean is None:
        return "-"
    u = schema.utility_field(r.metric)
    one_run = r.utility_std is None or r.n_finished < 2  # no spread to show: `45.7`, never `45.7 ± 0.0`
    mean = schema.shown(r.utility_mean, u)
    return mean if one_run else f"{mean} ± {schema.shown(r.utility_std, u)}"


def _mu(r: LeaderboardRow) -> str:
    """`claimed/audited`, each part as its quantity is written."""
    if r.mu_audited is None:
        return "-"
    return (f"{_fmt(r.mu_claimed, schema.field('privacy', 'mu_claimed'))}/"
            f"{_fmt(r.mu_audited, schema.field('privacy', 'mu_audited'))}")


# Cells that are not one number of the row's schema column (every other column: `_fmt` of its value).
CELLS: dict[str, Callable[[LeaderboardRow], str]] = {
    "dataset": lambda r: r.dataset, "model": lambda r: r.model, "mechanism": lambda r: r.mechanism,
    "utility": _utility, "mu claimed/audited": _mu,
    "status": lambda r: r.claim_status or "-",
    "violation": lambda r: r.audit_violation or "-",  # why, in words (e.g. "above ceiling")
    "> ceiling": lambda r: {True: "yes", False: "no"}.get(r.audit_above_ceiling, "-"),
    "runs": lambda r: f"{r.n_finished}" + (f" ({r.n_failed} failed)" if r.n_failed else ""),
    "pareto": lambda r: "*" if r.pareto else "",
}


def _cell(f: schema.Field) -> Callable[[LeaderboardRow], str]:
    """The cell of field `f`."""
    if f.header in CELLS:
        return CELLS[f.header]
    return lambda r: _fmt(getattr(r, f.column), f)


def groups_of(columns: str | Sequence[str]) -> tuple[str, ...]:
    """`--columns` ('core', 'audit,overhead', 'all', 'utility,eps certified') -> the schema's column groups (core
    always) and single columns' headers."""
    return schema.select(columns) if isinstance(columns, str) else tuple(columns)


def display(board: Sequence[LeaderboardRow], columns: str | Sequence[str] = "core",
            leave_out: Sequence[str] = ()) -> list[tuple[str, Callable[[LeaderboardRow], str]]]:
    """(header, cell) of the text tables' columns: the schema's displayed fields of the chosen groups, in
    its display order; a sparse field (newer than most stores) only when some row has it."""
    chosen = groups_of(columns)  # groups and single columns' headers
    return [(f.header, _cell(f)) for f in schema.displayed()
            if (f.group in chosen or f.header in chosen or f.header in schema.IDENTITY) and f.header not in leave_out
            and not (f.sparse and all(getattr(r, f.column) is None for r in board))]


STATUS_STYLE = {"violated": "bold red", "overclaimed": "yellow", "uncertified": "magenta", "ok": "green"}
KEY_COLUMNS = ("mechanism", "eps target")  # repeated by every part of a folded table


def _header(text: str, cells: Sequence[str]) -> str:
    """A header over at most two lines, split at the space that makes its column narrowest (`eps` over
    `certified`) when that saves more than two characters, never inside a word."""
    widest = max([len(c) for c in cells] + [0])
    if len(text) <= widest + 2:  # a split saving a character or two is not worth a second line
        return text
    splits = [text] + [text[:i] + "\n" + text[i + 1:] for i, ch in enumerate(text) if ch == " "]
    return min(splits, key=lambda h: (max([widest] + [len(x) for x in h.split("\n")]), h.count("\n")))


def _table(title: str, shown: Sequence[tuple[str, list[str]]], statuses: Sequence[str | None]) -> Table:
    table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0, 0, 1))
    for header, cells in shown:  # no cell wraps or is cut: the parts are made to fit
        table.add_column(_header(header, cells), justify="left" if header == "mechanism" else "right", no_wrap=True)
    for i, status in enumerate(statuses):  # Text, not markup: a name with brackets prints as it is
        table.add_row(*(Text(cells[i], style=STATUS_STYLE.get(status or "", "dim") if header == "status" else "")
                        for header, cells in shown))
    return table


def fit_title(title: str, width: int | None) -> str:
    """A title within `width` characters, broken between its phrases (after ` / ` and ` + `, before the
    parenthesis, which stays whole), never inside one: a two-sweep board's title wrapped mid-phrase at 80 columns."""
    if width is None or len(title) <= width:
        return title
    head, paren, tail = title.partition(" (")
    lines = [""]
    for piece in re.split(r"(?<=[/+] )", head) + ([paren + tail] if paren else []):
        if lines[-1] and len((lines[-1] + piece).rstrip()) > width:
            lines[-1] = lines[-1].rstrip()
            lines.append(piece.lstrip())
        else:
            lines[-1] += piece
    return "\n".join(lines)


def rich_tables(board: list[LeaderboardRow], title: str, columns: str | Sequence[str] = "core",
                width: int | None = None, ascii_only: bool = False) -> tuple[list[Table], str]:
    """One dataset/model group (named in the title: those two columns are left out) as terminal tables
    that fit `width` characters (None: one table at its natural width). A selection wider than the
    terminal folds into stacked tables, each repeating mechanism and eps target; a column too wide for
    any part is left out. Returns the tables and a note saying how to see the whole table ('' when
    nothing was folded or left out). `ascii_only`: `+-` for `±`."""
    shown = [(h, [cell(r).replace("±", "+-") if ascii_only else cell(r) for r in board])
             for h, cell in display(board, columns, leave_out=("dataset", "model"))]
    statuses = [r.claim_status for r in board]
    if width is None:
        return [_table(title, shown, statuses)], ""
    shown = [c for c in shown if c[0] != "violation"]  # a line under the table each (the CLI): a column of
    # sentences would fold every table
    console = Console(width=10_000)

    def fits(part: Sequence[tuple[str, list[str]]]) -> bool:
        measured = Measurement.get(console, console.options, _table("", part, statuses)).maximum
        return measured <= width

    keys = [c for c in shown if c[0] in KEY_COLUMNS]
    parts, left_out = [list(keys)], []
    for column in (c for c in shown if c[0] not in KEY_COLUMNS):
        if fits(parts[-1] + [column]):
            parts[-1].append(column)
        elif fits(keys + [column]):
            parts.append(keys + [column])
        else:
            left_out.append(column[0])
    # Rich wraps a title at its table's width: broken between phrases at that width instead
    title = fit_title(title, Measurement.get(console, console.options, _table("", parts[0], statuses)).maximum)
    tables = [_table(title if i == 0 else "", part, statuses) for i, part in enumerate(parts)]
    notes = []
    if len(parts) > 1:
        notes.append(f"folded into {len(parts)} tables to fit {width} columns")
    if left_out:
        notes.append(f"left out (too wide for {width} columns): {', '.join(left_out)}")
    note = "; ".join(notes) + ("; --format markdown shows one wide table" if notes else "")
    return tables, note


SHORTEST = 6  # a shortened cell keeps at least this many characters (`fashi…`)


def fitted_table(title: str, columns: Sequence[tuple[str, Sequence[str], int | None]],
                 width: int | None) -> tuple[Table, list[str]]:
    """A compact table of (header, cells, cut) columns within `width` characters (None: natural width):
    columns with `cut` None (keys, numbers, statuses) are never cut; the others are shortened with `…`,
    lowest `cut` first (the widest among equals), and, when that is not enough, left out in the same
    order. Returns the table and the headers left out."""
    def build(cols: Sequence[tuple[str, Sequence[str], int | None]], widths: dict[str, int]) -> Table:
        table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0, 0, 1))
        for header, _, _ in cols:
            table.add_column(header, no_wrap=True, overflow="ellipsis", min_width=widths[header],
                             max_width=widths[header])
        for i in range(len(cols[0][1]) if cols else 0):
            table.add_row(*(Text(cells[i]) for _, cells, _ in cols))
        return table

    natural = {h: max([len(h)] + [len(c) for c in cells]) for h, cells, _ in columns}
    if width is None:
        return build(columns, natural), []
    console = Console(width=10_000)
    kept, left_out = list(columns), []
    while True:
        widths = dict(natural)
        overhead = Measurement.get(console, console.options, build(kept, widths)).maximum - sum(
            widths[h] for h, _, _ in kept)
        excess = sum(widths[h] for h, _, _ in kept) + overhead - width
        while excess > 0:
            cuttable = [(cut, -widths[h], h) for h, _, cut in kept if cut is not None and widths[h] > SHORTEST]
            if not cuttable:
                break
            header = min(cuttable)[2]
            widths[header] -= 1
            excess -= 1
        droppable = sorted((cut, -i) for i, (_, _, cut) in enumerate(kept) if cut is not None)
        if excess <= 0 or not droppable:
            return build(kept, widths), left_out
        left_out.append(kept.pop(-droppable[0][1])[0])


def _multi_sweep(board: list[LeaderboardRow]) -> bool:
    return len({r.sweep for r in board}) > 1


def text_table(board: list[LeaderboardRow], columns: str | Sequence[str] = "all") -> pd.DataFrame:
    """The displayed columns; a `sweep` column first when the rows come from several sweeps."""
    shown = ([("sweep", lambda r: r.sweep or "-")] if _multi_sweep(board) else []) + display(board, columns)
    return pd.DataFrame([{h: cell(r) for h, cell in shown} for r in board], columns=[h for h, _ in shown])


def _markdown_cell(value: Any) -> str:
    """A name is data: HTML in it is escaped as in the HTML outputs (a Markdown viewer renders raw HTML),
    and a `|` would split the cell."""
    return html.escape(str(value)).replace("|", "\\|")


def render(board: list[LeaderboardRow], fmt: str, title: str = "", columns: str | Sequence[str] = "core",
           float_env: str = "none", *, width: str | float | None = None, venue_name: str = DEFAULT_VENUE,
           caption: str | None = None, label: str | None = None) -> str:
    """`columns` (core, privacy, audit, overhead, all; comma-separated) picks the markdown, LaTeX and HTML
    columns; CSV and JSON always hold every leaderboard field (the schema's columns). LaTeX only: `width`
    (single, double or points; default single, double for a `table*`), `venue_name`, `caption`, `label`."""
    if fmt == "json":
        return json.dumps(as_dicts(board), indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        # the leaderboard row's field order (dataset first); the fields are the schema's columns
        names = [f.name for f in dataclasses.fields(LeaderboardRow)]
        pd.DataFrame(as_dicts(board), columns=names).to_csv(buf, index=False)
        return buf.getvalue()
    if fmt == "markdown":
        frame = text_table(board, columns)
        lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
        lines += ["| " + " | ".join(_markdown_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
        return "\n".join(lines) + "\n"
    if fmt == "latex":
        headers = [h for h, _ in display(board, columns)]
        if groups_of(columns) == ("core",):  # the compact table: `runs` with a wider selection only
            headers.remove("runs")
        return tex.latex(board, headers, venue(venue_name), board[0].metric if board else "accuracy",
                         width or ("double" if float_env == "table*" else "single"), float_env, caption, label,
                         intervals="overhead" in groups_of(columns))  # where the spread of step x matters
    if fmt == "html":
        body = text_table(board, columns).to_html(index=False, escape=True, border=0)
        return (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
                f"<style>body{{font-family:sans-serif}}td,th{{padding:4px 8px;text-align:right}}</style>"
                f"<h1>{html.escape(title)}</h1>{body}")
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
