"""Each command example in the docs is what its command prints now (scripts/doc_examples.py writes them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import doc_examples

FOUND = doc_examples.blocks()
FAST = [n for n, (_, fast) in doc_examples.EXAMPLES.items() if fast]
SLOW = [n for n, (_, fast) in doc_examples.EXAMPLES.items() if not fast]


def test_every_example_is_in_the_docs_and_every_block_is_an_example():
    assert set(FOUND) == set(doc_examples.EXAMPLES)


def check(name: str) -> None:
    body = doc_examples.render(name)
    for page, current in FOUND[name]:
        assert current == body, f"{page.name}: example {name!r} drifted; run python scripts/doc_examples.py {name}"


@pytest.mark.parametrize("name", FAST)
def test_example_prints_what_the_docs_show(name):
    check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_audit_example_prints_what_the_docs_show(name):
    """The mechanism audits of docs/mechanisms.md: full rows at dimension 1000, seconds each."""
    check(name)
