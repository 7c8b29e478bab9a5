"""Fan trials out as Ray tasks and record results in completion order (the driver is the only writer)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import ray

from workers.config import TrialConfig
from workers.trial import run_trial


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


def _trial_task(config: TrialConfig, board: Any) -> dict[str, Any]:
    def report(done: int, total: int, info: dict[str, Any]) -> None:
        board.update.remote(config.trial_key, done, total, info)

    return run_trial(config, on_progress=report)


def failed_record(config: TrialConfig, error: BaseException) -> dict[str, Any]:
    """A trial whose task died (worker crash, OOM kill, lost node) is a failed result too."""
    import traceback

    from workers.result import TrialResult

    return TrialResult(config.sweep, config.trial_key, "failed", config.to_dict(), metrics={},
                       error=f"{type(error).__name__}: {error}".splitlines()[0][:2000],
                       traceback="".join(traceback.format_exception(error))).to_record()


def run_all(
    configs: list[TrialConfig], *, max_concurrent: int, retries: int,
    on_start: Callable[[TrialConfig], bool | None], on_result: Callable[[dict[str, Any]], None],
    on_progress: Callable[[dict[str, tuple[int, int, dict[str, Any]]]], None] | None = None,
    on_tick: Callable[[], None] | None = None, poll_s: float = 0.5,
) -> None:
    """Submit at most `max_concurrent` tasks at a time; retry a failed trial up to `retries` times.

    `on_start` runs before a trial is submitted and may refuse it (False: another driver has it).
    `on_progress` and `on_tick` (the lease heartbeat) run at most every `poll_s` seconds, not once per
    result, so the driver's own cost per trial does not grow with the number of trials. Finished
    trials' slots are refilled before their results are recorded (`on_result`), so the cluster keeps
    working while the driver writes; a driver killed in between leaves those trials leased and
    unrecorded, to be redone by the next run, as with a kill at any other moment.
    """
    task = ray.remote(_trial_task)
    board = ProgressBoard.remote()
    queue = deque((c, 0) for c in configs)
    in_flight: dict[Any, tuple[TrialConfig, int]] = {}
    last_poll = 0.0

    def fill() -> None:
        while queue and len(in_flight) < max_concurrent:
            config, attempt = queue.popleft()
            if on_start(config) is False:
                continue
            opts = {"num_cpus": config.resources.cpus, "num_gpus": config.resources.gpus, "max_retries": 0}
            in_flight[task.options(**opts).remote(config, board)] = (config, attempt)

    while queue or in_flight:
        fill()
        if not in_flight:
            break
        done, _ = ray.wait(list(in_flight), num_returns=1, timeout=poll_s)
        if done and len(in_flight) > 1:  # every result that is ready, not one per loop
            done, _ = ray.wait(list(in_flight), num_returns=len(in_flight), timeout=0)
        if time.monotonic() - last_poll >= poll_s:
            last_poll = time.monotonic()
            if on_tick is not None:
                on_tick()
            if on_progress is not None:
                on_progress(ray.get(board.snapshot.remote()))
        results = []
        for ref in done:
            config, attempt = in_flight.pop(ref)
            try:
                record = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - the task itself died
                record = failed_record(config, exc)
            if record["status"] == "failed" and attempt < retries:
                queue.append((config, attempt + 1))
                continue
            results.append(record)
        fill()  # the freed slots start their next trials first: recording a result does not idle a CPU
        for record in results:
            board.forget.remote(record["trial_key"])
            on_result(record)
    ray.kill(board)
