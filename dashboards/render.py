"""Leaderboard output formats: a rich table for people, csv / markdown / latex / json / html for tools."""

from __future__ import annotations

import html
import io
import json
from typing import Any

import pandas as pd
from rich.table import Table

from dashboards.leaderboard import LeaderboardRow, as_dicts

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


DISPLAY = [  # (header, cell)
    ("dataset", lambda r: r.dataset), ("model", lambda r: r.model), ("mechanism", lambda r: r.mechanism),
    ("eps target", lambda r: _fmt(r.epsilon_target)), ("utility", _utility),
    ("eps claimed", lambda r: _fmt(r.epsilon_claimed)), ("eps certified", lambda r: _fmt(r.epsilon_certified)),
    ("eps audited", lambda r: _fmt(r.epsilon_audited)),
    ("mu claimed/audited", lambda r: f"{_fmt(r.mu_claimed)}/{_fmt(r.mu_audited)}" if r.mu_audited is not None else "-"),
    ("status", lambda r: r.claim_status or "-"),
    ("sigma", lambda r: _fmt(r.sigma)), ("step x", lambda r: _fmt(r.step_time_ratio)),
    ("mem x", lambda r: _fmt(r.peak_memory_ratio)), ("ex/s", lambda r: _fmt(r.examples_per_s, 4)),
    ("runs", lambda r: f"{r.n_finished}" + (f" ({r.n_failed} failed)" if r.n_failed else "")),
    ("pareto", lambda r: "*" if r.pareto else ""),
]


STATUS_STYLE = {"violated": "bold red", "overclaimed": "yellow", "uncertified": "magenta", "ok": "green"}


def rich_table(board: list[LeaderboardRow], title: str) -> Table:
    """One dataset/model group (named in the title), so those two columns are left out."""
    shown = [(h, cell) for h, cell in DISPLAY if h not in ("dataset", "model")]
    table = Table(title=title, header_style="bold")
    for header, _ in shown:
        table.add_column(header, justify="left" if header == "mechanism" else "right")
    for r in board:
        cells = [cell(r) for h, cell in shown]
        i = [h for h, _ in shown].index("status")
        cells[i] = f"[{STATUS_STYLE.get(r.claim_status or '', 'dim')}]{cells[i]}[/]"
        table.add_row(*cells)
    return table


def text_table(board: list[LeaderboardRow]) -> pd.DataFrame:
    return pd.DataFrame([{h: cell(r) for h, cell in DISPLAY} for r in board])


def render(board: list[LeaderboardRow], fmt: str, title: str = "") -> str:
    if fmt == "json":
        return json.dumps(as_dicts(board), indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        pd.DataFrame(as_dicts(board)).to_csv(buf, index=False)
        return buf.getvalue()
    if fmt == "markdown":
        frame = text_table(board)
        lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
        lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
        return "\n".join(lines) + "\n"
    if fmt == "latex":
        return text_table(board).to_latex(index=False, escape=True)
    if fmt == "html":
        body = text_table(board).to_html(index=False, escape=True, border=0)
        return (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
                f"<style>body{{font-family:sans-serif}}td,th{{padding:4px 8px;text-align:right}}</style>"
                f"<h1>{html.escape(title)}</h1>{body}")
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
