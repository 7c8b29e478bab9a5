"""The terminal captures of docs/commands.md (scripts/doc_captures.py) are there for every `--columns` group at
80 and 120 columns, and each is what a terminal of that width shows: no line wider, no cell wrapped or cut,
every part of a folded table repeating the key columns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripts.doc_captures import BLOCK, NAME, PAGE

ROOT = Path(__file__).resolve().parents[2]


def captures() -> dict[str, str]:
    return {name: body for _, name, body, _ in BLOCK.findall(PAGE.read_text())}


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("group", ["core", "privacy", "audit", "overhead", "all"])
def test_each_capture_fits_its_terminal_and_splits_no_cell(group, width):
    body = captures()[f"leaderboard-{group}-{width}"]
    lines = body.strip().removeprefix("```").removesuffix("```").strip("\n").splitlines()
    assert lines[0] == f"$ privbench leaderboard quickstart --columns {group}     # {width} columns"
    shown = lines[1:]
    assert shown and max(len(ln) for ln in shown) <= width and "…" not in body
    parts = [i for i, ln in enumerate(shown) if ln.split()[:1] == ["mechanism"]]
    assert parts, body
    rows = [ln for ln in shown if ln.startswith((" dpsgd", " nonprivate"))]
    keys = {tuple(ln.split()[:2]) for ln in rows}
    assert len(rows) == len(keys) * len(parts)  # each row once per part: nothing wrapped onto a second line
    assert all(len(ln.split()) >= 2 for ln in rows)  # a part may end in a blank cell (a row off the Pareto front)
    if group == "core":
        assert len(parts) == 1  # the default fits one table at 80 columns


def test_every_capture_name_is_a_group_and_width():
    names = list(captures())
    assert len(names) == 10 and all(NAME.fullmatch(n) for n in names)
    assert re.search(r"python scripts/doc_captures.py --store DIR", PAGE.read_text())
