"""Fan trials out as Ray tasks, phase by phase, and record results in completion order (the driver is
the only writer).

A trial runs as up to four tasks (workers/trial.py): its plan on one CPU (one task per distinct
`TrialConfig.plan_key` in this run: trials that share it share the plan), the one-step audit on CPU as
soon as the plan is known, the accelerator phase on the trial's `resources`, and the analysis on one CPU
once the accelerator's output is stored. Only the accelerator phase counts against `max_concurrent`,
so the next trial trains while the last one is analysed. A trial with nothing to calibrate (`needs_plan_task`) has
no plan task: its accelerator phase plans it in place.

Each trial's record says where its time went (`timing`, workers/timing.py): the workers measure what runs in them,
the tasks here the waits (for the plan, for a worker) and the imports a fresh worker made, and the driver the
transfer and the writes. `run_all` returns the driver's own account (`DriverTiming`).
"""

from __future__ import annotations

import time

_LOADING = time.perf_counter()  # this module's imports (torch, privbench) are what a fresh worker pays first

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import itertools  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import traceback  # noqa: E402
from collections import deque  # noqa: E402
from collections.abc import Callable, Iterable  # noqa: E402
from typing import Any, TypeVar  # noqa: E402

import ray  # noqa: E402

from workers.config import TrialConfig  # noqa: E402
from workers.trial import (  # noqa: E402
    AcceleratorOutput,
    Planned,
    accelerator_phase,
    analysis_phase,
    failed,
    needs_plan_task,
    plan_phase,
    step_memory,
    step_phase,
)

_IMPORTS_S = [time.perf_counter() - _LOADING]  # handed to the first task this process runs, then 0


def _imports_s() -> float:
    """The import seconds this process made to run its first task (0 for every later task: a reused worker)."""
    seconds, _IMPORTS_S[0] = _IMPORTS_S[0], 0.0
    return seconds

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
R = TypeVar("R")
LoadPhase = Callable[[TrialConfig], dict[str, Any] | None]
SavePhase = Callable[[TrialConfig, dict[str, Any]], Any]


@ray.remote(num_cpus=0)
class ProgressBoard:
    """Where running trials post (done, total, info); the driver polls it to draw progress bars."""

    def __init__(self) -> None:
        self.state: dict[str, tuple[int, int, dict[str, Any]]] = {}

    def update(self, key: str, done: int, total: int, info: dict[str, Any]) -> None:
        self.state[key] = (done, total, info)

    def snapshot(self) -> dict[str, tuple[int, int, dict[str, Any]]]:
        return dict(self.state)

    def forget(self, key: str) -> None:
        self.state.pop(key, None)


class ClusterLost(RuntimeError):
    """The Ray cluster's head (its GCS) stopped answering while trials ran: the driver stops instead of
    waiting for Ray to give up on it (a minute, then the process is ended from inside Ray)."""


HEAD_CHECK_S = 2.0  # how often the driver checks that the cluster's head still answers
PLANS_AHEAD = 2  # trials per accelerator slot whose plans are dispatched before they start
READY_WINDOW = 32  # queued trials a freed slot looks through for one whose plan is ready


def _head_patience_s() -> float:
    """How long the head may stay silent (a restarting GCS comes back) before the driver stops: well
    within Ray's own limit (`RAY_gcs_rpc_server_reconnect_timeout_s`, 60 s by default), after which Ray
    ends the driver from C++ with no chance to record or to release anything."""
    try:
        limit = float(os.environ.get("RAY_gcs_rpc_server_reconnect_timeout_s", "60"))
    except ValueError:
        limit = 60.0
    return max(HEAD_CHECK_S, min(20.0, limit / 2))


def _head_lost() -> str | None:
    """The GCS address when the head no longer accepts connections, else None (a TCP connect: cheap)."""
    try:
        address = ray.get_runtime_context().gcs_address
        host, port = address.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError:
        return address
    except Exception:  # noqa: BLE001 - no address to check (a ray:// client): Ray's own errors tell
        return None
    return None


