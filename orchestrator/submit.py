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
import itertools  # noqa: E402
import re  # noqa: E402
import traceback  # noqa: E402
from collections import deque  # noqa: E402
from collections.abc import Callable, Iterable  # noqa: E402
from typing import Any  # noqa: E402

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
    import os

    try:
        limit = float(os.environ.get("RAY_gcs_rpc_server_reconnect_timeout_s", "60"))
    except ValueError:
        limit = 60.0
    return max(HEAD_CHECK_S, min(20.0, limit / 2))


def _head_lost() -> str | None:
    """The GCS address when the head no longer accepts connections, else None (a TCP connect: cheap)."""
    import socket

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


def _guarded(phase: str, fn: Callable[..., Any], *args: Any) -> Any:
    failure = next((a for a in args if isinstance(a, PhaseFailure)), None)
    if failure is not None:
        return failure
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - a failed phase is a failed trial, recorded with its reason
        record = failed(args[0], exc)
        return PhaseFailure(phase, record["error"], traceback.format_exc())


def _plan_task(config: TrialConfig) -> Planned | PhaseFailure:
    imports = _imports_s()
    planned = _guarded("plan", plan_phase, config)
    if isinstance(planned, Planned):
        planned = dataclasses.replace(planned, timing=dict(planned.timing) | {"imports_s": imports})
    return planned


def _step_task(config: TrialConfig, planned: Planned | PhaseFailure) -> dict[str, Any] | PhaseFailure:
    return _guarded("step audit", step_phase, config, planned)


