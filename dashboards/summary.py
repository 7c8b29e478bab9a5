"""The files a sweep's parent MLflow run holds after `privbench sweep run`: the leaderboard (CSV and
Markdown), the figures as PNG for MLflow's artifact viewer and `summary.md`, which is also the experiment's
description in the MLflow UI (the sweep's summary, above its trials).

The figures are drawn at the end of every `sweep run`, so they cost what the sweep's end costs: PNG only (a PDF
with embedded fonts took 2.7 of 3.8 CPU s for the four; `privbench plot` writes the PDFs for papers), and a
figure that would tell nothing (`figures.uninformative`: every verdict `ok`) is left out, as the report does."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

from dashboards import figures
from dashboards.leaderboard import rows
from dashboards.render import render


def sweep_files(records: Sequence[Mapping[str, Any]], metric: str = "accuracy") -> dict[str, bytes | str]:
    board = rows(records, metric=metric)
    files: dict[str, bytes | str] = {"leaderboard.csv": render(board, "csv"),
                                     "leaderboard.md": render(board, "markdown", columns="all"),
                                     "summary.md": summary(records, board)}
    for kind in figures.KINDS:
        if figures.uninformative(kind, records) is None:
            buf = io.BytesIO()
            figures.save(figures.build(kind, records, metric), buf, "png")
            files[f"figures/{kind}.png"] = buf.getvalue()
    return files


def summary(records: Sequence[Mapping[str, Any]], board: list) -> str:
    """One line that MLflow shows collapsed, then the compact leaderboard (its `ok` rows first). The line is plain
    text: MLflow's experiments list shows a description as it is written (`**quickstart**: ...` read with its
    asterisks), its experiment page renders the Markdown below it."""
    sweeps = sorted({str(r.get("sweep")) for r in records if r.get("sweep")})
    name = ", ".join(sweeps) or "sweep"
    finished = sum(r.get("status") == "finished" for r in records)
    return (f"{name}: {len(records)} trials, {finished} finished. Grid, leaderboard and figures: the run "
            f"\"{name} (sweep)\", left out of this list.\n\n" + padded(render(board, "markdown")))


PAD = "&ensp;"  # MLflow's Markdown tables have no cell padding: `0.8357 ± 0.0008` beside `1` read `0.00081`


def padded(table: str) -> str:
    """A Markdown table whose cells, header included (`dataset` beside `model` read `datasetmodel`), carry an
    en space on each side; the rule line as it is."""
    lines = table.splitlines()

    def pad(line: str) -> str:
        return "| " + " | ".join(f"{PAD}{c.strip()}{PAD}" for c in line.strip().strip("|").split(" | ")) + " |"

    return "\n".join([pad(lines[0]), lines[1], *map(pad, lines[2:])]) + "\n"