@dataclasses.dataclass(frozen=True)
class PhaseFailure:
    """A phase that raised: returned in place of its output, and passed on by the phases after it."""

    phase: str
    error: str
    traceback: str


def _phase(name: str) -> Callable[[Callable[..., R]], Callable[..., R | PhaseFailure]]:
    """Make the decorated function a trial's phase called `name`: a failure becomes data, not an exception, so a
    failed phase is a failed trial recorded with its reason. A `PhaseFailure` among the arguments (an earlier phase
    failed) is passed on without running the phase. The body is the phase itself, typed for the inputs it runs on
    (no failure among them), so a reader follows a task to the function its phase runs, and a tool too (through
    the call, or `__wrapped__`)."""

    def decorate(fn: Callable[..., R]) -> Callable[..., R | PhaseFailure]:
        @functools.wraps(fn)
        def guarded(*args: Any) -> R | PhaseFailure:
            failure = next((a for a in args if isinstance(a, PhaseFailure)), None)
            if failure is not None:
                return failure
            try:
                return fn(*args)
            except Exception as exc:  # noqa: BLE001 - a failed phase is a failed trial, recorded with its reason
                record = failed(args[0], exc)
                return PhaseFailure(name, record["error"], traceback.format_exc())

        return guarded

    return decorate


@_phase("plan")
def _plan(config: TrialConfig) -> Planned:
    return plan_phase(config)


@_phase("step audit")
def _step(config: TrialConfig, planned: Planned) -> dict[str, Any]:
    return step_phase(config, planned)


@_phase("accelerator")
def _accelerate(config: TrialConfig, p: Planned | None, report: Callable[[int, int, dict[str, Any]], None],
                submitted: float | None, imports: float) -> dict[str, Any]:
    """The accelerator phase's output as a dict, its `timing` with the waits before it (see `_accelerator_task`)."""
    output = accelerator_phase(config, p, report)
    out = output.to_dict()
    if submitted is not None:
        ready = max(submitted, float(p.finished_at or submitted) if p is not None and not p.cached else submitted)
        start = float(output.environment["started_at"])
        out["timing"] |= {"plan_wait_s": ready - submitted, "imports_s": imports,
                          "scheduling_s": max(0.0, start - ready - imports)}
    if output.planned is not None:
        out["_planned"] = output.planned
    return out


