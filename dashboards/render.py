"""Leaderboard output formats: a rich table for people, csv / markdown / latex / json / html for tools."""

from __future__ import annotations

import html
import io
import json
import math
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
    ("eps curve", lambda r: _fmt(r.epsilon_audited_curve)), ("eps noise", lambda r: _fmt(r.epsilon_audited_noise)),
    ("ceiling", lambda r: _fmt(r.audit_ceiling)),
    ("MIA AUC", lambda r: _fmt(r.mia_auc)),
    ("audit x", lambda r: _fmt(r.audit_time_ratio)),
    ("mu claimed/audited", lambda r: f"{_fmt(r.mu_claimed)}/{_fmt(r.mu_audited)}" if r.mu_audited is not None else "-"),
    ("status", lambda r: r.claim_status or "-"),
    ("sigma", lambda r: _fmt(r.sigma)), ("step x", lambda r: _fmt(r.step_time_ratio)),
    ("peak MB", lambda r: _fmt(r.peak_memory_mb, 3)),
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


def _multi_sweep(board: list[LeaderboardRow]) -> bool:
    return len({r.sweep for r in board}) > 1


def text_table(board: list[LeaderboardRow]) -> pd.DataFrame:
    """The displayed columns; a `sweep` column first when the rows come from several sweeps."""
    shown = ([("sweep", lambda r: r.sweep or "-")] if _multi_sweep(board) else []) + DISPLAY
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


LATEX_COLUMNS = [  # (header, alignment, cell); numbers right-aligned
    ("mechanism", "l", lambda r: r"\texttt{" + latex_escape(r.mechanism) + "}"),
    (r"$\varepsilon$ target", "r", lambda r: _latex_num(r.epsilon_target)),
    ("utility", "r", None),
    (r"$\varepsilon$ claimed", "r", lambda r: _latex_num(r.epsilon_claimed)),
    (r"$\varepsilon$ certified", "r", lambda r: _latex_num(r.epsilon_certified)),
    (r"$\varepsilon$ audited", "r", lambda r: _latex_num(r.epsilon_audited)),
    (r"$\varepsilon$ curve", "r", lambda r: _latex_num(r.epsilon_audited_curve)),
    (r"$\varepsilon$ noise", "r", lambda r: _latex_num(r.epsilon_audited_noise)),
    ("ceiling", "r", lambda r: _latex_num(r.audit_ceiling)),
    ("MIA AUC", "r", lambda r: _latex_num(r.mia_auc)),
    ("audit time", "r", lambda r: "--" if r.audit_time_ratio is None else f"{r.audit_time_ratio:.2f}$\\times$"),
    ("status", "l", lambda r: latex_escape(r.claim_status or "--")),
    (r"$\sigma$", "r", lambda r: _latex_num(r.sigma)),
    ("step time", "r", lambda r: "--" if r.step_time_ratio is None else f"{r.step_time_ratio:.2f}$\\times$"),
    ("peak MB", "r", lambda r: _latex_num(r.peak_memory_mb)),
]


def best_utility(board: list[LeaderboardRow]) -> set[int]:
    """Indices of the rows in bold: the highest mean utility among the private rows of each (sweep,
    dataset, model, target epsilon) group that has at least two rows to compare."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(board):
        if r.mechanism != "nonprivate" and r.utility_mean is not None:
            groups.setdefault((r.sweep, r.dataset, r.model, r.epsilon_target), []).append(i)
    return {max(members, key=lambda i: board[i].utility_mean) for members in groups.values() if len(members) > 1}


def latex(board: list[LeaderboardRow], metric: str = "accuracy") -> str:
    """A booktabs `tabular` for a paper (needs `\\usepackage{booktabs}`; compiles with plain pdflatex):
    one block per dataset/model, utility as `$mean \\pm std$`, the best utility per target epsilon in bold."""
    bold = best_utility(board)
    cols = LATEX_COLUMNS
    header = " & ".join(latex_escape(metric) if h == "utility" else h for h, _, _ in cols)
    lines = ["% privbench leaderboard; needs \\usepackage{booktabs}",
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
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


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
        return latex(board, board[0].metric if board else "accuracy")
    if fmt == "html":
        body = text_table(board).to_html(index=False, escape=True, border=0)
        return (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
                f"<style>body{{font-family:sans-serif}}td,th{{padding:4px 8px;text-align:right}}</style>"
                f"<h1>{html.escape(title)}</h1>{body}")
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
