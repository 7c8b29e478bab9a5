"""`python -m orchestrator` is `privbench` (for environments without the console script on PATH)."""

from orchestrator.cli import app

app(prog_name="privbench")