@_phase("analysis")
def _analyse(config: TrialConfig, planned: Planned, output: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
    return analysis_phase(config, planned, AcceleratorOutput.from_dict(output), step)


def _plan_task(config: TrialConfig) -> Planned | PhaseFailure:
    imports = _imports_s()
    planned = _plan(config)
    if isinstance(planned, Planned):
        planned = dataclasses.replace(planned, timing=dict(planned.timing) | {"imports_s": imports})
    return planned


def _step_task(config: TrialConfig, planned: Planned | PhaseFailure) -> dict[str, Any] | PhaseFailure:
    return _step(config, planned)


def _accelerator_task(config: TrialConfig, planned: Planned | PhaseFailure | None, board: Any,
                      submitted: float | None = None) -> dict[str, Any] | PhaseFailure:
    """The accelerator phase; its output's `timing` gains the waits before it (`submitted`: the driver's submission,
    seconds since the epoch) and the imports this task made. A trial planned in place hands its plan back under
    `_planned` (the driver passes it to the analysis and stores the rest)."""
    imports = _imports_s()

    def report(done: int, total: int, info: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # progress is optional: a dead board must not fail the trial
            board.update.remote(config.trial_key, done, total, info)

    out = _accelerate(config, planned, report, submitted, imports)
    with contextlib.suppress(Exception):
        board.forget.remote(config.trial_key)
    return out


def _analysis_task(config: TrialConfig, planned: Planned | PhaseFailure, output: dict[str, Any],
                   step: dict[str, Any] | PhaseFailure, queued: float | None = None) -> dict[str, Any] | PhaseFailure:
    waited = time.time() - queued if queued is not None else None
    record = _analyse(config, planned, output, step)
    if isinstance(record, dict) and waited is not None:
        record["timing"]["analysis_wait_s"] = waited
    return record


def failed_record(config: TrialConfig, error: BaseException | PhaseFailure, phase: str | None = None) -> dict[str, Any]:
    """A trial whose phase failed, or whose task died (worker crash, OOM kill, lost node), is a failed
    result too; the error names the phase."""
    if isinstance(error, PhaseFailure):
        return failed(config, f"{error.phase} phase: {error.error}"[:2000], error.traceback)
    text = _ANSI.sub("", f"{phase} phase: {type(error).__name__}: {error}").splitlines()[0][:2000]  # Ray colours
    return failed(config, text, "".join(traceback.format_exception(error)))


def measure_memory(configs: list[TrialConfig], gpus: float) -> dict[str, tuple[float, float | None]]:
    """Each distinct `memory_key`'s peak memory and GPU size (`workers.trial.step_memory`), measured on a
    whole GPU (`gpus` per probe; 0 measures on CPU). A probe that fails leaves its key out: those trials
    take a whole GPU."""
    probe = ray.remote(step_memory)
    firsts = {c.memory_key: c for c in configs}
    refs = {key: probe.options(num_cpus=c.resources.cpus, num_gpus=gpus, max_retries=0).remote(
        dataclasses.replace(c, resources=dataclasses.replace(c.resources, gpus=gpus))) for key, c in firsts.items()}
    out = {}
    for key, ref in refs.items():
        try:
            out[key] = ray.get(ref)
        except Exception:  # noqa: BLE001 - unmeasured: one trial per GPU, as before packing
            continue
    return out


def ready_first(queue: deque[Any], ready: Callable[[TrialConfig], bool], window: int) -> int:
    """The index of the trial to start next: the first of the next `window` queued trials whose plan is ready, else
    the first (a slot never waits on a plan while a trial that could train is queued; the queue's order, private
    trials first, holds among the ready ones)."""
    for i, trial in enumerate(itertools.islice(queue, max(1, window))):
        if ready(trial.config):
            return i
    return 0


@dataclasses.dataclass
class _Trial:
    config: TrialConfig
    attempt: int
    plan: Any = None  # ObjectRef of its Planned (a Planned: made in its accelerator phase; None: not yet)
    step: Any = None  # ObjectRef of its one-step audit fields
    submitted: float = 0.0  # its accelerator task's submission, seconds since the epoch


@dataclasses.dataclass
class DriverTiming:
    """The driver's own account of a `run_all`: its loop's wall seconds, the seconds it spent writing (records,
    accelerator outputs) and submitting, and the accelerator slots' idle slot-seconds (`slots` x the loop's time
    with fewer than `slots` trials in their accelerator phase), which the trials' `span_s` and this explain."""

    slots: int = 0
    loop_s: float = 0.0
    record_s: float = 0.0
    save_s: float = 0.0
    submit_s: float = 0.0
    idle_slot_s: float = 0.0
    busy_slot_s: float = 0.0  # slot-seconds with a trial in its accelerator phase, as the driver saw them
    trials: int = 0

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in dataclasses.asdict(self).items()}


def run_all(
    configs: Iterable[TrialConfig], *, max_concurrent: int, retries: int,
    on_start: Callable[[TrialConfig], bool | None], on_result: Callable[[dict[str, Any]], None],
    on_progress: Callable[[dict[str, tuple[int, int, dict[str, Any]]]], None] | None = None,
    on_tick: Callable[[], None] | None = None, poll_s: float = 0.5,
    load_phase: LoadPhase | None = None, save_phase: SavePhase | None = None,
    stop: Callable[[], bool] | None = None,
    cached_plan: Callable[[TrialConfig], Planned | None] | None = None,
    keep_plan: Callable[[TrialConfig, Planned], Any] | None = None, plans_ahead: int = PLANS_AHEAD,
) -> DriverTiming:
    """Run every trial's phases; retry a failed trial up to `retries` times (from its stored
    accelerator output when it has one); at most `max_concurrent` accelerator phases at a time.

    `on_start` runs before a trial starts and may refuse it (False: another driver has it).
    `load_phase` returns a claimed trial's stored accelerator output (then it is not trained again);
    `save_phase` stores it before the analysis starts. `on_progress` and `on_tick` (the lease
    heartbeat) run at most every `poll_s` seconds, not once per result, so the driver's own cost per
    trial does not grow with the number of trials. Freed slots are refilled before results are recorded
    (`on_result`), so the cluster keeps working while the driver writes; a driver killed in between
    leaves those trials leased and unrecorded, to be redone by the next run (from their stored
    accelerator output where there is one), as with a kill at any other moment.

    `stop` is asked between polls: once it says so (SIGTERM, Ctrl-C), the results already in hand are
    recorded, the tasks still in flight are cancelled, and `run_all` returns. Progress is optional: a
    progress board that dies (its actor lost with its node) turns the bars off, not the sweep.
    Returns the driver's account of its time (`DriverTiming`).

    Plans: `cached_plan` answers a plan from the store's cache (`orchestrator.plan_cache`), else a plan task makes
    it and `keep_plan` stores it. Plan tasks are dispatched `plans_ahead` trials per slot ahead of the trials that
    start, so a freed slot finds the next trial's plan made (its calibration ran on a CPU slot while others trained),
    and a freed slot takes the first queued trial whose plan is ready (`ready_first`).
    """
    hooks = DriverHooks(on_start, on_result, on_progress, on_tick, load_phase, save_phase, cached_plan, keep_plan)
    driver = _Driver(configs, hooks, max_concurrent=max_concurrent, retries=retries, poll_s=poll_s,
                     plans_ahead=plans_ahead)
    stopped = stop if stop is not None else _never
    head = _HeadWatch()
    while driver.busy():
        if stopped():
            break
        head.check()
        driver.fill()
        if driver.idle():
            break  # plan tasks still running belong to no trial left: they are not waited for
        done = driver.wait()
        driver.report()
        results = driver.collect(done)
        if not stopped():
            driver.fill()  # the freed slots start their next trials first: recording a result does not idle a CPU
        driver.record(results)
    return driver.close(stopped)


def _never() -> bool:
    return False


@dataclasses.dataclass(frozen=True)
class DriverHooks:
    """What `run_all`'s caller does at each step of a trial (see `run_all`): the store's side of the driver."""

    on_start: Callable[[TrialConfig], bool | None]
    on_result: Callable[[dict[str, Any]], None]
    on_progress: Callable[[dict[str, tuple[int, int, dict[str, Any]]]], None] | None = None
    on_tick: Callable[[], None] | None = None
    load_phase: LoadPhase | None = None
    save_phase: SavePhase | None = None
    cached_plan: Callable[[TrialConfig], Planned | None] | None = None
    keep_plan: Callable[[TrialConfig, Planned], Any] | None = None


class _HeadWatch:
    """Every `HEAD_CHECK_S`, whether the cluster's head still answers: `check` raises `ClusterLost` once it has been
    silent for `_head_patience_s` (a restarting GCS comes back within it)."""

    def __init__(self) -> None:
        self._last, self._silent_since, self._patience = time.monotonic(), None, _head_patience_s()

    def check(self) -> None:
        if time.monotonic() - self._last < HEAD_CHECK_S:
            return
        self._last = time.monotonic()
        address = _head_lost()
        self._silent_since = None if address is None else (self._silent_since or self._last)
        if self._silent_since is not None and self._last - self._silent_since >= self._patience:
            raise ClusterLost(f"the Ray cluster's head (GCS at {address}) stopped answering for "
                              f"{self._last - self._silent_since:.0f} s")


class _Queue:
    """The trials to start, read from `configs` as the queue needs them (a large grid's are made as they are read):
    it holds what a freed slot looks through and the plans made ahead, not the whole sweep. A retried trial waits
    until every trial has been read, then joins the queue's end (after all the others, as when the queue held them
    all)."""

    def __init__(self, configs: Iterable[TrialConfig], window: int) -> None:
        self._source, self._window = iter(configs), window
        self._retried: deque[_Trial] = deque()
        self._read_all = False
        self.trials: deque[_Trial] = deque()
        self.refill()

    def __bool__(self) -> bool:
        return bool(self.trials)

    def refill(self) -> None:
        while not self._read_all and len(self.trials) < self._window:
            config = next(self._source, None)
            if config is None:
                self._read_all = True
                self.trials.extend(self._retried)
                self._retried.clear()
            else:
                self.trials.append(_Trial(config, 0))

    def retry(self, trial: _Trial) -> None:
        (self.trials if self._read_all else self._retried).append(_Trial(trial.config, trial.attempt + 1))

    def take(self, ready: Callable[[TrialConfig], bool]) -> _Trial:
        """The trial to start next (`ready_first`); the queue is refilled behind it."""
        pick = ready_first(self.trials, ready, READY_WINDOW)
        trial = self.trials[pick]
        del self.trials[pick]
        self.refill()
        return trial


class _Plans:
    """One plan per distinct `plan_key` in this run: answered from the store's cache (`cached_plan`), else made by a
    plan task, whose plan is then kept in the cache (`keep_plan`) for the next sweep of this geometry."""

    def __init__(self, hooks: DriverHooks) -> None:
        self._task = ray.remote(num_cpus=1)(_plan_task)
        self._cached, self._keep = hooks.cached_plan, hooks.keep_plan
        self._plans: dict[str, Any] = {}  # plan_key -> its Planned (cached), or the ObjectRef of its plan task
        self.making: dict[Any, TrialConfig] = {}  # plan tasks whose plan is to be kept

    def of(self, config: TrialConfig) -> Any:
        if config.plan_key not in self._plans:
            hit = self._cached(config) if self._cached is not None else None
            if hit is not None:
                self._plans[config.plan_key] = hit
            else:
                ref = self._plans[config.plan_key] = self._task.remote(config)
                if self._keep is not None:
                    self.making[ref] = config
        return self._plans[config.plan_key]

    def ready(self, config: TrialConfig) -> bool:
        """Whether the trial could train now: no plan task, or its plan made (cached, or its task done)."""
        if not needs_plan_task(config):
            return True
        plan = self._plans.get(config.plan_key)
        if plan is None or isinstance(plan, Planned):
            return plan is not None
        return bool(ray.wait([plan], num_returns=1, timeout=0)[0])

    def forget(self, config: TrialConfig) -> None:
        """Its plan failed: a retry makes it again."""
        self._plans.pop(config.plan_key, None)

    def made(self, ref: Any) -> None:
        """A plan task ended: its plan is kept (a failed one is not)."""
        config = self.making.pop(ref)
        with contextlib.suppress(Exception):
            planned = ray.get(ref)
            if isinstance(planned, Planned) and self._keep is not None:
                self._keep(config, planned)

    def keep_finished(self, stopped: Callable[[], bool]) -> None:
        """The plans made as the last trial ended are kept too (unless the driver was stopped); those still being
        made are not waited for."""
        if not self.making or self._keep is None or stopped():
            return
        ready, _ = ray.wait(list(self.making), num_returns=len(self.making), timeout=0)
        for ref in ready:
            with contextlib.suppress(Exception):
                if isinstance(planned := ray.get(ref), Planned):
                    self._keep(self.making.pop(ref), planned)


class _Driver:
    """One `run_all`: the queue, the plans, the tasks in flight, and what happens as each task ends (the steps
    `run_all`'s loop names: fill the slots, wait, report, collect the results, record them)."""

    def __init__(self, configs: Iterable[TrialConfig], hooks: DriverHooks, *, max_concurrent: int, retries: int,
                 poll_s: float, plans_ahead: int) -> None:
        self.hooks, self.slots, self.retries, self.poll_s = hooks, max_concurrent, retries, poll_s
        self._ahead = plans_ahead * max_concurrent  # trials whose plans are made while others train
        self._step_task = ray.remote(num_cpus=1)(_step_task)
        self._accelerator_task = ray.remote(_accelerator_task)
        self._analysis_task = ray.remote(num_cpus=1)(_analysis_task)
        self.board: Any = ProgressBoard.remote()
        self.queue = _Queue(configs, max(READY_WINDOW, self._ahead) + max_concurrent)
        self.plans = _Plans(hooks)
        self.training: dict[Any, _Trial] = {}
        self.analysing: dict[Any, _Trial] = {}
        self.clock = DriverTiming(slots=max_concurrent)
        self._last_poll = 0.0
        self.started = self._slots_since = time.perf_counter()  # slots since: when the busy count last changed

    def busy(self) -> bool:
        return bool(self.queue or self.training or self.analysing)

    def idle(self) -> bool:
        """No trial in a phase: what is left to start could not be (refused by `on_start`)."""
        return not self.training and not self.analysing

    def fill(self) -> None:
        """Start queued trials on the free accelerator slots, their plans made ahead."""
        self.queue.refill()
        self._plan_ahead()
        while self.queue and len(self.training) < self.slots:
            trial = self.queue.take(self._ready_once())
            if self.hooks.on_start(trial.config) is not False:
                self._start(trial)
        self._plan_ahead()

    def _ready_once(self) -> Callable[[TrialConfig], bool]:
        """`_Plans.ready`, asked once per plan_key for one pick."""
        known: dict[str, bool] = {}

        def ready(config: TrialConfig) -> bool:
            if config.plan_key not in known:
                known[config.plan_key] = self.plans.ready(config)
            return known[config.plan_key]

        return ready

    def _plan_ahead(self) -> None:
        w0 = time.perf_counter()
        for trial in itertools.islice(self.queue.trials, self._ahead):
            if needs_plan_task(trial.config):
                self.plans.of(trial.config)
        self.clock.submit_s += time.perf_counter() - w0

    def _start(self, trial: _Trial) -> None:
        w0 = time.perf_counter()
        config = trial.config
        trial.plan = self.plans.of(config) if needs_plan_task(config) else None
        trial.step = self._step_task.options(num_cpus=config.resources.cpus).remote(config, trial.plan) \
            if config.audit.step and config.private else {}
        stored = self.hooks.load_phase(config) if self.hooks.load_phase is not None else None
        if stored is not None:  # trained before; its analysis was lost
            self._analyse(trial, stored)
            self.clock.submit_s += time.perf_counter() - w0
            return
        opts = {"num_cpus": config.resources.cpus, "num_gpus": config.resources.gpus, "max_retries": 0}
        self._account_slots()
        trial.submitted = time.time()
        ref = self._accelerator_task.options(**opts).remote(config, trial.plan, self.board, trial.submitted)
        self.training[ref] = trial
        self.clock.trials += 1
        self.clock.submit_s += time.perf_counter() - w0

    def _analyse(self, trial: _Trial, output: dict[str, Any]) -> None:
        if trial.plan is None:  # a stored output of a trial planned in place: its plan is made again
            trial.plan = self.plans.of(trial.config)
        ref = self._analysis_task.remote(trial.config, trial.plan, output, trial.step, time.time())
        self.analysing[ref] = trial

    def _account_slots(self) -> None:
        now = time.perf_counter()
        busy = min(len(self.training), self.slots)
        self.clock.busy_slot_s += busy * (now - self._slots_since)
        self.clock.idle_slot_s += (self.slots - busy) * (now - self._slots_since)
        self._slots_since = now

    def wait(self) -> list[Any]:
        """The tasks that ended within `poll_s`: every one that is ready, not one per loop."""
        pending = list(self.training) + list(self.analysing) + list(self.plans.making)
        done, _ = ray.wait(pending, num_returns=1, timeout=self.poll_s)
        if done and len(pending) > 1:
            done, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
        return done

    def report(self) -> None:
        """The lease heartbeat (`on_tick`) and the progress bars (`on_progress`), at most every `poll_s`."""
        if time.monotonic() - self._last_poll < self.poll_s:
            return
        self._last_poll = time.monotonic()
        if self.hooks.on_tick is not None:
            self.hooks.on_tick()
        if self.hooks.on_progress is not None and self.board is not None:
            try:
                self.hooks.on_progress(ray.get(self.board.snapshot.remote(), timeout=30))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                self.board = None  # the progress board died: the trials go on without bars

    def collect(self, done: list[Any]) -> list[dict[str, Any]]:
        """The ended tasks' outcomes: plans kept, accelerator outputs stored and sent to their analysis, failures
        retried, and the records to write returned."""
        results: list[dict[str, Any]] = []
        for ref in done:
            if ref in self.plans.making:
                self.plans.made(ref)
            elif ref in self.training:
                self._account_slots()
                trial = self.training.pop(ref)
                outcome = _outcome(ref)
                if isinstance(outcome, dict):
                    self._received(trial, outcome)
                else:
                    self._finish(trial, outcome, "accelerator", results)
            else:
                self._finish(self.analysing.pop(ref), _outcome(ref), "analysis", results)
        return results

    def _received(self, trial: _Trial, outcome: dict[str, Any]) -> None:
        """An accelerator output arrived: stored (`save_phase`), its transfer and span timed, and analysed."""
        received = time.time()
        planned = outcome.pop("_planned", None)
        if planned is not None:
            trial.plan = planned
        w0 = time.perf_counter()
        if self.hooks.save_phase is not None:
            self.hooks.save_phase(trial.config, outcome)
        saved = time.perf_counter() - w0
        self.clock.save_s += saved
        timing = outcome.setdefault("timing", {})
        finished = float(outcome.get("environment", {}).get("accelerator_finished_at", received))
        timing |= {"transfer_s": max(0.0, received - finished), "save_s": saved,
                   "span_s": received - trial.submitted}
        self._analyse(trial, outcome)

    def _finish(self, trial: _Trial, outcome: Any, phase: str, results: list[dict[str, Any]]) -> None:
        """A trial's last outcome: its record, or a failure retried (the plan made again if it was the plan that
        failed) or recorded."""
        if isinstance(outcome, PhaseFailure | BaseException):
            if isinstance(outcome, PhaseFailure) and outcome.phase == "plan":
                self.plans.forget(trial.config)
            if trial.attempt < self.retries:
                self.queue.retry(trial)
                return
            results.append(failed_record(trial.config, outcome, phase))
        else:
            results.append(outcome)

    def record(self, results: list[dict[str, Any]]) -> None:
        w0 = time.perf_counter()
        for record in results:
            self.hooks.on_result(record)
        self.clock.record_s += time.perf_counter() - w0

    def close(self, stopped: Callable[[], bool]) -> DriverTiming:
        """The driver's account, once nothing that is left running is needed: stopped early, nothing is left
        running for a driver that is gone."""
        self._account_slots()
        self.clock.loop_s = time.perf_counter() - self.started
        self.plans.keep_finished(stopped)
        for ref in [*self.training, *self.analysing, *self.plans.making]:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        if self.board is not None:
            with contextlib.suppress(Exception):  # already dead: nothing to kill
                ray.kill(self.board)
        return self.clock


def _outcome(ref: Any) -> Any:
    """A task's output, or the exception of a task that itself died (worker crash, OOM kill, lost node)."""
    try:
        return ray.get(ref)
    except Exception as exc:  # noqa: BLE001 - the task itself died
        return exc
