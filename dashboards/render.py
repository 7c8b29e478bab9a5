"""Leaderboard output formats: a rich table for people, csv / markdown / latex / json / html for tools."""

from __future__ import annotations

import dataclasses
import html
import io
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
from rich import box
from rich.table import Table

from dashboards.leaderboard import LeaderboardRow, as_dicts
from storage import schema

FORMATS = ("table", "csv", "markdown", "latex", "json", "html")


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:.3e}"
    return str(x)


def _utility(r: LeaderboardRow) -> str:
    if r.utility_mean is None:
        return "-"
    return f"{r.utility_mean:.4f} ± {r.utility_std:.4f}" if r.utility_std is not None else f"{r.utility_mean:.4f}"


# Cells that are not one number of the row's schema column (every other column: `_fmt` of its value).
CELLS: dict[str, Callable[[LeaderboardRow], str]] = {
    "dataset": lambda r: r.dataset, "model": lambda r: r.model, "mechanism": lambda r: r.mechanism,
    "utility": _utility,
    "mu claimed/audited": lambda r: f"{_fmt(r.mu_claimed)}/{_fmt(r.mu_audited)}" if r.mu_audited is not None else "-",
    # "!": the audited epsilon lies above its ceiling by more than the ceiling's noise (`> ceiling`)
    "status": lambda r: (r.claim_status or "-") + ("!" if r.audit_above_ceiling else ""),
    "> ceiling": lambda r: {True: "yes", False: "no"}.get(r.audit_above_ceiling, "-"),
    "ex/s": lambda r: _fmt(r.examples_per_s, 4),
    "runs": lambda r: f"{r.n_finished}" + (f" ({r.n_failed} failed)" if r.n_failed else ""),
    "pareto": lambda r: "*" if r.pareto else "",
}


def _cell(f: schema.Field) -> Callable[[LeaderboardRow], str]:
    return CELLS.get(f.header or "") or (lambda r: _fmt(getattr(r, f.column)))


def groups_of(columns: str | Sequence[str]) -> tuple[str, ...]:
    """`--columns` ('core', 'audit,overhead', 'all') -> the schema's column groups (core always)."""
    return schema.select(columns) if isinstance(columns, str) else tuple(columns)


def display(board: Sequence[LeaderboardRow], columns: str | Sequence[str] = "core",
            leave_out: Sequence[str] = ()) -> list[tuple[str, Callable[[LeaderboardRow], str]]]:
    """(header, cell) of the text tables' columns: the schema's displayed fields of the chosen groups, in
    its display order; a sparse field (newer than most stores) only when some row has it."""
    groups = groups_of(columns)
    return [(f.header, _cell(f)) for f in schema.displayed()
            if f.group in groups and f.header not in leave_out
            and not (f.sparse and all(getattr(r, f.column) is None for r in board))]


STATUS_STYLE = {"violated": "bold red", "overclaimed": "yellow", "uncertified": "magenta", "ok": "green"}


def rich_table(board: list[LeaderboardRow], title: str, columns: str | Sequence[str] = "core") -> Table:
    """One dataset/model group (named in the title), so those two columns are left out. Columns are
    never cut to `…`: the compact default fits 80 columns, and a wide selection wraps its cells."""
    shown = display(board, columns, leave_out=("dataset", "model"))
    table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0, 0, 1))
    for header, _ in shown:  # "eps certified" over two lines: the numbers under it are short
        table.add_column(header.replace("eps ", "eps\n"), justify="left" if header == "mechanism" else "right",
                         overflow="fold")
    headers = [h for h, _ in shown]
    for r in board:
        cells = [cell(r) for _, cell in shown]
        if "status" in headers:
            i = headers.index("status")
            cells[i] = f"[{STATUS_STYLE.get(r.claim_status or '', 'dim')}]{cells[i]}[/]"
        table.add_row(*cells)
    return table


def _multi_sweep(board: list[LeaderboardRow]) -> bool:
    return len({r.sweep for r in board}) > 1


