"""The worked example of docs/mechanisms.md ("Adding a mechanism") runs as printed."""

from __future__ import annotations

import re
from pathlib import Path

import mechanisms
from mechanisms.framework import registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "mechanisms.md"


def test_the_worked_example_builds_plans_and_trains_the_planned_steps():
    text = DOC.read_text()
    section = text[text.index("**Adding a mechanism.**"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    try:
        namespace: dict = {}
        exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - the documented code, verbatim
        plan = namespace["plan"]
        assert plan.steps == 20 and plan.effective_event.event.event.noise_multiplier == 0.5
        assert round(plan.epsilon_certified, 1) == 15.6
    finally:
        if "scaled-dpsgd" in mechanisms.names():
            registry.unregister("scaled-dpsgd")
    assert "scaled-dpsgd" not in mechanisms.names()
