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
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec
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

    def on_sweep_start(self, spec: GridSpec, todo: Sequence[TrialConfig], max_concurrent: int,
                       store: str) -> None:
        """The sweep is open in the store; `todo` are the trials this run will try, in order."""

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
    from orchestrator import grid as grids

    if isinstance(grid, grids.GridSpec):
        return grid
    try:
        if isinstance(grid, str) and "\n" in grid:
            return grids.parse(grid, source="grid")
        return grids.load(grid)
    except grids.GridError as e:
        raise SweepError("; ".join(e.problems), problems=e.problems) from None


def locate(store: str | Path | StoreLocation | None, ledger: str | None = None,
           artifacts: str | None = None) -> StoreLocation:
    """Where the store is (`storage.location.resolve`); a bad location is a `SweepError` (code 2)."""
    from storage.errors import StoreError
    from storage.location import StoreLocation, resolve

    if isinstance(store, StoreLocation):
        return store
    try:
        return resolve(None if store is None else str(store), ledger=ledger, artifacts=artifacts)
    except StoreError as e:
        raise SweepError(str(e)) from None


def code_changes(rows: Iterable[Mapping[str, Any]], trials: Iterable[TrialConfig]) -> list[str]:
    """One line per plugin whose code differs from the code that produced the sweep's recorded trials
    (`TrialConfig.code`): those trials have new keys, so they run again and the earlier ones are superseded."""
    def split(text: str) -> tuple[str, str, str]:  # "entry: dist [version] sha256:hash" -> entry, dist, short code
        entry, _, where = text.partition(": ")
        package, _, rest = where.partition(" ")
        version, _, digest = rest.rpartition("sha256:")
        return entry, package, f"{version}sha256:{digest[:12]}"

    before: dict[str, set[str]] = {}
    for row in rows:
        if row.get("status") in ("finished", "failed") and row.get("config_json"):
            for text in (json.loads(row["config_json"]).get("code") or {}).values():
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
    """A store problem: 2 before anything was written, 1 mid-sweep (what was recorded is kept)."""
    return SweepError(str(e), code=code)


