"""scripts/results.py says where its numbers were taken (issue 48, 8): the README's `step x` of 1.14 read 1.58 on
a newcomer's 2-core machine, and the block said only "2 CPU cores, no GPU, load average 1.9 at the end"."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_machine_line_names_the_cpu_its_memory_and_the_load_before_and_after():
    spec = importlib.util.spec_from_file_location("results_script", ROOT / "scripts" / "results.py")
    results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results)
    line = results.machine(3.25)
    assert line.startswith(f"{os.cpu_count()} cores of ")
    assert re.search(r", \d+ GiB, ", line) and "load average 3.2 before and " in line and line.endswith("at the end")
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), None)
    assert model is None or model in line
