"""What the MLflow UI shows first for a sweep: its trials, with the values that compare them, rounded.

MLflow 3's runs table shows no param or metric column until a user picks them, shows metrics unrounded
(7.999424731…), and keeps the pick in the browser. So every trial run also carries its leaderboard's core
values as display params, rounded as privbench prints them (`display_params`: `eps target`, the utility,
`eps certified`, `eps audited`, `status`), and the experiment carries a view of them: the columns mechanism,
eps target, accuracy, eps certified, eps audited, status first, then seed, dataset and model, and a search
that lists the trials only (the sweep's own run, which holds its grid, leaderboard and figures, is not a
trial). MLflow's "share view" reads that view from the experiment tag `mlflow.sharedViewState.<key>` when
a link carries `viewStateShareKey=<key>`; `privbench ui` also makes it the browser's first view of the
experiment (dashboards/ui.py). A trial's run page gets a description that groups its numbers
(`trial_summary`); the experiment's description is the sweep's leaderboard (`sweep_summary`).

Column ids are MLflow's canonical keys: `params.`name``, `metrics.`name``, `tags.`name``.

A leaf module (no MLflow import; the schema only): the store writes the tags and params, the UI command
builds the link and the browser's defaults.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from storage import schema

RUNS_VIEW_KEY = "privbench-trials"
RUNS_VIEW_TAG = f"mlflow.sharedViewState.{RUNS_VIEW_KEY}"
NOTE_TAG = "mlflow.note.content"  # MLflow's description of a run or an experiment (Markdown)
UTILITY = "accuracy"  # the utility a trial run's display params show (the leaderboard's default metric)
# The core leaderboard columns a single trial has (its runs count and step ratio are the sweep's).
DISPLAY_HEADERS = ("eps target", "utility", "eps certified", "eps audited", "status")
UTILITY_FIELD = schema.utility_field(UTILITY)  # written as every output writes it (a fraction, 0.8357)


def _display_name(header: str) -> str:
    return UTILITY if header == "utility" else header


# (kind, name, width in px): what compares trials, in this order; all nine fit a 1400 px window beside MLflow's
# sidebar, run name and creation time (at 95 px for each number, `model` was off-screen), each as wide as its
# header and its longest usual value (`dpsgd-shuffle-rdp`, `overclaimed`).
WIDTHS = {"eps target": 70, "utility": 70, "eps certified": 90, "eps audited": 85, "status": 95}
RUNS_VIEW_COLUMNS = (("params", "mechanism", 125), *(("params", _display_name(h), WIDTHS[h]) for h in DISPLAY_HEADERS),
                     ("params", "seed", 45), ("params", "dataset", 95), ("params", "model", 85))


def trials_filter(trial_key_tag: str) -> str:
    """The search that lists a sweep's trials: runs carrying a trial key (not the sweep's own run)."""
    return f"tags.`{trial_key_tag}` LIKE '%'"


def runs_view(trial_key_tag: str) -> str:
    """The view's JSON: MLflow merges it over its defaults (other UI state stays the default); widths apply
    only to columns that `columnOrder` names."""
    ids = [f"{kind}.`{name}`" for kind, name, _ in RUNS_VIEW_COLUMNS]
    widths = {i: width for i, (_, _, width) in zip(ids, RUNS_VIEW_COLUMNS, strict=True)}
    return json.dumps({"selectedColumns": ids, "columnOrder": ids, "columnWidths": widths,
                       "searchFilter": trials_filter(trial_key_tag)})


def _shown(value: Any, f: schema.Field) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, int | float):
        return "-" if value is None else str(value)
    return "inf" if math.isinf(value) else schema.shown(float(value), f)


def _fields(record: Mapping[str, Any]) -> dict[str, tuple[Any, schema.Field]]:
    """The record's value and schema field of each displayed leaderboard header a single trial has."""
    sections = {"config": record.get("config") or {}, "metrics": record.get("metrics") or {},
                "privacy": record.get("privacy") or {}}
    out = {}
    for f in schema.displayed():
        if f.section in sections:
            out[f.header] = (schema.value(sections[f.section], f), f)
    out["utility"] = (sections["metrics"].get(UTILITY), UTILITY_FIELD)
    return out


def display_params(record: Mapping[str, Any]) -> dict[str, str]:
    """A trial run's core leaderboard values as MLflow params, rounded as privbench prints them (epsilon
    upper bounds up, lower bounds down); `-` where a value does not apply."""
    values = _fields(record)
    out = {}
    for header in DISPLAY_HEADERS:
        value, f = values[header]
        out[_display_name(header)] = _shown(value, f)
    return out


def trial_summary(record: Mapping[str, Any]) -> str:
    """A trial run's description (Markdown), which MLflow shows first on the run's page: its numbers grouped
    as the leaderboard groups its columns (utility, privacy, audit, overhead), rounded, one line each, above
    MLflow's flat list of every metric."""
    values = _fields(record)
    lines = []
    groups = {"utility": ("utility",),
              "privacy": ("eps target", "eps claimed", "eps certified", "eps audited", "status", "sigma"),
              "audit": tuple(f.header for f in schema.displayed() if f.group == "audit"),
              # step x is a core column, and a trial's own measurement (workers/overhead.py)
              "overhead": ("step x", *(f.header for f in schema.displayed() if f.group == "overhead"))}
    for group, headers in groups.items():
        cells = []
        for header in headers:
            if header not in values or values[header][0] is None:
                continue
            value, f = values[header]
            name = UTILITY if header == "utility" else (f.label or header)
            unit = f.unit if f.unit in ("x", "%") else f" {f.unit}" if f.unit else ""
            cells.append(f"{name} **{_shown(value, f)}{unit}**")
        if cells:
            lines.append(f"- {group}: " + ", ".join(cells))
    return "\n".join(lines) + "\n"
