"""`privbench report`: one self-contained HTML page for one or more sweeps.

The page opens on the leaderboard (its first screen shows numbers), then holds the figures of
`dashboards.figures` as inline SVG (no external file, script or font: it can be mailed or archived as one
file; a figure that would tell nothing, such as a verdicts grid where every verdict is ok, is left out with
one line saying so), one sentence per verdict saying why the row got its `claim_status`, and the grid files
that produced the sweeps. Every number is rounded as the tables round its quantity (`storage.schema`).
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib import rc_context

from dashboards import figures
from dashboards.leaderboard import LeaderboardRow, rows
from dashboards.render import text_table
from storage import schema

AUDIT_BARS = " Shaded bars: from the audited lower bound to the certified upper bound."  # when audits ran
CAPTIONS = {
    "privacy-utility": "Utility against certified epsilon (log scale), mean and std over seeds. Hollow markers: "
                       "the claimed epsilon of the same runs, joined to the certified one; grey band: non-private "
                       "mean ± std; dashed: a mechanism whose claim is not ok.",
    "verdicts": "Claim verdict per mechanism and target epsilon (cells: claimed / certified epsilon).",
    "overhead": "Cost per training step against non-private, each trial's own paired measurement (left; bars: "
                "the mean, the leaderboard's step x) and each trial's extra peak memory in MB (right); dots are "
                "trials in their mechanism's colour, the marker says the target epsilon.",
    "curves": "Per-epoch learning curves, mean over seeds with a ± std band.",
    "tuning": "Tuned cells: test utility of the selected candidate (mean and std over cells) against epsilon: "
              "hollow at one run's certified epsilon, filled at the epsilon including tuning.",
}
# The page fits 1280 px without scrolling sideways: headers wrap (cells do not), and each figure keeps the
# size matplotlib gave it (its text at the size it was set in), shrunk only when the window is narrower.
STYLE = ("body{font-family:system-ui,sans-serif;margin:24px;max-width:1350px;color:#222}"
         "td,th{padding:3px 4px;text-align:right}td{white-space:nowrap}"
         "th{border-bottom:1px solid #888;vertical-align:bottom;font-weight:600}"
         "table{border-collapse:collapse;font-size:12px}tr:nth-child(even){background:#f4f4f4}"
         "figure{margin:16px 0}figure svg{max-width:100%;height:auto}figcaption{font-size:13px;color:#444}"
         "pre{background:#f6f6f6;padding:8px;overflow:auto}li{margin:3px 0}"
         ".ok{color:#007a55}.overclaimed{color:#a86a00}.violated{color:#c03a00}.uncertified{color:#666}")


def _e(x: float | None, key: str = "epsilon_certified") -> str:
    """An epsilon as the tables show it: the schema's digits and rounding (up for upper bounds, down for
    lower ones)."""
    if x is None:
        return "none"
    return "infinite" if math.isinf(x) else schema.shown(x, schema.field("privacy", key))


def _n(x: float, column: str) -> str:
    """A leaderboard number as the tables show it (its field's digits and rounding)."""
    return schema.shown(x, next(f for f in schema.FIELDS if f.column == column))


def verdict_sentence(r: LeaderboardRow) -> str:
    """Why this row has its claim_status, in one sentence with its numbers."""
    target = "" if r.epsilon_target is None else f" at target epsilon {r.epsilon_target:g}"
    where = f"{r.mechanism}{target} ({r.dataset} / {r.model}{', ' + r.sweep if r.sweep else ''})"
    claimed, certified = _e(r.epsilon_claimed, "epsilon_claimed"), _e(r.epsilon_certified)
    audited = _e(r.epsilon_audited, "epsilon_audited")
    if r.claim_status == "ok":  # an audit that did not run is not mentioned
        if r.epsilon_audited is None:
            return f"{where}: ok. The sound bound ({certified}) is at most the claimed epsilon {claimed}."
        return (f"{where}: ok. The sound bound ({certified}) and the audited lower bound ({audited}) are both "
                f"at most the claimed epsilon {claimed}.")
    if r.claim_status == "overclaimed":
        factor = (f", {r.epsilon_certified / r.epsilon_claimed:.2g} times the claim" if r.epsilon_claimed and
                  r.epsilon_certified is not None and math.isfinite(r.epsilon_certified) else "")
        return (f"{where}: overclaimed. Its own analysis claims epsilon {claimed}, but a sound accountant (PLD) on "
                f"the noise the code really adds gives {certified}{factor}.")
    if r.claim_status == "violated":
        step = (f"; one audited step measured mu {_n(r.mu_audited, 'mu_audited')} against the claimed "
                f"{_n(r.mu_claimed, 'mu_claimed')}" if r.mu_audited is not None and r.mu_claimed is not None else "")
        family = [f"{name} {_n(value, column)}" for name, value, column in (
                      ("the noise the run really added gives", r.epsilon_audited_noise, "epsilon_audited_noise"),
                      ("the test against DP-SGD's own curves gives", r.epsilon_audited_curve, "epsilon_audited_curve"))
                  if value is not None and r.epsilon_claimed is not None and value > r.epsilon_claimed]
        run = f"; within the certified family, {' and '.join(family)}" if family else ""
        found = f"; the run's audits found: {r.audit_violation}" if r.audit_violation else ""
        bound = f"the audited lower bound is {audited}" if r.epsilon_audited is not None else "it was audited"
        return (f"{where}: violated. An experiment refutes the claim of epsilon {claimed}: {bound}{run}{found}{step}; "
                f"the sound bound is {certified}.")
    if r.claim_status == "uncertified":
        lower = f"; the audited lower bound is {audited}" if r.epsilon_audited is not None else ""
        return (f"{where}: uncertified. No sound analysis of what the code does is known, so only the claim "
                f"({claimed}) is reported{lower}.")
    return f"{where}: no verdict (no finished private trial)."


def audit_sentence(r: LeaderboardRow) -> str:
    """The audit's other numbers for a row: ceiling, membership inference, cost ('' when none were recorded)."""
    parts = []
    if r.audit_ceiling is not None:
        parts.append(f"the same analysis reaches {_n(r.audit_ceiling, 'audit_ceiling')} on the certified mechanism "
                     "simulated exactly (ceiling)")
    if r.mia_auc is not None:
        tpr = ("" if r.mia_tpr_at_0_1pct_fpr is None else
               f", TPR {_n(r.mia_tpr_at_0_1pct_fpr, 'mia_tpr_at_0_1pct_fpr')} at 0.1% FPR")
        parts.append(f"a loss-threshold membership-inference attack has AUC {_n(r.mia_auc, 'mia_auc')}{tpr}")
    if r.audit_time_ratio is not None and (parts or r.epsilon_audited is not None):  # only for audits that ran
        parts.append(f"the audits cost {_n(r.audit_time_ratio, 'audit_time_ratio')}x the training time")
    return (" Audit: " + "; ".join(parts) + ".") if parts else ""


def _svg(fig: Any, salt: str) -> str:
    """Inline SVG without its metadata block; each figure gets its own id salt so ids cannot collide."""
    with rc_context({"svg.hashsalt": salt}):
        text = figures.svg_text(fig)
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)