def _accelerator_task(config: TrialConfig, planned: Planned | PhaseFailure | None, board: Any,
                      submitted: float | None = None) -> dict[str, Any] | PhaseFailure:
    """The accelerator phase; its output's `timing` gains the waits before it (`submitted`: the driver's submission,
    seconds since the epoch) and the imports this task made. A trial planned in place hands its plan back under
    `_planned` (the driver passes it to the analysis and stores the rest)."""
    imports = _imports_s()

    def report(done: int, total: int, info: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # progress is optional: a dead board must not fail the trial
            board.update.remote(config.trial_key, done, total, info)

    def run(c: TrialConfig, p: Planned | None) -> dict[str, Any]:
        output = accelerator_phase(c, p, report)
        out = output.to_dict()
        if submitted is not None:
            ready = max(submitted, float(p.finished_at or submitted) if p is not None and not p.cached else submitted)
            start = float(output.environment["started_at"])
            out["timing"] |= {"plan_wait_s": ready - submitted, "imports_s": imports,
                              "scheduling_s": max(0.0, start - ready - imports)}
        if output.planned is not None:
            out["_planned"] = output.planned
        return out

    out = _guarded("accelerator", run, config, planned)
    with contextlib.suppress(Exception):
        board.forget.remote(config.trial_key)
    return out


def _analysis_task(config: TrialConfig, planned: Planned | PhaseFailure, output: dict[str, Any],
                   step: dict[str, Any] | PhaseFailure, queued: float | None = None) -> dict[str, Any] | PhaseFailure:
    waited = time.time() - queued if queued is not None else None
    record = _guarded("analysis", lambda c, p, o, s: analysis_phase(c, p, AcceleratorOutput.from_dict(o), s),
                      config, planned, output, step)
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
    plan_task, step_task = ray.remote(num_cpus=1)(_plan_task), ray.remote(num_cpus=1)(_step_task)
    accelerator_task, analysis_task = ray.remote(_accelerator_task), ray.remote(num_cpus=1)(_analysis_task)
    board = ProgressBoard.remote()
    # The trials are read from `configs` as the queue needs them (a large grid's are made as they are read):
    # the queue holds what a freed slot looks through and the plans made ahead, not the whole sweep. A retried
    # trial waits until every trial has been read, then joins the queue's end (after all the others, as when
    # the queue held them all).
    source = iter(configs)
    queue: deque[_Trial] = deque()
    retried: deque[_Trial] = deque()
    read_all = False
    window = max(READY_WINDOW, plans_ahead * max_concurrent) + max_concurrent

    def refill() -> None:
        nonlocal read_all
        while not read_all and len(queue) < window:
            config = next(source, None)
            if config is None:
                read_all = True
                queue.extend(retried)
                retried.clear()
            else:
                queue.append(_Trial(config, 0))

    refill()
    plans: dict[str, Any] = {}  # plan_key -> ObjectRef: one plan per distinct key
    training: dict[Any, _Trial] = {}
    analysing: dict[Any, _Trial] = {}
    last_poll = 0.0
    clock = DriverTiming(slots=max_concurrent)
    loop_started = time.perf_counter()
    slots_since = loop_started  # when the count of trials in their accelerator phase last changed

    def account_slots() -> None:
        nonlocal slots_since
        now = time.perf_counter()
        busy = min(len(training), max_concurrent)
        clock.busy_slot_s += busy * (now - slots_since)
        clock.idle_slot_s += (max_concurrent - busy) * (now - slots_since)
        slots_since = now

    planning: dict[Any, TrialConfig] = {}  # plan tasks whose plan is to be kept in the cache

    def plan_of(config: TrialConfig) -> Any:
        if config.plan_key not in plans:
            hit = cached_plan(config) if cached_plan is not None else None
            if hit is not None:
                plans[config.plan_key] = hit
            else:
                ref = plans[config.plan_key] = plan_task.remote(config)
                if keep_plan is not None:
                    planning[ref] = config
        return plans[config.plan_key]

    def analyse(trial: _Trial, output: dict[str, Any]) -> None:
        if trial.plan is None:  # a stored output of a trial planned in place: its plan is made again
            trial.plan = plan_of(trial.config)
        analysing[analysis_task.remote(trial.config, trial.plan, output, trial.step, time.time())] = trial

    def start(trial: _Trial) -> None:
        w0 = time.perf_counter()
        config = trial.config
        trial.plan = plan_of(config) if needs_plan_task(config) else None
        trial.step = step_task.options(num_cpus=config.resources.cpus).remote(config, trial.plan) \
            if config.audit.step and config.private else {}
        stored = load_phase(config) if load_phase is not None else None
        if stored is not None:  # trained before; its analysis was lost
            analyse(trial, stored)
            clock.submit_s += time.perf_counter() - w0
            return
        opts = {"num_cpus": config.resources.cpus, "num_gpus": config.resources.gpus, "max_retries": 0}
        account_slots()
        trial.submitted = time.time()
        training[accelerator_task.options(**opts).remote(config, trial.plan, board, trial.submitted)] = trial
        clock.trials += 1
        clock.submit_s += time.perf_counter() - w0

    def plan_ready(config: TrialConfig) -> bool:
        """Whether the trial could train now: no plan task, or its plan made (cached, or its task done)."""
        if not needs_plan_task(config):
            return True
        plan = plans.get(config.plan_key)
        if plan is None or isinstance(plan, Planned):
            return plan is not None
        return bool(ray.wait([plan], num_returns=1, timeout=0)[0])

    def plan_ahead() -> None:
        w0 = time.perf_counter()
        for trial in itertools.islice(queue, plans_ahead * max_concurrent):  # next trials' plans, made during training
            if needs_plan_task(trial.config):
                plan_of(trial.config)
        clock.submit_s += time.perf_counter() - w0

    def fill() -> None:
        refill()
        plan_ahead()
        while queue and len(training) < max_concurrent:
            known: dict[str, bool] = {}  # plan_key -> ready, asked once per pick

            def ready(config: TrialConfig, known: dict[str, bool] = known) -> bool:
                if config.plan_key not in known:
                    known[config.plan_key] = plan_ready(config)
                return known[config.plan_key]

            pick = ready_first(queue, ready, READY_WINDOW)
            trial = queue[pick]
            del queue[pick]
            refill()
            if on_start(trial.config) is not False:
                start(trial)
        plan_ahead()

    def finish(trial: _Trial, outcome: Any, phase: str, results: list[dict[str, Any]]) -> None:
        """A failed phase: retried (the plan made again if it was the plan that failed) or recorded."""
        if isinstance(outcome, PhaseFailure) or isinstance(outcome, BaseException):
            if isinstance(outcome, PhaseFailure) and outcome.phase == "plan":
                plans.pop(trial.config.plan_key, None)
            if trial.attempt < retries:
                (queue if read_all else retried).append(_Trial(trial.config, trial.attempt + 1))
                return
            results.append(failed_record(trial.config, outcome, phase))
        else:
            results.append(outcome)

    last_check, silent_since, patience = time.monotonic(), None, _head_patience_s()
    while queue or training or analysing:
        if stop is not None and stop():
            break
        if time.monotonic() - last_check >= HEAD_CHECK_S:
            last_check = time.monotonic()
            address = _head_lost()
            silent_since = None if address is None else (silent_since or last_check)
            if silent_since is not None and last_check - silent_since >= patience:
                raise ClusterLost(f"the Ray cluster's head (GCS at {address}) stopped answering for "
                                  f"{last_check - silent_since:.0f} s")
        fill()
        if not training and not analysing:
            break  # plan tasks still running belong to no trial left: they are not waited for
        pending = list(training) + list(analysing) + list(planning)
        done, _ = ray.wait(pending, num_returns=1, timeout=poll_s)
        if done and len(pending) > 1:  # every result that is ready, not one per loop
            done, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
        if time.monotonic() - last_poll >= poll_s:
            last_poll = time.monotonic()
            if on_tick is not None:
                on_tick()
            if on_progress is not None and board is not None:
                try:
                    on_progress(ray.get(board.snapshot.remote(), timeout=30))
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    board = None  # the progress board died: the trials go on without bars
        results: list[dict[str, Any]] = []
        for ref in done:
            if ref in planning:  # a plan made: kept for the next sweep of this geometry (a failed one is not)
                config = planning.pop(ref)
                with contextlib.suppress(Exception):
                    planned = ray.get(ref)
                    if isinstance(planned, Planned):
                        keep_plan(config, planned)  # type: ignore[misc]
                continue
            phase = "accelerator" if ref in training else "analysis"
            if phase == "accelerator":
                account_slots()
            trial = training.pop(ref) if ref in training else analysing.pop(ref)
            try:
                outcome = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - the task itself died
                outcome = exc
            if phase == "accelerator" and isinstance(outcome, dict):
                received = time.time()
                planned = outcome.pop("_planned", None)
                if planned is not None:
                    trial.plan = planned
                w0 = time.perf_counter()
                if save_phase is not None:
                    save_phase(trial.config, outcome)
                saved = time.perf_counter() - w0
                clock.save_s += saved
                timing = outcome.setdefault("timing", {})
                finished = float(outcome.get("environment", {}).get("accelerator_finished_at", received))
                timing |= {"transfer_s": max(0.0, received - finished), "save_s": saved,
                           "span_s": received - trial.submitted}
                analyse(trial, outcome)
            else:
                finish(trial, outcome, phase, results)
        if stop is None or not stop():
            fill()  # the freed slots start their next trials first: recording a result does not idle a CPU
        w0 = time.perf_counter()
        for record in results:
            on_result(record)
        clock.record_s += time.perf_counter() - w0
    account_slots()
    clock.loop_s = time.perf_counter() - loop_started
    if planning and keep_plan is not None and not (stop is not None and stop()):  # plans made as the last trial ended
        ready, _ = ray.wait(list(planning), num_returns=len(planning), timeout=0)
        for ref in ready:
            with contextlib.suppress(Exception):
                if isinstance(planned := ray.get(ref), Planned):
                    keep_plan(planning.pop(ref), planned)
    for ref in [*training, *analysing, *planning]:  # stopped early: nothing left running for a driver that is gone
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
    if board is not None:
        with contextlib.suppress(Exception):  # already dead: nothing to kill
            ray.kill(board)
    return clock
