"""The files a sweep's parent MLflow run holds after `privbench sweep run`: the leaderboard (CSV and
Markdown), the four figures (PDF for papers, PNG for the MLflow artifact viewer) and `summary.md`, which is
also the experiment's description in the MLflow UI (the sweep's summary, above its trials)."""

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
        fig = figures.build(kind, records, metric)
        for fmt in ("pdf", "png"):
            buf = io.BytesIO()
            figures.save(fig, buf, fmt)  # TrueType fonts in the PDF, as `privbench plot` writes it
            files[f"figures/{kind}.{fmt}"] = buf.getvalue()
    return files


def summary(records: Sequence[Mapping[str, Any]], board: list) -> str:
    """One line that MLflow shows collapsed, then the compact leaderboard."""
    sweeps = sorted({str(r.get("sweep")) for r in records if r.get("sweep")})
    name = ", ".join(sweeps) or "sweep"
    finished = sum(r.get("status") == "finished" for r in records)
    return (f"**{name}**: {len(records)} trials, {finished} finished. Grid, leaderboard and figures: the run "
            f"`{name} (sweep)`, left out of this list.\n\n" + padded(render(board, "markdown")))


PAD = "&ensp;"  # MLflow's Markdown tables have no cell padding: `0.8357 ± 0.0008` beside `1` read `0.00081`


def padded(table: str) -> str:
    """A Markdown table whose cells, header included (`dataset` beside `model` read `datasetmodel`), carry an
    en space on each side; the rule line as it is."""
    lines = table.splitlines()

    def pad(line: str) -> str:
        return "| " + " | ".join(f"{PAD}{c.strip()}{PAD}" for c in line.strip().strip("|").split(" | ")) + " |"

    return "\n".join([pad(lines[0]), lines[1], *map(pad, lines[2:])]) + "\n"
