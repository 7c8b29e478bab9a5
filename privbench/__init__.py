"""privbench's Python API: run, resume and read sweeps from a script or a notebook (docs/api.md).

    from privbench import Sweep
    sweep = Sweep("grid.yaml", store="privbench-store")
    summary = sweep.run()            # the trials the ledger does not mark finished
    sweep.leaderboard()              # a pandas DataFrame

Importing this package imports neither torch, Ray nor MLflow: they load when a sweep runs or is read.
"""

from orchestrator.runner import Callback, SweepError, SweepSummary, load_grid
from privbench.api import Sweep, run_sweep, sweeps

__all__ = ["Callback", "Sweep", "SweepError", "SweepSummary", "load_grid", "run_sweep", "sweeps"]
