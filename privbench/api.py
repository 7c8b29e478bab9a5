"""`Sweep`: one sweep of one store, run and read without the CLI.

The driver is `orchestrator.runner` (the CLI's `sweep run` calls it too); reading goes through the
store read-only, as `privbench sweep status` and `privbench leaderboard` do.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import runner
from orchestrator.runner import Callback, SweepError, SweepSummary

if TYPE_CHECKING:
    import pandas as pd

    from orchestrator.grid import GridSpec
    from storage.location import StoreLocation


@contextmanager
def _reading(location: StoreLocation) -> Iterator[Any]:
    """The store opened read-only (nothing created or changed); its errors as `SweepError`s."""
    from storage.errors import StoreError, translated  # lazy: keeps import privbench light
    from storage.store import Store  # lazy: keeps import privbench light

    try:
        with translated(location.display):
            st = Store(location)
        try:
            with translated(st.where):
                yield st
        finally:
            st.close()
    except StoreError as e:
        raise SweepError(str(e)) from None


def sweeps(store: str | Path | None = None, *, ledger: str | None = None) -> list[str]:
    """The names of the sweeps in the store, latest first."""
    with _reading(runner.locate(store, ledger)) as st:
        return st.sweep_names()


class Sweep:
    """A sweep in a store: give a grid to run it (a path, YAML text or a loaded grid), or only its
    `name` to read a sweep that is already there.

    The store is a folder, a postgresql:// URI or an http(s):// MLflow server (default ./privbench-store
    or $PRIVBENCH_STORE), as for the CLI's `--store`; `ledger` and `artifacts` as `--ledger` and
    `--artifacts`; `address` the Ray cluster (default: start a local Ray instance).
    """

    def __init__(self, grid: str | Path | GridSpec | None = None, *, name: str | None = None,
                 store: str | Path | None = None, ledger: str | None = None, artifacts: str | None = None,
                 address: str | None = None) -> None:
        if grid is None and name is None:
            raise SweepError("give the sweep's grid (to run it) or its name (to read it)")
        self.spec = None if grid is None else runner.load_grid(grid)
        if self.spec is not None and name is not None and name != self.spec.name:
            raise SweepError(f"the grid's sweep is {self.spec.name!r}, not {name!r}")
        self.name: str = name if self.spec is None else self.spec.name
        self.location = runner.locate(store, ledger, artifacts)
        self.address = address

    def __repr__(self) -> str:
        return f"Sweep({self.name!r}, store={self.location.display!r})"

    def run(self, *, callbacks: Iterable[Callback] = (), max_concurrent: int | None = None, retries: int = 0,
            steal_leases: bool = False, reconcile: bool = False) -> SweepSummary:
        """Run the trials the ledger does not mark finished (a rerun resumes; with nothing left to do it
        reads only the ledger). Failed trials are recorded and listed in the summary, not raised."""
        if self.spec is None:
            raise SweepError(f"sweep {self.name!r} was opened by name; give its grid to run it")
        return runner.run(self.spec, self.location, address=self.address, max_concurrent=max_concurrent,
                          retries=retries, steal_leases=steal_leases, reconcile=reconcile, callbacks=callbacks)

    def _check(self, st: Any) -> None:
        names = st.sweep_names()
        if self.name not in names:
            raise SweepError(f"unknown sweep {self.name!r}; known: {', '.join(names) or 'none'}")

    def records(self) -> list[dict[str, Any]]:
        """The result records of the sweep's current grid (finished and failed trials), as stored."""
        with _reading(self.location) as st:
            self._check(st)
            return st.records(self.name)

    def counts(self) -> dict[str, int]:
        """Trials per status: finished, failed, pending, running, superseded."""
        with _reading(self.location) as st:
            self._check(st)
            return st.status_counts(self.name)

    def status(self) -> pd.DataFrame:
        """One row per trial, as `privbench sweep status --json` lists them."""
        import pandas as pd  # lazy: heavy (pandas)

        with _reading(self.location) as st:
            self._check(st)
            rows = runner.trial_rows(st, self.name)
        return pd.DataFrame(rows, columns=list(runner.TRIAL_COLUMNS))

    def results(self) -> pd.DataFrame:
        """One row per result record, nested sections flattened (`metrics.accuracy`,
        `privacy.epsilon_certified`, ...)."""
        import pandas as pd  # lazy: heavy (pandas)

        return pd.json_normalize(self.records(), sep=".")

    def leaderboard(self, metric: str = "accuracy", view: str = "certified") -> pd.DataFrame:
        """Mean and std over seeds per (dataset, model, mechanism, epsilon) with the three epsilons,
        ranked as `privbench leaderboard` ranks them (view: certified or claimed)."""
        import pandas as pd  # lazy: heavy (pandas)

        from dashboards import leaderboard as lb  # lazy: keeps import privbench light

        if view not in lb.VIEWS:
            raise SweepError(f"unknown view {view!r}; known: {', '.join(lb.VIEWS)}")
        board = lb.rows(self.records(), metric=metric, view=view)
        return pd.DataFrame(lb.as_dicts(board), columns=list(lb.LeaderboardRow.__dataclass_fields__))


def run_sweep(grid: str | Path | GridSpec, store: str | Path | None = None, *, address: str | None = None,
              callbacks: Iterable[Callback] = (), ledger: str | None = None, artifacts: str | None = None,
              **options: Any) -> SweepSummary:
    """`Sweep(grid, store=..., address=...).run(callbacks=..., **options)` in one call; `options` are
    `max_concurrent`, `retries`, `steal_leases` and `reconcile`."""
    sweep = Sweep(grid, store=store, ledger=ledger, artifacts=artifacts, address=address)
    return sweep.run(callbacks=callbacks, **options)


__all__ = ["Sweep", "run_sweep", "sweeps"]
