"""What the MLflow UI shows first for a sweep: its trials, with the values that compare them, rounded.

MLflow 3's runs table shows no param or metric column until a user picks them, shows metrics unrounded
(7.999424731…), and keeps the pick in the browser. So every trial run also carries its leaderboard's core
values as display params, rounded as privbench prints them (`display_params`: `eps tgt.`, the utility
`acc.`, `eps cert.`, `eps aud.`, `status`), and the experiment carries a view of them: the columns eps tgt.,
acc., eps cert., eps aud., status first, then seed, dataset and model (the run name, which MLflow pins
to the left, leads with the mechanism), and a search that lists the trials only (the sweep's own run, which
holds its grid, leaderboard and figures, is not a trial). MLflow's "share view" reads that view from the
experiment tag `mlflow.sharedViewState.<key>` when a link carries `viewStateShareKey=<key>`; `privbench ui`
also makes it the browser's first view of the experiment (dashboards/ui.py). A trial's run page gets a
description that groups its numbers (`trial_summary`); the experiment's description is the sweep's
leaderboard (`sweep_summary`).

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
UTILITY_FIELD = schema.utility_field(UTILITY)  # written as every output writes it (in %: 83.6)


def _display_name(header: str) -> str:
    """A display param's name: the schema's short form of the header (`eps cert.`, the utility's `acc.`), as
    narrow LaTeX tables write it, which a runs-table column header shows whole."""
    f = UTILITY_FIELD if header == "utility" else schema.by_header(header)
    return f.abbr or header


# (kind, name, width in px): what compares trials, in this order. MLflow's runs table gives a column the width
# its view names, whatever its header or values hold, and cuts the rest (`eps certifie`, `overclaim…`,
# `fashion-…`). At 1400 px, MLflow's sidebar, checkboxes, run name (190 px, pinned) and creation time (150 px)
# leave `ROOM_PX`: so no mechanism column (the run name leads with it, whole: storage/mlflow_sink.py), the
# epsilons and the utility under the schema's short headers, and each width the widest of its header and its
# values, measured in Chromium (tests/dashboards/test_mlflow_ui.py): every status word, a number such as
# 123.46, a registered dataset or model name of up to `NAME_CHARS` characters (`scatternet-linear`).
ROOM_PX = 733
SCROLLBAR_PX = 15  # left free for the vertical scrollbar of a long list of trials
NAME_CHARS = 17  # the longest mechanism, dataset or model name shown whole (`dpsgd-shuffle-rdp`, in the run name)
WIDTHS = {"eps target": 80, "utility": 60, "eps certified": 86, "eps audited": 84, "status": 100}
RUNS_VIEW_COLUMNS = (*(("params", _display_name(h), WIDTHS[h]) for h in DISPLAY_HEADERS),
                     ("params", "seed", 58), ("params", "dataset", 124), ("params", "model", 126))


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
