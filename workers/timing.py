"""Where a trial's time goes: named parts of each phase, in wall seconds and in this process's CPU seconds.

Why both clocks: the wall clock is what a sweep's wall time is made of (a part's share of it), the CPU time is what
the part cost on a shared, loaded machine, where the wall clock also counts the moments the scheduler gave the
cores to other processes. The parts a trial records (`PARTS`, the record's `timing` section) are measured where
they happen: the driver measures the waits between phases and the writes, the workers what runs in them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

# Every part of a trial's time, in the order shown (`privbench sweep status --timing`), each the wall seconds of:
PARTS = (
    "plan_wait_s",  # its plan, from the accelerator task's submission until the plan was ready (a plan task's run)
    "scheduling_s",  # Ray: from submission (or the plan's readiness) to the task's start in a worker, imports aside
    "imports_s",  # module imports a fresh worker made for the task (0 in a reused worker)
    "prepare_s",  # process settings, the grid's plugins, the record of where it runs (node, versions), the seeds
    "data_s",  # the dataset's splits (0 from the worker's cache)
    "model_s",  # the model's construction
    "planning_s",  # the plan made in the accelerator phase (trials with no plan task: non-private)
    "setup_s",  # the privacy spec, released statistics, the model's copies, the private objects, the step module,
    #             the memory baseline
    "training_s",  # the training steps (with the loss reads between them), the peak memory, the guard's last checks
    "evaluation_s",  # the evaluation after each epoch
    "memory_probe_s",  # the trial's share of the memory probe `gpus: auto` packs by (0 without one)
    "canaries_s",  # the one-run audit in the accelerator phase: its simulations before the first step, its result
    "forward_s",  # the forward passes the membership-inference audit needs
    "overhead_s",  # the paired overhead measurement (`workers.overhead`)
    "transfer_s",  # from the accelerator phase's end to the driver's receipt of its output
)
# Parts beside the accelerator slot (not in `span_s`): the plan task and the analysis on the CPU slots, and the
# driver's write of the accelerator output (a lost analysis resumes from it).
BESIDE = ("plan_s", "save_s", "analysis_wait_s", "audits_s")


class Stopwatch:
    """Named parts of one phase: `with watch.part("data_s"): ...` adds the block's wall and CPU seconds."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - w0, time.process_time() - c0)

    def add(self, name: str, wall: float, cpu: float | None = None) -> None:
        self.wall[name] = self.wall.get(name, 0.0) + wall
        if cpu is not None:
            self.cpu[name] = self.cpu.get(name, 0.0) + cpu

    def to_dict(self) -> dict[str, object]:
        """The record's view: each part's wall seconds, and their CPU seconds under `cpu`."""
        return {**self.wall, "cpu": dict(self.cpu)}

    @classmethod
    def from_dict(cls, data: dict[str, object] | None) -> Stopwatch:
        watch = cls()
        for name, value in (data or {}).items():
            if name != "cpu" and isinstance(value, int | float):
                watch.wall[name] = float(value)
        watch.cpu = {k: float(v) for k, v in dict((data or {}).get("cpu") or {}).items()}  # type: ignore[call-overload]
        return watch


def explained(timing: dict[str, object]) -> tuple[float, float]:
    """The sum of a trial's accelerator-slot parts (`PARTS`) and its `span_s` (the accelerator task's submission to
    the driver's receipt of its output): a breakdown that explains the span leaves little of it unexplained."""
    parts = sum(float(timing.get(p) or 0.0) for p in PARTS)  # type: ignore[arg-type]
    return parts, float(timing.get("span_s") or 0.0)  # type: ignore[arg-type]


__all__ = ["BESIDE", "PARTS", "Stopwatch", "explained"]
