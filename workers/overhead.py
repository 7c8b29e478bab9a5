"""A private trial's overhead, measured side by side: its own DP step against a non-private step of the same
model, batch and precision, taken in turns in the same process right after training.

Why in the trial: dividing the median step time of a private trial by a non-private trial's compares two runs
made at different times under different load (two DP-SGD rows differing only in sigma read `step x` 1.52 and
2.52 in one quickstart). Steps taken in turns, in a rotating order, see the same load, so their ratio is the
mechanism's cost. `benchmarks/clipping_engine.py` measures the engines the same way.

What is measured: two fresh copies of the model as it was before training, one wrapped by the mechanism at the
plan's sigma (no canaries: the audit is not the mechanism), one with the plain optimizer; both take the same
batch of the training set, WARMUP steps each and then rounds in turns (MIN_ROUNDS, more while both sides have
spent less than the budget, at most MAX_ROUNDS), each step bracketed by a synchronisation (device events on CUDA:
`StepTimer`). On the CPU a step's time is the process's CPU time (`time.process_time`), not the wall clock: a
step's work runs in this process as it is launched, and CPU time does not count the moments the scheduler gives
the cores to other processes, which a busy machine's wall clock does, differently for each step. Peak memory:
one more step of each inside `PeakMemory`. Nothing these steps compute is kept or released: the copies are
discarded.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from typing import Any

import torch
from torch import nn

from workers.config import TrainConfig
from workers.measure import PeakMemory, StepTimer

WARMUP = 3
# Rounds in turns: at least MIN_ROUNDS, then more until both sides have run the budget (a millisecond step's median
# needs hundreds of rounds to hold within a few percent), at most MAX_ROUNDS. The budget is BUDGET_S, or the trial's
# own training time when that is shorter: measuring the overhead never costs more than the training it measures.
MIN_ROUNDS, MAX_ROUNDS, BUDGET_S = 20, 400, 2.0


@dataclasses.dataclass(frozen=True)
class Overhead:
    step_time_ratio: float | None  # median private step over median non-private step
    peak_memory_ratio: float | None  # peak extra memory of a private step over a non-private one's
    private_step_s: float
    nonprivate_step_s: float
    rounds: int

    def metrics(self) -> dict[str, float | None]:
        return {"step_time_ratio": self.step_time_ratio, "peak_memory_ratio": self.peak_memory_ratio,
                "paired_private_step_s": self.private_step_s, "paired_nonprivate_step_s": self.nonprivate_step_s}


def paired_overhead(pristine: nn.Module, bundle: Any, train_split: Any, mechanism: Any, plan: Any, cfg: TrainConfig,
                    *, device: torch.device, seed: int, memory_floor_mb: float = 50.0,
                    budget_s: float = BUDGET_S) -> Overhead:
    """The private step's time and memory over the non-private step's, measured in turns (module docstring).
    `pristine` is the model as it was before training. The memory ratio is None when the non-private step needs
    less than `memory_floor_mb` (a ratio of two tiny, noisy numbers means nothing)."""
    from mechanisms import get as get_mechanism
    from workers.train import setup, train_step

    def copy_of() -> Any:
        return dataclasses.replace(bundle, module=copy.deepcopy(pristine))

    generator = torch.Generator().manual_seed(seed)
    plan = dataclasses.replace(plan, steps=WARMUP + MAX_ROUNDS + 1)  # the window's steps, not the run's
    private = setup(copy_of(), train_split, {}, mechanism, plan, cfg, device=device, generator=generator,
                    noise_generator=torch.Generator(device=device).manual_seed(seed), private=True)
    reference_plan = dataclasses.replace(plan, mechanism="nonprivate", parts=None, batch=plan.batch_selection)
    plain = setup(copy_of(), train_split, {}, get_mechanism("nonprivate"), reference_plan, cfg, device=device,
                  generator=torch.Generator().manual_seed(seed), private=False)
    batch = next(iter(private.training.loader))
    clock = time.process_time if device.type == "cpu" else None
    timers = {side: StepTimer(warmup=WARMUP, device=device, clock=clock) for side in ("private", "plain")}
    sides = {"private": private, "plain": plain}
    rounds = 0
    while rounds < WARMUP + MIN_ROUNDS or (rounds < WARMUP + MAX_ROUNDS and sum(timers["plain"].times) < budget_s):
        for name in (("private", "plain") if rounds % 2 == 0 else ("plain", "private")):
            timers[name].start()
            train_step(sides[name], batch)
            timers[name].stop(batch.size)
        rounds += 1
    memory = {}
    for name, side in sides.items():
        with PeakMemory(device=device) as peak:
            train_step(side, batch)
        memory[name] = peak.extra_mb
    private_s, plain_s = (statistics.median(timers[n].times[WARMUP:]) for n in ("private", "plain"))
    memory_ratio = memory["private"] / memory["plain"] if memory["plain"] >= memory_floor_mb else None
    return Overhead(private_s / plain_s if plain_s > 0 else None, memory_ratio, private_s, plain_s, rounds - WARMUP)


__all__ = ["Overhead", "paired_overhead"]
