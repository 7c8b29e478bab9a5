"""What the MLflow UI shows first for a sweep: its trials, with the params and metrics that compare them.

MLflow 3's runs table shows no param or metric column until a user picks them, and the pick lives in the
browser. Its "share view" feature reads a view (selected columns, search facets) from an experiment tag
`mlflow.sharedViewState.<key>` when the page's URL carries `viewStateShareKey=<key>`: every sweep's
experiment gets the view below under `RUNS_VIEW_KEY`, and the link `privbench ui` prints names it.

Column ids are MLflow's canonical keys: `params.`name``, `metrics.`name``, `tags.`name``,
`attributes.`Label``. The names are the trial run's: flattened config params (`mechanism`, `epsilon`,
...), the record's metrics and privacy numbers, and the `claim_status` tag (a string: tags show it).

A leaf module (no MLflow import): the store writes the tag, the UI command builds the link.
"""

from __future__ import annotations

import json

RUNS_VIEW_KEY = "privbench-trials"
RUNS_VIEW_TAG = f"mlflow.sharedViewState.{RUNS_VIEW_KEY}"

# (kind, name, width in px): what compares trials, in this order, narrow enough for 1920 px beside MLflow's panels.
RUNS_VIEW_COLUMNS = (
    ("params", "mechanism", 100), ("params", "epsilon", 70), ("params", "seed", 60), ("params", "dataset", 75),
    ("params", "model", 70), ("metrics", "accuracy", 80), ("metrics", "epsilon_certified", 120),
    ("metrics", "epsilon_audited", 110), ("tags", "claim_status", 100),
)


def runs_view() -> str:
    """The shared view's JSON: MLflow merges it over its defaults (other UI state stays the default);
    widths apply only to columns that `columnOrder` names."""
    ids = [f"{kind}.`{name}`" for kind, name, _ in RUNS_VIEW_COLUMNS]
    widths = {i: width for i, (_, _, width) in zip(ids, RUNS_VIEW_COLUMNS, strict=True)}
    return json.dumps({"selectedColumns": ids, "columnOrder": ids, "columnWidths": widths})
