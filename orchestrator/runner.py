"""The sweep driver as a library: what `privbench sweep run` does, without the terminal.

`run` resolves the store, checks it before Ray starts, ends early when the ledger says there is nothing
to do, connects to Ray, opens the sweep, and runs the trials it can claim: it records each result,
renews its leases while it runs, checks that the store is still the one it opened, and returns a
`SweepSummary`. What a user sees is a `Callback` (the CLI's progress bars are one, a notebook may pass
its own), as in Ray Tune's callbacks and benchopt's runner. Problems are `SweepError`s carrying the exit
code the CLI uses: 2 for bad input or a store or cluster that cannot be used (nothing written), 1 for a
store lost mid-sweep (what was recorded is kept; a rerun resumes).

Heavy modules (Ray, MLflow, torch) are imported when a sweep runs, not when this module is imported.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec, TrialSet
    from storage.location import StoreLocation
    from workers.config import TrialConfig


class SweepError(Exception):
    """A sweep that cannot run or did not complete: one line per problem, and the CLI's exit code."""

    def __init__(self, message: str, *, code: int = 2, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.problems = tuple(problems) or (message,)


@dataclasses.dataclass(frozen=True)
class SweepSummary:
    """What one `run` did and left.

    `counts` are the ledger's trial statuses after the run. `failures` are the result records of the
    trials that failed in this run; `skipped` the trial keys another driver ran at the same time.
    `not_run` trials are still pending or running; `leased_by` names the drivers that hold them.
    `running_elsewhere`: those drivers are alive and record them; otherwise `not_run_message` says why
    and when the trials can be run (leased by a driver that seems dead, or left for a rerun).
    `nothing_to_do`: the ledger alone showed every trial finished, so neither Ray nor MLflow was started.
    """

    sweep: str
    store: str
    trials: int
    finished_before: int
    started: int
    counts: Mapping[str, int]
    failures: tuple[Mapping[str, Any], ...] = ()
    skipped: tuple[str, ...] = ()
    not_run: int = 0
    not_run_message: str | None = None
    running_elsewhere: bool = False
    leased_by: tuple[str, ...] = ()
    nothing_to_do: bool = False

    @property
    def ok(self) -> bool:
        """No trial failed, and every trial is finished or being run by a live driver that records it."""
        return not self.failures and (not self.not_run or self.running_elsewhere)


class Callback:
    """What a driver reports while a sweep runs; override the hooks you need (each does nothing here).

    Hooks run in the driver's thread, between Ray polls: a slow hook delays recording and lease renewal.
    """

    def on_sweep_start(self, spec: GridSpec, todo: TrialSet, max_concurrent: int, store: str) -> None:
        """The sweep is open in the store; `todo` are the trials this run will try, in order (counted with `len`,
        read by iterating: they stream from the grid and the ledger, as the driver reads them)."""

    def on_trial_start(self, config: TrialConfig) -> None:
        """This driver claimed the trial and starts it."""

    def on_trial_skipped(self, config: TrialConfig) -> None:
        """Another driver runs the trial (or just finished it); this run leaves it."""

    def on_trial_progress(self, key: str, done: int, total: int, info: Mapping[str, Any]) -> None:
        """A running trial's training progress (`info`: epoch, loss), at most every half second."""

    def on_trial_result(self, record: Mapping[str, Any], run_id: str | None) -> None:
        """The trial's result record is in the ledger (`run_id` its MLflow run); `run_id` None: another
        driver took the trial over and its result was not kept."""

    def on_sweep_end(self, summary: SweepSummary) -> None:
        """The run is over (also when there was nothing to do)."""

    def on_warning(self, message: str) -> None:
        """Something went wrong that does not fail the sweep (e.g. its summary files were not stored)."""


class _All(Callback):
    """Every callback, in the order given (an object without a hook is skipped for that hook)."""

    def __init__(self, callbacks: Iterable[Callback]) -> None:
        self.callbacks = list(callbacks)

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("on_"):
            return object.__getattribute__(self, name)

        def call(*args: Any, **kwargs: Any) -> None:
            for cb in object.__getattribute__(self, "callbacks"):
                hook = getattr(cb, name, None)
                if hook is not None:
                    hook(*args, **kwargs)

        return call


def load_grid(grid: str | Path | GridSpec) -> GridSpec:
    """A grid from a file path, from YAML text (a string with a line break), or as it is.
    Raises `SweepError` (code 2) listing every problem of an invalid grid."""
    from orchestrator import grid as grids  # lazy: keeps import privbench light

    if isinstance(grid, grids.GridSpec):
        return grid
    try:  # a large grid's trials are made as they are read (`grids.Trials`): a 10^6-trial grid is checked in seconds
        if isinstance(grid, str) and "\n" in grid:
            return grids.parse_lazy(grid, source="grid")
        return grids.load_lazy(grid)
    except grids.GridError as e:
        raise SweepError("; ".join(e.problems), problems=e.problems) from None


def select(spec: GridSpec, only: Sequence[str] = ()) -> TrialSet:
    """The trials `--only` items select (`orchestrator.grid.select`; every trial without items). Raises
    `SweepError` (code 2) listing every bad item."""
    from orchestrator import grid as grids  # lazy: keeps import privbench light

    try:
        return grids.select(spec, only) if only else spec.trials
    except grids.GridError as e:
        raise SweepError("; ".join(e.problems), problems=e.problems) from None


def locate(store: str | Path | StoreLocation | None, ledger: str | None = None,
           artifacts: str | None = None) -> StoreLocation:
    """Where the store is (`storage.location.resolve`); a bad location is a `SweepError` (code 2)."""
    from storage.errors import StoreError  # lazy: keeps import privbench light
    from storage.location import StoreLocation, resolve  # lazy: keeps import privbench light

    if isinstance(store, StoreLocation):
        return store
    try:
        return resolve(None if store is None else str(store), ledger=ledger, artifacts=artifacts)
    except StoreError as e:
        raise SweepError(str(e)) from None


def code_changes(rows: Iterable[Any], trials: Iterable[TrialConfig]) -> list[str]:
    """One line per plugin whose code differs from the code that produced the sweep's recorded trials
    (`TrialConfig.code`): those trials have new keys, so they run again and the earlier ones are superseded."""
    def split(text: str) -> tuple[str, str, str]:  # "entry: dist [version] sha256:hash" -> entry, dist, short code
        entry, _, where = text.partition(": ")
        package, _, rest = where.partition(" ")
        version, _, digest = rest.rpartition("sha256:")
        return entry, package, f"{version}sha256:{digest[:12]}"

    before: dict[str, set[str]] = {}
    for row in rows:  # storage.store.TrialRow
        if row.status in ("finished", "failed") and row.record:
            for text in ((row.record.get("config") or {}).get("code") or {}).values():
                _, package, code = split(text)
                before.setdefault(package, set()).add(code)
    now: dict[str, tuple[str, set[str], set[str]]] = {}
    for t in trials:
        for kind, text in t.code.items():
            entry, package, code = split(text)
            _, entries, keys = now.setdefault(package, (code, set(), set()))
            entries.add(f"{kind} {entry}")
            keys.add(t.trial_key)
    return [f"plugin {package} changed ({', '.join(old)} -> {code}; {', '.join(sorted(entries))}): {len(keys)} "
            "trials run again, the earlier results are kept as superseded"
            for package, (code, entries, keys) in sorted(now.items())
            if (old := sorted(before.get(package, set()) - {code}))]


def _store_error(e: Exception, code: int = 2) -> SweepError:
    """A store problem: 2 before anything was written, 1 mid-sweep (what was recorded is kept), 2 for a store
    file another process kept locked, whenever it was (`storage.errors.Locked`)."""
    from storage.errors import Locked  # lazy: keeps import privbench light

    return SweepError(str(e), code=2 if isinstance(e, Locked) else code)


def run(grid: str | Path | GridSpec, store: str | Path | StoreLocation | None = None, *,
        ledger: str | None = None, artifacts: str | None = None, address: str | None = None,
        max_concurrent: int | None = None, retries: int = 0, steal_leases: bool = False,
        reconcile: bool = False, callbacks: Iterable[Callback] = (), only: Sequence[str] = ()) -> SweepSummary:
    """Run every trial of the grid that the ledger does not already mark finished.

    Several drivers can run the same grid at once: each trial is leased by one driver, and a driver
    that dies gives its trials back when its lease expires. `steal_leases` takes over the trials other
    drivers hold; `reconcile` checks MLflow against the ledger even when every trial is finished.
    `only` (`AXIS=VALUE` items, `orchestrator.grid.select`) runs part of the grid: the sweep stays the whole
    grid's, so the parts of a long grid run one after another (or side by side) without superseding each other.
    A failed trial is recorded and reported in the summary, not raised.
    """
    from storage.errors import StoreError, translated  # lazy: keeps import privbench light
    from storage.store import Store, preflight  # lazy: keeps import privbench light

    began = (time.perf_counter(), time.time())  # the driver run's wall time starts here (`privbench_driver_runs`)
    spec = load_grid(grid)
    selected = select(spec, only)
    location = locate(store, ledger, artifacts)
    cb = _All(callbacks)

    try:
        with translated(location.display):
            present = location.exists()
        if present and location.kind == "folder":  # a damaged store is reported before Ray starts
            with translated(location.display):
                Store(location).close()
    except StoreError as e:
        raise _store_error(e) from None
    if not (steal_leases or reconcile or only):
        early = _nothing_to_do(location, spec)
        if early is not None:
            cb.on_sweep_end(early)
            return early
    try:
        preflight(location, spec.name)  # nothing is created before the server answers and the sweep is ours
    except StoreError as e:
        raise _store_error(e) from None
    from orchestrator import cluster  # lazy: keeps import privbench light
    from orchestrator import grid as grids  # lazy: keeps import privbench light

    try:
        resources = cluster.connect(address, spec.plugins)
    except cluster.ClusterError as e:  # 2, or 143 / 130 when stopped while Ray started
        raise SweepError(str(e), code=e.code) from None
    problems = cluster.resource_problems(list(grids.samples(spec.trials)), resources)
    if problems:
        raise SweepError("; ".join(problems), problems=problems)

    stopping = _Stopping()  # after ray.init: Ray's own SIGTERM handler would abort with a crash dump
    try:
        return _open_and_run(spec, location, resources, max_concurrent, retries, steal_leases, cb, stopping,
                             selected, began)
    finally:
        stopping.restore()


def _open_and_run(spec: GridSpec, location: StoreLocation, resources: Mapping[str, float],
                  max_concurrent: int | None, retries: int, steal_leases: bool, cb: Callback,
                  stopping: _Stopping, selected: TrialSet,
                  began: tuple[float, float] | None = None) -> SweepSummary:
    """Open the sweep in the store (the whole grid) and run what it has to do of the `selected` trials (`run`,
    once Ray is connected): open the store, plan the run (what is left, how it packs), run and record, summarise.
    Every grid takes this one path: its trials stream from the grid to the driver (`_Todo`), small or large."""
    from storage.errors import StoreError  # lazy: keeps import privbench light

    try:
        st = _open_sweep(spec, location, cb, stopping, steal_leases)
        left = _left(st, spec, selected)
    except StoreError as e:
        raise _store_error(e) from None
    packing = _Packing.of(spec.trials, left, resources, max_concurrent)
    todo = _Todo(st, spec.name, selected, left, packing.resolve)
    cb.on_sweep_start(spec if len(selected) == len(spec.trials) else dataclasses.replace(spec, trials=selected),
                      todo, packing.limit, location.display)
    ran = _run_and_release(st, spec, selected, todo, packing.limit, retries, cb, stopping)
    summary = _summarise(st, spec, location, selected, ran)
    cb.on_sweep_end(summary)
    _keep_sweep_files(st, spec, cb)
    if ran.driver and began is not None:
        _keep_driver_run(st, spec.name, cb, ran.driver | {"memory_probe_s": packing.probe_s,
                                                          "startup_s": ran.loop_started - began[0]}, began)
    return summary


def _open_sweep(spec: GridSpec, location: StoreLocation, cb: Callback, stopping: _Stopping, steal_leases: bool) -> Any:
    """The store, open for writing, with the sweep's trials in its ledger (two passes over the grid: the keys, then
    the rows the ledger lacks; only the keys are held). Changed plugin code is warned about first. A stop while the
    trials are opened rolls their rows back and ends the run (`_Stopped`)."""
    from orchestrator import grid as grids  # lazy: keeps import privbench light
    from storage.store import Store  # lazy: keeps import privbench light

    st = Store(location, create=True)  # schema and experiment exist before any trial starts
    if any(t.code for t in grids.samples(spec.trials)):  # only a grid with plugin code reads the recorded configs
        for line in code_changes(st.trials(spec.name), spec.trials):
            cb.on_warning(line)
    try:
        st.open_sweep(spec.name, spec.text, (t.to_dict() for t in _until(stopping, spec.trials)),
                      key_of=grids.stored_key, keys=[t.trial_key for t in _until(stopping, spec.trials)])
    except _Stopped:  # the rows' transaction is rolled back: the ledger is as it was, less this driver
        st.release(spec.name)
        raise SweepError(f"sweep {spec.name}: stopped by {stopping.signal.name} while its trials were opened "
                         "in the store; nothing of them was written: run the sweep again to resume",
                         code=128 + stopping.signal.value) from None
    if steal_leases:
        st.steal_leases(spec.name)
    return st


def _left(st: Any, spec: GridSpec, selected: TrialSet) -> int:
    """How many of the `selected` trials the ledger does not mark finished: of the whole grid, from its status counts;
    of an `--only` part, asked batch by batch."""
    if len(selected) == len(spec.trials):
        return sum(n for status, n in st.status_counts(spec.name).items() if status not in ("finished", "superseded"))
    return _count_in_ledger(st, spec.name, selected)


@dataclasses.dataclass(frozen=True)
class _Packing:
    """How a run's trials share the cluster: `gpus: auto` resolved from the memory measured per `memory_key`
    (`resolve`, applied to the trials as they are read), the accelerator slots (`limit`), and the probe's seconds."""

    limit: int
    resolve: Callable[[list[TrialConfig]], list[TrialConfig]]
    probe_s: float

    @classmethod
    def of(cls, trials: TrialSet, left: int, resources: Mapping[str, float], max_concurrent: int | None) -> _Packing:
        """Measured on the grid's samples (`orchestrator.grid.samples`: every `memory_key` of the grid)."""
        from orchestrator import cluster  # lazy: keeps import privbench light
        from orchestrator import grid as grids  # lazy: keeps import privbench light

        samples, gpus = grids.samples(trials), resources.get("GPU", 0.0)
        started = time.perf_counter()
        memory = {}
        if left and gpus >= 1 and any(c.resources.gpus == "auto" for c in samples):
            # lazy: keeps import privbench light
            from orchestrator.submit import measure_memory  # `gpus: auto` packs trials by their measured memory

            memory = measure_memory([c for c in samples if c.resources.gpus == "auto"], 1.0)
        probe_s = time.perf_counter() - started
        per_trial = max((float(c.resources.cpus) for c in samples), default=1.0) if left else 1.0
        return cls(limit=max_concurrent or max(1, int(resources.get("CPU", 1) // per_trial)),
                   resolve=functools.partial(cluster.resolve_gpus, cluster_gpus=gpus, memory=memory), probe_s=probe_s)


@dataclasses.dataclass(frozen=True)
class _Ran:
    """What a run of the trials did: its failures and skipped trials, the ledger's counts after it, its trials still
    pending or running (`unrun`), and the driver's account of its time (empty when there was nothing to run)."""

    failures: tuple[Mapping[str, Any], ...]
    skipped: tuple[str, ...]
    counts: Mapping[str, int]
    unrun: int
    started: int
    driver: dict[str, float]
    loop_started: float


def _run_and_release(st: Any, spec: GridSpec, selected: TrialSet, todo: _Todo, limit: int, retries: int, cb: Callback,
                     stopping: _Stopping) -> _Ran:
    """Run and record the trials, count what is left and check that the store is still the one opened; the leases
    are given back whatever happens. A store lost mid-sweep, a lost cluster or a stop is a `SweepError` (what was
    recorded is kept; a rerun resumes)."""
    from orchestrator.submit import ClusterLost  # lazy: keeps import privbench light
    from storage.errors import StoreError  # lazy: keeps import privbench light

    failures: list[Mapping[str, Any]] = []
    skipped: list[str] = []
    driver: dict[str, float] = {}
    loop_started = time.perf_counter()
    try:
        if todo:
            driver = _run_trials(st, spec.name, todo, limit, retries, cb, failures, skipped, stopping)
            driver["run_all_s"] = time.perf_counter() - loop_started
        counts = st.status_counts(spec.name)
        unrun = _unrun(st, spec.name, counts, selected, len(spec.trials))
        st.check_intact()
    except StoreError as e:  # the store failed mid-sweep: what was recorded is kept, a rerun resumes
        raise _store_error(e, code=1) from None
    except ClusterLost as e:
        raise SweepError(f"sweep {spec.name}: {e}; every result that had arrived is recorded and the other "
                         "trials' leases are given back: run the sweep again once the cluster is back",
                         code=1) from None
    finally:
        try:
            st.release(spec.name)
        except StoreError:
            pass
    if stopping.signal is not None:
        raise SweepError(f"sweep {spec.name}: stopped by {stopping.signal.name}; every result that had arrived is "
                         "recorded and the other trials' leases are given back: run the sweep again to resume",
                         code=128 + stopping.signal.value)
    return _Ran(tuple(failures), tuple(skipped), counts, unrun, len(todo), driver, loop_started)


def _summarise(st: Any, spec: GridSpec, location: StoreLocation, selected: TrialSet, ran: _Ran) -> SweepSummary:
    """The run's `SweepSummary`. Trials not run are watched for a moment: other live drivers may be recording them
    (then they are counted again), else the summary says when they can be run."""
    from storage.errors import StoreError  # lazy: keeps import privbench light

    counts, unrun = ran.counts, ran.unrun
    message, alive, owners = None, False, ()
    if unrun:
        try:
            watch = st.lease_watch(spec.name)
            if watch.alive and not watch.leases:  # the other drivers recorded them while this one watched
                counts = st.status_counts(spec.name)
                unrun = _unrun(st, spec.name, counts, selected, len(spec.trials))
        except StoreError as e:
            raise _store_error(e) from None
        alive = watch.alive
        owners = tuple(sorted({owner for owner, _ in watch.leases}))
        if not alive:
            message = not_run_message(spec.name, unrun, list(watch.leases))
    return SweepSummary(sweep=spec.name, store=location.display, trials=len(selected),
                        finished_before=len(selected) - ran.started, started=ran.started, counts=dict(counts),
                        failures=ran.failures, skipped=ran.skipped, not_run=unrun, not_run_message=message,
                        running_elsewhere=alive, leased_by=owners)


def _keep_sweep_files(st: Any, spec: GridSpec, cb: Callback) -> None:
    """The leaderboard and figures on the sweep's MLflow run, unless its records would not fit in memory (a grid
    streamed at each pass: 10^6 results are gigabytes)."""
    from orchestrator import grid as grids  # lazy: keeps import privbench light

    if isinstance(spec.trials, grids.Trials) and spec.trials.lazy:
        cb.on_warning(f"sweep {spec.name}: no leaderboard or figures stored on the sweep's MLflow run for a grid of "
                      f"more than {grids.MATERIALISE:,} trials (its results are in the ledger and in MLflow)")
    else:
        _log_sweep_summary(st, spec.name, cb)


class _Stopped(Exception):
    """SIGTERM or Ctrl-C while a large grid's trials were being made (`_until`)."""


def _until(stopping: Callable[[], bool], trials: Iterable[TrialConfig]) -> Iterator[TrialConfig]:
    """The trials, checking every thousandth whether the driver was asked to stop: a pass over a 10^6-trial grid
    takes minutes, and SIGTERM or Ctrl-C must end it as promptly as a running sweep (`_Stopping`)."""
    for i, trial in enumerate(trials):
        if i % 1000 == 0 and stopping():
            raise _Stopped
        yield trial


class _Todo:
    """The trials a run has to do, read from the grid as the driver needs them, never all held (a `TrialSet`).

    Its length is the ledger's count of the `trials` not finished. Iterating reads the grid's trials again (a small
    grid's are kept, a large grid's made anew), private ones first (they train longest), asks the ledger in batches
    which are not finished (`Store.unfinished`), and yields those with `resolve` applied (`gpus: auto`), in the
    grid's order within each group."""

    def __init__(self, st: Any, sweep: str, trials: TrialSet, count: int,
                 resolve: Callable[[list[TrialConfig]], list[TrialConfig]] = list) -> None:
        self.st, self.sweep, self.trials, self.count, self.resolve = st, sweep, trials, count, resolve

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[TrialConfig]:
        from storage.ledger import KEY_BATCH  # lazy: keeps import privbench light

        for group in self._groups():
            batch: list[TrialConfig] = []
            for trial in group:
                batch.append(trial)
                if len(batch) >= KEY_BATCH:
                    yield from self._unfinished(batch)
                    batch = []
            yield from self._unfinished(batch)

    def _groups(self) -> list[Iterator[TrialConfig]]:
        """The private mechanisms' trials, then the others' (of a large grid, each group made without the other)."""
        from orchestrator import grid as grids  # lazy: keeps import privbench light

        private = {t.mechanism: grids.mechanism_private(t.mechanism) for t in grids.samples(self.trials)}
        if len(set(private.values())) <= 1:
            return [iter(self.trials)]
        return [grids.of_mechanisms(self.trials, [m for m, p in private.items() if p == first])
                for first in (True, False)]

    def _unfinished(self, batch: list[TrialConfig]) -> list[TrialConfig]:
        if not batch:
            return []
        left = self.st.unfinished(self.sweep, [t.trial_key for t in batch])
        return self.resolve([t for t in batch if t.trial_key in left])


class _Stopping:
    """SIGTERM and Ctrl-C ask a running sweep to stop, rather than kill it mid-write: the results in hand are
    recorded, the tasks in flight cancelled, the leases given back, and `run` ends with a `SweepError` of
    code 128 + the signal (143 for SIGTERM, 130 for SIGINT). A second Ctrl-C stops at once. Installed only
    in the main thread (Python delivers signals there); elsewhere the process's own handlers stay."""

    def __init__(self) -> None:
        import signal  # lazy: keeps import privbench light
        import threading  # lazy: keeps import privbench light

        self.signal: Any = None
        self._old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            self._old = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum: int, frame: Any) -> None:
        import signal  # lazy: keeps import privbench light

        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = self.signal or signal.Signals(signum)

    def __call__(self) -> bool:
        return self.signal is not None

    def restore(self) -> None:
        import signal  # lazy: keeps import privbench light

        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def not_run_message(sweep: str, count: int, leases: list[tuple[str, float]]) -> str:
    """Why trials of a finished `sweep run` were not run, and when they can be (`leases`: each holder and
    the seconds until its lease lapses, on the database's clock)."""
    if not leases:
        return f"sweep {sweep}: {count} trial(s) not run; run the sweep again"
    wait = max(0.0, max(left for _, left in leases))
    owners = sorted({owner for owner, _ in leases})
    return (f"sweep {sweep}: {count} trial(s) not run: leased by {len(owners)} other driver(s) "
            f"({', '.join(owners[:3])}) whose leases lapse in {wait:.0f} s unless renewed; run again then, "
            "or pass --steal-leases if that driver is dead")


def _unrun(st: Any, sweep: str, counts: Mapping[str, int], selected: TrialSet, total: int) -> int:
    """Trials still pending or running: of the whole sweep (its `counts`), or of the `selected` part when `--only`
    chose one (asked batch by batch)."""
    if len(selected) == total:
        return sum(n for s, n in counts.items() if s in ("pending", "running"))
    return _count_in_ledger(st, sweep, selected, ("pending", "running"))


def _count_in_ledger(st: Any, sweep: str, trials: Iterable[TrialConfig], statuses: Sequence[str] | None = None) -> int:
    """How many of `trials` the ledger does not mark finished (or marks with one of `statuses`), asked in batches:
    a large grid's part is counted without holding its keys or reading the sweep's rows."""
    from storage.ledger import KEY_BATCH  # lazy: keeps import privbench light

    count, batch = 0, []
    for trial in trials:
        batch.append(trial.trial_key)
        if len(batch) >= KEY_BATCH:
            count, batch = count + len(st.unfinished(sweep, batch, statuses)), []
    return count + (len(st.unfinished(sweep, batch, statuses)) if batch else 0)


def _nothing_to_do(location: StoreLocation, spec: GridSpec) -> SweepSummary | None:
    """A rerun whose trials are all finished ends here: from the ledger alone, read-only, without starting
    Ray or opening MLflow (a no-op rerun is a second, not half a minute). None: the full path decides."""
    from storage.store import finished_already  # lazy: keeps import privbench light

    count = finished_already(location, spec.name, spec.text, (t.trial_key for t in spec.trials))
    if count is None:
        return None
    return SweepSummary(sweep=spec.name, store=location.display, trials=count, finished_before=count,
                        started=0, counts={"finished": count}, nothing_to_do=True)


def _keep_driver_run(st: Any, sweep: str, cb: Callback, timing: dict[str, float], began: tuple[float, float]) -> None:
    """The driver's account of this run in the store (`privbench_driver_runs`): its wall time from `run`'s start, Ray's
    start and the store's opening included (`startup_s`), its loop (`orchestrator.submit.DriverTiming`), and what
    came after the loop (`end_s`: the release of leases, the summary files)."""
    from storage.errors import StoreError  # lazy: keeps import privbench light

    wall = time.perf_counter() - began[0]
    timing = timing | {"end_s": wall - timing["startup_s"] - timing["run_all_s"]}  # after the trials: leases, summary
    try:
        st.add_driver_run(sweep, began[1], wall, timing)
    except StoreError as e:  # the trials are recorded; an account of the time must not fail the sweep
        cb.on_warning(f"could not store the driver run's timing: {e}")


def _log_sweep_summary(st: Any, sweep: str, cb: Callback) -> None:
    """Leaderboard and figures onto the sweep's parent MLflow run (matplotlib is imported only here)."""
    from dashboards.summary import sweep_files  # lazy: keeps import privbench light

    try:
        st.log_sweep_files(sweep, sweep_files(st.records(sweep)))
    except Exception as e:  # noqa: BLE001 - the trials are recorded; a summary problem must not fail the sweep
        cb.on_warning(f"could not store the sweep summary: {e}")


def _run_trials(st: Any, sweep: str, todo: Iterable[TrialConfig], limit: int, retries: int, cb: Callback,
                failures: list[Mapping[str, Any]], skipped: list[str], stop: Callable[[], bool]) -> dict[str, float]:
    """Claim, run and record the trials (`orchestrator.submit.run_all`), renewing this driver's leases
    at every poll; `failures` and `skipped` are filled as results come. Returns the driver's account of its time
    (`orchestrator.submit.DriverTiming`)."""
    from orchestrator.submit import run_all  # lazy: keeps import privbench light
    from storage.faults import fault  # lazy: keeps import privbench light

    def on_start(cfg: TrialConfig) -> bool:
        if not st.claim(sweep, cfg.trial_key):  # another driver runs it (or just finished it)
            skipped.append(cfg.trial_key)
            cb.on_trial_skipped(cfg)
            return False
        fault("after_claim")
        cb.on_trial_start(cfg)
        return True

    def on_progress(state: dict[str, tuple[int, int, dict[str, Any]]]) -> None:
        for key, (done, total, info) in state.items():
            cb.on_trial_progress(key, done, total, info)

    def on_result(record: dict[str, Any]) -> None:
        run_id = st.record(record)
        if run_id is not None and record["status"] != "finished":
            failures.append(record)
        cb.on_trial_result(record, run_id)

    def load_phase(cfg: TrialConfig) -> dict[str, Any] | None:
        output = st.load_phase(sweep, cfg.trial_key)
        if output is not None:
            output["environment"]["accelerator_restored"] = True  # trained by an earlier driver
        return output

    def save_phase(cfg: TrialConfig, output: dict[str, Any]) -> None:
        st.save_phase(sweep, cfg.trial_key, output)
        fault("after_phase_saved")

    from orchestrator import plan_cache  # lazy: keeps import privbench light
    from storage.errors import StoreError  # lazy: keeps import privbench light

    def keep_plan(cfg: TrialConfig, planned: Any) -> None:
        try:
            plan_cache.keep(st, cfg, planned)
        except StoreError as e:  # a plan not cached is made again next time: not worth failing the sweep
            cb.on_warning(f"could not cache the plan of {cfg.trial_key}: {e}")

    return run_all(todo, max_concurrent=limit, retries=retries, on_start=on_start, on_result=on_result,
                   on_progress=on_progress, on_tick=lambda: st.heartbeat(sweep), load_phase=load_phase,
                   save_phase=save_phase, stop=stop, cached_plan=lambda cfg: plan_cache.lookup(st, cfg),
                   keep_plan=keep_plan).to_dict()


TRIAL_COLUMNS = ("trial_key", "status", "dataset", "model", "mechanism", "epsilon", "seed", "attempts", "run_id",
                 "accuracy", "error")


def trial_rows(st: Any, sweep: str) -> list[dict[str, Any]]:
    """Every trial of the sweep with its status, accuracy and error, from the ledger (`TRIAL_COLUMNS`)."""
    return [{"trial_key": t.trial_key, "status": t.status, "dataset": t.dataset, "model": t.model,
             "mechanism": t.mechanism, "epsilon": t.epsilon, "seed": t.seed, "attempts": t.attempts,
             "run_id": t.run_id, "accuracy": ((t.record or {}).get("metrics") or {}).get("accuracy"),
             "error": t.error} for t in st.trials(sweep)]