def text_table(board: list[LeaderboardRow], columns: str | Sequence[str] = "all") -> pd.DataFrame:
    """The displayed columns; a `sweep` column first when the rows come from several sweeps."""
    shown = ([("sweep", lambda r: r.sweep or "-")] if _multi_sweep(board) else []) + display(board, columns)
    return pd.DataFrame([{h: cell(r) for h, cell in shown} for r in board], columns=[h for h, _ in shown])


LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    """Text mode escaping of LaTeX's ten special characters (names like `dp_forward`, `50%`)."""
    return "".join(LATEX_SPECIALS.get(ch, ch) for ch in str(text))


def _latex_num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "--"
    if math.isinf(x):
        return r"$\infty$"
    return f"{x:.{digits}g}" if abs(x) < 1e4 else f"${x:.2e}".replace("e+0", r"\times 10^{").replace(
        "e+", r"\times 10^{") + "}$"


def _latex_utility(r: LeaderboardRow, bold: bool) -> str:
    if r.utility_mean is None:
        return "--"
    body = f"{r.utility_mean:.4f}" + (rf" \pm {r.utility_std:.4f}" if r.utility_std is not None else "")
    return rf"$\mathbf{{{body}}}$" if bold else f"${body}$"


def _times(x: float | None) -> str:
    return "--" if x is None else f"{x:.2f}$\\times$"


# LaTeX header, alignment and cell of a displayed column where they differ from the text tables'
# (numbers right-aligned; the utility cell is `_latex_utility`, bold for the best).
LATEX: dict[str, tuple[str, str, Callable[[LeaderboardRow], str] | None]] = {
    "mechanism": ("mechanism", "l", lambda r: r"\texttt{" + latex_escape(r.mechanism) + "}"),
    "eps target": (r"$\varepsilon$ target", "r", lambda r: _latex_num(r.epsilon_target)),
    "utility": ("utility", "r", None),
    "eps claimed": (r"$\varepsilon$ claimed", "r", lambda r: _latex_num(r.epsilon_claimed)),
    "eps certified": (r"$\varepsilon$ certified", "r", lambda r: _latex_num(r.epsilon_certified)),
    "eps audited": (r"$\varepsilon$ audited", "r", lambda r: _latex_num(r.epsilon_audited)),
    "eps curve": (r"$\varepsilon$ curve", "r", lambda r: _latex_num(r.epsilon_audited_curve)),
    "eps noise": (r"$\varepsilon$ noise", "r", lambda r: _latex_num(r.epsilon_audited_noise)),
    "audit x": ("audit time", "r", lambda r: _times(r.audit_time_ratio)),
    "mu claimed/audited": (r"$\mu$ claimed/audited", "r", lambda r: "--" if r.mu_audited is None
                           else f"{_latex_num(r.mu_claimed)}/{_latex_num(r.mu_audited)}"),
    "status": ("status", "l", lambda r: latex_escape(r.claim_status or "--")),
    "sigma": (r"$\sigma$", "r", lambda r: _latex_num(r.sigma)),
    "step x": ("step time", "r", lambda r: _times(r.step_time_ratio)),
    "mem x": ("memory", "r", lambda r: _times(r.peak_memory_ratio)),
    "runs": ("runs", "r", lambda r: latex_escape(CELLS["runs"](r))),
}
LATEX_LEAVE_OUT = ("dataset", "model", "pareto")  # dataset / model head each block; bold marks the best
FLOATS = ("none", "table", "table*")


def latex_columns(board: Sequence[LeaderboardRow], columns: str | Sequence[str] = "core") -> list[tuple]:
    """(header, alignment, cell) of the chosen columns; `runs` only with a wider selection than core."""
    out = []
    for header, _ in display(board, columns, leave_out=LATEX_LEAVE_OUT):
        if header == "runs" and groups_of(columns) == ("core",):
            continue
        f = next(f for f in schema.displayed() if f.header == header)
        out.append(LATEX.get(header) or (latex_escape(header), "r", lambda r, c=f.column: _latex_num(getattr(r, c))))
    return out


