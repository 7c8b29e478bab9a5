"""`privbench report`: one self-contained HTML page, the leaderboard plus a privacy/utility plot per
dataset/model (inline SVG: no plotting library, no external files)."""

from __future__ import annotations

import html
import math

from dashboards.leaderboard import LeaderboardRow
from dashboards.render import text_table

W, H, PAD = 560, 320, 48
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]


def scatter(rows: list[LeaderboardRow], title: str) -> str:
    """Utility against epsilon: filled marker at the certified epsilon, hollow at the claimed one."""
    pts = [(r, e) for r in rows for e in (r.epsilon_certified, r.epsilon_claimed)
           if r.utility_mean is not None and e is not None and math.isfinite(e)]
    if not pts:
        return ""
    xs = [math.log10(e) for _, e in pts]
    ys = [r.utility_mean for r, _ in pts]
    x0, x1 = min(xs) - 0.1, max(xs) + 0.1
    y0, y1 = min(ys) - 0.02, max(ys) + 0.02

    def sx(x: float) -> float:
        return PAD + (x - x0) / (x1 - x0) * (W - 2 * PAD)

    def sy(y: float) -> float:
        return H - PAD - (y - y0) / (y1 - y0) * (H - 2 * PAD)

    mechanisms = sorted({r.mechanism for r, _ in pts})
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}'>",
             f"<text x='{W / 2}' y='16' text-anchor='middle' font-size='13'>{html.escape(title)}</text>",
             f"<line x1='{PAD}' y1='{H - PAD}' x2='{W - PAD}' y2='{H - PAD}' stroke='black'/>",
             f"<line x1='{PAD}' y1='{PAD}' x2='{PAD}' y2='{H - PAD}' stroke='black'/>",
             f"<text x='{W / 2}' y='{H - 12}' text-anchor='middle' font-size='11'>epsilon (log scale; filled: "
             "certified, hollow: claimed)</text>",
             f"<text x='12' y='{H / 2}' font-size='11' transform='rotate(-90 12 {H / 2})'>utility</text>"]
    for k in range(math.floor(x0), math.ceil(x1) + 1):
        if x0 <= k <= x1:
            parts.append(f"<text x='{sx(k)}' y='{H - PAD + 14}' text-anchor='middle' font-size='10'>{10**k:g}</text>")
    for y in (y0 + 0.02, (y0 + y1) / 2, y1 - 0.02):
        parts.append(f"<text x='{PAD - 4}' y='{sy(y) + 3}' text-anchor='end' font-size='10'>{y:.3f}</text>")
    for r in rows:
        if r.utility_mean is None:
            continue
        colour = COLOURS[mechanisms.index(r.mechanism) % len(COLOURS)] if r.mechanism in mechanisms else "grey"
        for eps, fill in ((r.epsilon_certified, colour), (r.epsilon_claimed, "white")):
            if eps is not None and math.isfinite(eps):
                parts.append(f"<circle cx='{sx(math.log10(eps)):.1f}' cy='{sy(r.utility_mean):.1f}' r='5' "
                             f"fill='{fill}' stroke='{colour}' stroke-width='2'><title>{html.escape(r.mechanism)} "
                             f"target {r.epsilon_target}: {r.utility_mean:.4f} at eps {eps:.3g}</title></circle>")
    for i, m in enumerate(mechanisms):
        parts.append(f"<text x='{W - PAD}' y='{PAD + 14 * i}' text-anchor='end' font-size='11' "
                     f"fill='{COLOURS[i % len(COLOURS)]}'>{html.escape(m)}</text>")
    return "".join(parts) + "</svg>"


def report(board: list[LeaderboardRow], sweep: str) -> str:
    groups = sorted({(r.dataset, r.model) for r in board})
    plots = "".join(scatter([r for r in board if (r.dataset, r.model) == g], f"{g[0]} / {g[1]}") for g in groups)
    table = text_table(board).to_html(index=False, escape=True, border=0)
    return (f"<!doctype html><meta charset='utf-8'><title>privbench report: {html.escape(sweep)}</title>"
            "<style>body{font-family:sans-serif;margin:24px}td,th{padding:3px 8px;text-align:right}"
            "table{border-collapse:collapse}tr:nth-child(even){background:#f4f4f4}</style>"
            f"<h1>privbench report: {html.escape(sweep)}</h1>"
            "<p>Ranked by utility at equal certified epsilon. claimed: the mechanism's own analysis; certified: "
            "PLD on the noise the code adds; audited: a 95% empirical lower bound.</p>"
            f"{table}<h2>Privacy / utility</h2>{plots}")