NOT_MEASURED = "not measured"  # a private row with no paired step measurement (never two trials' medians)


def step_x(r: LeaderboardRow) -> str:
    """`step x` with its 95% interval where the spread matters (`1.64 (1.50-1.81)`), or why there is no number."""
    if r.step_time_ratio is None:
        return NOT_MEASURED if r.private and r.n_finished else "-"
    low, high = r.step_time_ratio_low, r.step_time_ratio_high
    ratio = _n(r.step_time_ratio, "step_time_ratio")
    if low is None or high is None:
        return ratio
    return f"{ratio} ({_n(low, 'step_time_ratio_low')}-{_n(high, 'step_time_ratio_high')})"


def _tables(board: list[LeaderboardRow]) -> str:
    """Every leaderboard column, in two tables so the page stays within 1280 px: privacy and audits, then
    the costs (each row named again by its sweep, dataset, model, mechanism and target)."""
    overhead = {f.header for f in schema.FIELDS if f.group == "overhead"} | {"step x", "runs"}
    names = {"sweep", "dataset", "model", "mechanism", "eps target"}
    frame = text_table(board, "all")
    frame["step x"] = [step_x(r) for r in board]
    main = frame[[c for c in frame.columns if c not in overhead or c == "step x"]]
    cost = frame[[c for c in frame.columns if c in names or c in overhead]]
    return (main.to_html(index=False, escape=True, border=0, classes="leaderboard")
            + "<h2>Cost</h2>" + cost.to_html(index=False, escape=True, border=0, classes="leaderboard cost"))