def run(grid: str | Path | GridSpec, store: str | Path | StoreLocation | None = None, *,
        ledger: str | None = None, artifacts: str | None = None, address: str | None = None,
        max_concurrent: int | None = None, retries: int = 0, steal_leases: bool = False,
        reconcile: bool = False, callbacks: Iterable[Callback] = ()) -> SweepSummary:
    """Run every trial of the grid that the ledger does not already mark finished.

    Several drivers can run the same grid at once: each trial is leased by one driver, and a driver
    that dies gives its trials back when its lease expires. `steal_leases` takes over the trials other
    drivers hold; `reconcile` checks MLflow against the ledger even when every trial is finished.
    A failed trial is recorded and reported in the summary, not raised.
    """
    from orchestrator import grid as grids
    from storage.errors import StoreError, translated
    from storage.store import Store, preflight

    spec = load_grid(grid)
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
    if not (steal_leases or reconcile):
        early = _nothing_to_do(location, spec)
        if early is not None:
            cb.on_sweep_end(early)
            return early
    try:
        preflight(location, spec.name)  # nothing is created before the server answers and the sweep is ours
    except StoreError as e:
        raise _store_error(e) from None
    from orchestrator import cluster

    try:
        resources = cluster.connect(address, spec.plugins)
    except cluster.ClusterError as e:
        raise SweepError(str(e)) from None
    problems = cluster.resource_problems(list(spec.trials), resources)
    if problems:
        raise SweepError("; ".join(problems), problems=problems)

    try:
        st = Store(location, create=True)  # schema and experiment exist before any trial starts
        for line in code_changes(st.ledger.trials(spec.name), spec.trials):
            cb.on_warning(line)
        st.open_sweep(spec.name, spec.text, [t.to_dict() for t in spec.trials], key_of=grids.stored_key)
        if steal_leases:
            st.ledger.release(spec.name, owner=None)
        by_key = {t.trial_key: t for t in spec.trials}  # the grid's current settings (e.g. resources)
        todo = [by_key[c["trial_key"]] for c in st.pending(spec.name) if c["trial_key"] in by_key]
    except StoreError as e:
        raise _store_error(e) from None
    todo.sort(key=lambda c: not grids.mechanism_private(c.mechanism))  # long (private) trials first
    finished_before = len(spec.trials) - len(todo)
    memory = {}
    if resources.get("GPU", 0.0) >= 1 and any(c.resources.gpus == "auto" for c in todo):
        from orchestrator.submit import measure_memory  # `gpus: auto` packs trials by their measured memory

        memory = measure_memory([c for c in todo if c.resources.gpus == "auto"], 1.0)
    todo = cluster.resolve_gpus(todo, resources.get("GPU", 0.0), memory)
    per_trial = max((float(c.resources.cpus) for c in todo), default=1.0)
    limit = max_concurrent or max(1, int(resources.get("CPU", 1) // per_trial))
    cb.on_sweep_start(spec, todo, limit, location.display)
    failures: list[Mapping[str, Any]] = []
    skipped: list[str] = []
    try:
        if todo:
            _run_trials(st, spec.name, todo, limit, retries, cb, failures, skipped)
        counts = st.ledger.status_counts(spec.name)
        st.check_intact()
    except StoreError as e:  # the store failed mid-sweep: what was recorded is kept, a rerun resumes
        raise _store_error(e, code=1) from None
    finally:
        try:
            st.release(spec.name)
        except StoreError:
            pass
    unrun = sum(n for s, n in counts.items() if s in ("pending", "running"))
    message, alive, owners = None, False, ()
    if unrun:
        try:
            with translated(st.where):
                leases, alive = _watch_leases(st, spec.name)
        except StoreError as e:
            raise _store_error(e) from None
        owners = tuple(sorted({owner for owner, _ in leases}))
        if not alive:
            message = not_run_message(spec.name, unrun, leases)
    summary = SweepSummary(sweep=spec.name, store=location.display, trials=len(spec.trials),
                           finished_before=finished_before, started=len(todo), counts=dict(counts),
                           failures=tuple(failures), skipped=tuple(skipped), not_run=unrun,
                           not_run_message=message, running_elsewhere=alive, leased_by=owners)
    cb.on_sweep_end(summary)
    _log_sweep_summary(st, spec.name, cb)
    return summary


def not_run_message(sweep: str, count: int, leases: list[tuple[str, float]]) -> str:
    """Why trials of a finished `sweep run` were not run, and when they can be."""
    if not leases:
        return f"sweep {sweep}: {count} trial(s) not run; run the sweep again"
    wait = max(0.0, max(expires for _, expires in leases) - time.time())
    owners = sorted({owner for owner, _ in leases})
    return (f"sweep {sweep}: {count} trial(s) not run: leased by {len(owners)} other driver(s) "
            f"({', '.join(owners[:3])}) whose leases lapse in {wait:.0f} s unless renewed; run again then, "
            "or pass --steal-leases if that driver is dead")


def _watch_leases(st: Any, sweep: str) -> tuple[list[tuple[str, float]], bool]:
    """The other drivers' leases on the trials this driver could not run, and whether those drivers are
    alive: each renews its leases every third of their lifetime, so one such period tells (a driver on
    this host whose process is gone is dead at once)."""
    from storage.ledger import lease_seconds, owner_dead

    def unfinished() -> dict[str, tuple[str | None, float | None]]:
        return {t["trial_key"]: (t["lease_owner"], t["lease_expires"]) for t in st.ledger.trials(sweep)
                if t["status"] in ("pending", "running")}

    first = unfinished()
    if not first:  # the other driver recorded them meanwhile
        return [], True
    now = time.time()
    held = [(owner, expires) for owner, expires in first.values() if owner and (expires or 0) >= now]
    if len(held) < len(first) or any(owner_dead(owner) for owner, _ in held):
        return held, False  # a trial nobody holds, or a dead holder: this driver's rerun takes them
    deadline = time.monotonic() + lease_seconds() / 3 + 2
    while time.monotonic() < deadline:
        time.sleep(0.5)  # poll interval: the other driver's renewal or record shows in the ledger
        later = unfinished()
        if all(key not in later or (later[key][1] or 0) > (expires or 0) for key, (_, expires) in first.items()):
            return st.ledger.leases(sweep), True
    return st.ledger.leases(sweep), False


def _nothing_to_do(location: StoreLocation, spec: GridSpec) -> SweepSummary | None:
    """A rerun whose trials are all finished ends here: from the ledger alone, read-only, without starting
    Ray or opening MLflow (a no-op rerun is a second, not half a minute). None: the full path decides."""
    from storage.ledger import Ledger

    try:
        ledger = Ledger(location.ledger_uri, read_only=True)
        try:
            if not ledger.has_schema():
                return None
            row = ledger.sweep(spec.name)
            trials = ledger.trials(spec.name)
        finally:
            ledger.engine.dispose()
    except Exception:  # noqa: BLE001 - whatever it is, the full path below reports it properly
        return None
    if row is None or row["grid_yaml"] != spec.text or not row["experiment_id"]:
        return None  # a new or edited grid: the full path syncs the ledger
    live = {t["trial_key"]: t for t in trials if t["status"] != "superseded"}
    if set(live) != {t.trial_key for t in spec.trials}:
        return None
    if not all(t["status"] == "finished" for t in live.values()):
        return None
    return SweepSummary(sweep=spec.name, store=location.display, trials=len(live), finished_before=len(live),
                        started=0, counts={"finished": len(live)}, nothing_to_do=True)


def _log_sweep_summary(st: Any, sweep: str, cb: Callback) -> None:
    """Leaderboard and figures onto the sweep's parent MLflow run (matplotlib is imported only here)."""
    from dashboards.summary import sweep_files

    try:
        st.log_sweep_files(sweep, sweep_files(st.records(sweep)))
    except Exception as e:  # noqa: BLE001 - the trials are recorded; a summary problem must not fail the sweep
        cb.on_warning(f"could not store the sweep summary: {e}")


def _run_trials(st: Any, sweep: str, todo: list[TrialConfig], limit: int, retries: int, cb: Callback,
                failures: list[Mapping[str, Any]], skipped: list[str]) -> None:
    """Claim, run and record the trials (`orchestrator.submit.run_all`), renewing this driver's leases
    at every poll; `failures` and `skipped` are filled as results come."""
    from orchestrator.submit import run_all
    from storage.faults import fault

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
        stored = st.ledger.phase(sweep, cfg.trial_key)
        if stored is None:
            return None
        output = json.loads(stored)
        output["environment"]["accelerator_restored"] = True  # trained by an earlier driver
        return output

    def save_phase(cfg: TrialConfig, output: dict[str, Any]) -> None:
        st.ledger.save_phase(sweep, cfg.trial_key, st.owner, json.dumps(output))
        fault("after_phase_saved")

    run_all(todo, max_concurrent=limit, retries=retries, on_start=on_start, on_result=on_result,
            on_progress=on_progress, on_tick=lambda: st.heartbeat(sweep), load_phase=load_phase,
            save_phase=save_phase)


TRIAL_COLUMNS = ("trial_key", "status", "dataset", "model", "mechanism", "epsilon", "seed", "attempts", "run_id",
                 "accuracy", "error")


def trial_rows(st: Any, sweep: str) -> list[dict[str, Any]]:
    """Every trial of the sweep with its status, accuracy and error, from the ledger (`TRIAL_COLUMNS`)."""
    rows = []
    for t in st.ledger.trials(sweep):
        rec = st.ledger.loads(t, "result_json") if t["result_json"] else {}
        rows.append({"trial_key": t["trial_key"], "status": t["status"], "dataset": t["dataset"],
                     "model": t["model"], "mechanism": t["mechanism"], "epsilon": t["epsilon"], "seed": t["seed"],
                     "attempts": t["attempts"], "run_id": t["run_id"],
                     "accuracy": (rec.get("metrics") or {}).get("accuracy"), "error": t["error"]})
    return rows