def best_utility(board: list[LeaderboardRow]) -> set[int]:
    """Indices of the rows in bold: the highest mean utility among the private rows of each (sweep,
    dataset, model, target epsilon) group (a lone private row is that group's best)."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(board):
        if r.private and r.utility_mean is not None:
            groups.setdefault((r.sweep, r.dataset, r.model, r.epsilon_target), []).append(i)
    return {max(members, key=lambda i: board[i].utility_mean) for members in groups.values()}


def latex(board: list[LeaderboardRow], metric: str = "accuracy", columns: str | Sequence[str] = "core",
          float_env: str = "none") -> str:
    """A booktabs `tabular` for a paper (needs `\\usepackage{booktabs}` and `graphicx`; compiles with
    plain pdflatex): one block per dataset/model, utility as `$mean \\pm std$`, the best private utility
    per target epsilon in bold. The tabular is shrunk to the line width when wider (never enlarged),
    so it fits a column of a two-column paper; `float_env` wraps it in a `table` or `table*` float."""
    if float_env not in FLOATS:
        raise ValueError(f"unknown float {float_env!r}; known: {', '.join(FLOATS)}")
    bold = best_utility(board)
    cols = latex_columns(board, columns)
    header = " & ".join(latex_escape(metric) if h == "utility" else h for h, _, _ in cols)
    lines = ["% privbench leaderboard; needs \\usepackage{booktabs} and \\usepackage{graphicx}"]
    if float_env != "none":
        lines += [rf"\begin{{{float_env}}}[t]", r"\centering"]
    shrink = r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%"  # never enlarged
    lines += [(r"\noindent" if float_env == "none" else "") + shrink,
              r"\begin{tabular}{" + "".join(a for _, a, _ in cols) + "}", r"\toprule", header + r" \\", r"\midrule"]
    multi = _multi_sweep(board)

    def group_of(r: LeaderboardRow) -> tuple:
        return (r.sweep, r.dataset, r.model) if multi else (r.dataset, r.model)

    firsts = list(dict.fromkeys(group_of(r) for r in board))
    seen: list[tuple] = []
    for i in sorted(range(len(board)), key=lambda i: firsts.index(group_of(board[i]))):  # stable: keeps the rank
        r = board[i]
        group = group_of(r)
        if group not in seen:
            if seen:
                lines.append(r"\midrule")
            seen.append(group)
            title = " / ".join(latex_escape(g) for g in group if g)
            lines.append(rf"\multicolumn{{{len(cols)}}}{{l}}{{\textit{{{title}}}}} \\")
        cells = [_latex_utility(r, i in bold) if cell is None else cell(r) for _, _, cell in cols]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}}"]
    if float_env != "none":
        lines.append(rf"\end{{{float_env}}}")
    return "\n".join(lines) + "\n"


def _markdown_cell(value: Any) -> str:
    """A name is data: HTML in it is escaped as in the HTML outputs (a Markdown viewer renders raw HTML),
    and a `|` would split the cell."""
    return html.escape(str(value)).replace("|", "\\|")


def render(board: list[LeaderboardRow], fmt: str, title: str = "", columns: str | Sequence[str] = "core",
           float_env: str = "none") -> str:
    """`columns` (core, privacy, audit, overhead, all; comma-separated) picks the markdown, LaTeX and HTML
    columns; CSV and JSON always hold every leaderboard field (the schema's columns)."""
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
        return latex(board, board[0].metric if board else "accuracy", columns, float_env)
    if fmt == "html":
        body = text_table(board, columns).to_html(index=False, escape=True, border=0)
        return (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
                f"<style>body{{font-family:sans-serif}}td,th{{padding:4px 8px;text-align:right}}</style>"
                f"<h1>{html.escape(title)}</h1>{body}")
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
