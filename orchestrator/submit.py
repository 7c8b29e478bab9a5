"""Fan trials out as Ray tasks and record results in completion order (the driver is the only writer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

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


def _trial_task(config: dict[str, Any], board: Any) -> dict[str, Any]:
    def report(done: int, total: int, info: dict[str, Any]) -> None:
        board.update.remote(config["trial_key"], done, total, info)

    return run_trial(config, on_progress=report)


def failed_record(config: dict[str, Any], error: BaseException) -> dict[str, Any]:
    """A trial whose task died (worker crash, OOM kill, lost node) is a failed result too."""
    import traceback

    from workers.result import TrialResult

    return TrialResult(config["sweep"], config["trial_key"], "failed", config, metrics={},
                       error=f"{type(error).__name__}: {error}".splitlines()[0][:2000],
                       traceback="".join(traceback.format_exception(error))).to_record()


def run_all(
    configs: list[dict[str, Any]], *, max_concurrent: int, retries: int,
    on_start: Callable[[dict[str, Any]], None], on_result: Callable[[dict[str, Any]], None],
    on_progress: Callable[[dict[str, tuple[int, int, dict[str, Any]]]], None] | None = None,
    poll_s: float = 0.5,
) -> None:
    """Submit at most `max_concurrent` tasks at a time; retry a failed trial up to `retries` times."""
    task = ray.remote(_trial_task)
    board = ProgressBoard.remote()
    queue = [(c, 0) for c in configs]
    in_flight: dict[Any, tuple[dict[str, Any], int]] = {}
    while queue or in_flight:
        while queue and len(in_flight) < max_concurrent:
            config, attempt = queue.pop(0)
            opts = {"num_cpus": config["resources"]["cpus"], "num_gpus": config["resources"]["gpus"],
                    "max_retries": 0}
            in_flight[task.options(**opts).remote(config, board)] = (config, attempt)
            on_start(config)
        done, _ = ray.wait(list(in_flight), num_returns=1, timeout=poll_s)
        if on_progress is not None:
            on_progress(ray.get(board.snapshot.remote()))
        for ref in done:
            config, attempt = in_flight.pop(ref)
            try:
                record = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - the task itself died
                record = failed_record(config, exc)
            if record["status"] == "failed" and attempt < retries:
                queue.append((config, attempt + 1))
                continue
            on_result(record)
    ray.kill(board)


