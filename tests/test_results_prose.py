"""docs/results.md's prose quotes its tables: a "What it shows" paragraph (the part that reads numbers off the
table above it) names only numbers that table shows, to the digits it quotes (it said 0.820 and 0.844 beside
the table's 0.8357 and 0.8511, numbers of an earlier run). The paragraphs that also reason with numbers of their
own (differences, times) are not in `QUOTING`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results.md"
BLOCK = re.compile(r"<!-- results: ([\w-]+) -->\n(.*?)<!-- /results -->\n\n(.*?)\n\n", re.S)
NUMBER = re.compile(r"(?<![\w.])(\d+\.\d+)(?![\w.])")


def quoted_mismatches(table: str, paragraph: str) -> list[str]:
    """The paragraph's decimal numbers that no table cell rounds to (at the paragraph's number of decimals)."""
    cells = {float(n) for line in table.splitlines() if line.startswith("| ") for n in NUMBER.findall(line)}
    return [n for n in NUMBER.findall(paragraph)
            if not any(abs(c - float(n)) <= 0.5 * 10 ** -len(n.split(".")[1]) + 1e-12 for c in cells)]


QUOTING = ("quickstart", "gdp", "gredp", "shuffled_dpsgd", "dp_forward")


@pytest.mark.parametrize("name", QUOTING)
def test_the_prose_quotes_its_table(name):
    blocks = {name: (table, paragraph) for name, table, paragraph in BLOCK.findall(RESULTS.read_text())}
    table, paragraph = blocks[name]
    assert paragraph.startswith("What it shows")
    assert quoted_mismatches(table, paragraph) == []


def test_the_check_catches_a_stale_number():
    table = "| d | m | dpsgd | 1 | 0.8357 ± 0.0008 |\n"
    assert quoted_mismatches(table, "Utility: DP-SGD 0.820 at 1.") == ["0.820"]
    assert quoted_mismatches(table, "Utility: DP-SGD 0.836 at 1.") == []