def report(records: Sequence[Mapping[str, Any]], sweeps: Sequence[str], grids: Mapping[str, str] | None = None,
           *, metric: str = "accuracy") -> str:
    board = rows(records, metric=metric)
    title = "privbench report: " + ", ".join(sweeps)
    audited = any(r.epsilon_audited is not None or r.audit_ceiling is not None for r in board)
    audits = ("<b>audited</b>: an empirical 95% lower bound from canaries; <b>curve</b> / <b>noise</b>: lower "
              "bounds that assume the run is DP-SGD-shaped as certified (noise multiplier unknown); <b>ceiling</b>: "
              "what the audit's analysis reaches on the certified mechanism simulated exactly; <b>audit x</b>: run "
              "time with the audits over without; " if audited else "")  # nothing about audits that did not run
    parts = [f"<!doctype html><html lang='en'><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{STYLE}</style><h1>{html.escape(title)}</h1>",
             f"<p>{len(records)} trials ({sum(r.get('status') == 'finished' for r in records)} finished). Rows whose "
             "status is <b>ok</b> are ranked first, by utility at equal certified epsilon; the others follow, "
             "their status in words, never ranked or marked. <b>claimed</b>: the mechanism's own published analysis; "
             f"<b>certified</b>: a sound upper bound (PLD) on the noise the code adds; {audits}<b>step x</b>: a "
             "private step's time over a non-private one's, taken in turns in the trial, with its 95% interval "
             f"({NOT_MEASURED}: the trial has no such measurement).</p>",
             "<h2>Leaderboard</h2>", _tables(board), "<h2>Figures</h2>"]
    tuned = any((r.get("config") or {}).get("tuning") for r in records)
    for kind in ("privacy-utility", *((figures.TUNING_KIND,) if tuned else ()), "verdicts", "overhead", "curves"):
        why_not = figures.uninformative(kind, records)
        if why_not:
            parts.append(f"<p class='skipped' id='fig-{kind}-skipped'>{html.escape(why_not)}</p>")
            continue
        fig = figures.build(kind, records, metric)
        caption = CAPTIONS[kind] + (AUDIT_BARS if audited and kind == "privacy-utility" else "")
        parts.append(f"<figure id='fig-{kind}' class='figure'>{_svg(fig, 'privbench-' + kind)}"
                     f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts += ["<h2>Verdicts</h2><ul class='verdicts'>"]
    for r in board:
        if r.private:
            text = html.escape(verdict_sentence(r) + audit_sentence(r))
            parts.append(f"<li class='{html.escape(r.claim_status or 'none')}'>{text}</li>")
    parts.append("</ul><h2>Grid files</h2>")
    for name in sweeps:
        text = (grids or {}).get(name) or "(grid not stored)"
        parts.append(f"<h3>{html.escape(name)}</h3><pre class='grid'>{html.escape(text)}</pre>")
    return "".join(parts) + "</html>\n"
