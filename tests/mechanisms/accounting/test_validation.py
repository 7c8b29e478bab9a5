"""`require_delta` is the one range check of delta: its ranges, its messages, and that no other place repeats it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from mechanisms.accounting.validation import require_delta
from tests.test_import_cycles import PACKAGES

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("flags", "inside", "outside", "shown"), [
    ({}, [1e-9, 0.5, 1 - 1e-12], [0, 1, -1e-5, 1.5, math.nan], "(0, 1)"),
    ({"zero": True, "one": True}, [0, 0.5, 1], [-1e-9, 1 + 1e-9, math.nan], "[0, 1]"),
    ({"one": True}, [1e-9, 1], [0, 1.5], "(0, 1]"),
    ({"zero": True, "name": "delta_step"}, [0, 0.5], [1, -1], "[0, 1)"),
])
def test_each_range_accepts_its_inside_and_names_itself_outside(flags, inside, outside, shown):
    for value in inside:
        assert require_delta(value, **flags) == float(value)
    name = flags.get("name", "delta")
    for value in outside:
        with pytest.raises(ValueError, match=re.escape(f"{name} must lie in {shown}, got {value}")):
            require_delta(value, **flags)


def test_numpy_scalars_and_text():
    assert require_delta(np.float32(0.25)) == 0.25
    with pytest.raises(ValueError, match="delta must lie in"):
        require_delta("1e-5")  # type: ignore[arg-type]


def test_no_other_place_checks_the_range_of_delta():
    """A message of the range check anywhere but validation.py means a second rule that may drift."""
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name != "validation.py" and re.search(r"delta\w* must lie", path.read_text()):
                found.append(str(path.relative_to(ROOT)))
    assert found == []
