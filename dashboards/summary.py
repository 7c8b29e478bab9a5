"""The files a sweep's parent MLflow run holds after `privbench sweep run`: the leaderboard (CSV and
Markdown) and the four figures (PDF for papers, PNG for the MLflow artifact viewer)."""

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
                                     "leaderboard.md": render(board, "markdown", columns="all")}
    for kind in figures.KINDS:
        fig = figures.build(kind, records, metric)
        for fmt in ("pdf", "png"):
            buf = io.BytesIO()
            figures.save(fig, buf, fmt)  # TrueType fonts in the PDF, as `privbench plot` writes it
            files[f"figures/{kind}.{fmt}"] = buf.getvalue()
    return files
