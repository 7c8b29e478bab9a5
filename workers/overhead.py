"""A private trial's overhead, measured side by side: its own DP step against a non-private step of the same
model, batch and precision, taken in turns in the same process right after training.

Why in the trial: dividing the median step time of a private trial by a non-private trial's compares two runs
made at different times under different load (two DP-SGD rows differing only in sigma read `step x` 1.52 and
2.52 in one quickstart). Steps taken in turns, in a rotating order, see the same load, so their ratio is the
mechanism's cost. `benchmarks/clipping_engine.py` measures the engines the same way.

What is measured: two fresh copies of the model as it was before training, one wrapped by the mechanism at the
plan's sigma (no canaries: the audit is not the mechanism), one with the plain optimizer; both take the same
batch of the training set, WARMUP steps each and then rounds in turns, each step bracketed by a synchronisation
(device events on CUDA: `StepTimer`). The ratio is the median of the rounds' own ratios (private over non-private
in the same round, so both saw the same load), stated with its 95% confidence interval (the order statistics of
the rounds' ratios, distribution-free: `step_time_ratio_low` .. `_high`).

What it costs: every private trial that trains with the trainer's step takes at least WARMUP + MIN_ROUNDS rounds,
the fewest that state an interval, even when they exceed its budget: a trial of a few dozen steps pays several times
its usual share rather than go without, because `step x` is this one measurement and nothing else (the ratio of
two trials' median steps is another quantity: at 2 epochs of digits, rows that differed only in sigma read 10.86
and 3.72). Past MIN_ROUNDS, rounds go on until the interval's half-width is within PRECISION of the ratio or the
budget is spent (at most MAX_ROUNDS): the whole measurement, the two setups included, within OVERHEAD_FRACTION of
the trial's training time and never more than BUDGET_S (`overhead_budget`). A millisecond step reaches the
precision in a few dozen rounds; a step too slow for it stops with the wider interval it has, which the record
states. The budget is checked after each round, so the last round and the two memory steps (and a garbage
collection before them) may pass it.

On the CPU a step's time is the process's CPU time (`time.process_time`), not the wall clock: a step's work runs in
this process as it is launched, and CPU time does not count the moments the scheduler gives the cores to other
processes, which a busy machine's wall clock does, differently for each step. Peak memory: one more step of each
inside `PeakMemory`. Nothing these steps compute is kept or released: the copies are
discarded.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import statistics
import time
from math import comb
from typing import Any

import torch
from torch import nn

from workers.config import TrainConfig
from workers.measure import PeakMemory, StepTimer

WARMUP = 2
# Rounds in turns: at least MIN_ROUNDS (the fewest whose order statistics bound the median at 95%), then more until
# the interval is within PRECISION of the ratio or the budget is spent, at most MAX_ROUNDS.
MIN_ROUNDS, MAX_ROUNDS, PRECISION = 6, 400, 0.05
# The budget: OVERHEAD_FRACTION of the trial's training time, at most BUDGET_S, the setups included.
OVERHEAD_FRACTION, BUDGET_S = 0.1, 2.0


def overhead_budget(train_s: float | None) -> float:
    """Seconds the paired measurement may take for a trial that trained `train_s` seconds (module docstring)."""
    return min(BUDGET_S, OVERHEAD_FRACTION * float(train_s or 0.0))


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free `level` confidence interval of the median of `values`: the k-th smallest and k-th largest,
    k the largest with P(Binomial(n, 1/2) < k) <= (1 - level) / 2. None with too few values for any."""
    n, ordered = len(values), sorted(values)
    tail, k, mass = (1 - level) / 2, 0, 0.0
    while k < n // 2 and mass + comb(n, k) / 2**n <= tail:
        mass += comb(n, k) / 2**n
        k += 1
    return None if k == 0 else (ordered[k - 1], ordered[n - k])


@dataclasses.dataclass(frozen=True)
class Overhead:
    step_time_ratio: float | None  # median of the rounds' private step over their non-private step
    peak_memory_ratio: float | None  # peak extra memory of a private step over a non-private one's
    private_step_s: float
    nonprivate_step_s: float
    rounds: int
    ratio_low: float | None = None  # the 95% interval of the ratio (module docstring)
    ratio_high: float | None = None
    seconds: float = 0.0  # what the measurement cost, on its clock (CPU seconds on the CPU), setups included

    def metrics(self) -> dict[str, float | None]:
        return {"step_time_ratio": self.step_time_ratio, "peak_memory_ratio": self.peak_memory_ratio,
                "paired_private_step_s": self.private_step_s, "paired_nonprivate_step_s": self.nonprivate_step_s,
                "step_time_ratio_low": self.ratio_low, "step_time_ratio_high": self.ratio_high,
                "paired_rounds": float(self.rounds)}


def paired_overhead(pristine: nn.Module, bundle: Any, train_split: Any, mechanism: Any, plan: Any, cfg: TrainConfig,
                    *, device: torch.device, seed: int, memory_floor_mb: float = 50.0,
                    budget_s: float = BUDGET_S) -> Overhead:
    """The private step's time and memory over the non-private step's, measured in turns (module docstring):
    MIN_ROUNDS whatever they cost, then more within `budget_s` (`overhead_budget`). `pristine` is the model as it
    was before training. The memory ratio is None when the non-private step needs less than `memory_floor_mb` (a
    ratio of two tiny, noisy numbers means nothing)."""
    from mechanisms import get as get_mechanism  # lazy: heavy (numpy)
    from workers.train import setup, train_step  # lazy: heavy (dp_accounting, numpy)

    clock = time.process_time if device.type == "cpu" else time.perf_counter
    began = clock()

    def copy_of() -> Any:
        return dataclasses.replace(bundle, module=copy.deepcopy(pristine))

    generator = torch.Generator().manual_seed(seed)
    plan = dataclasses.replace(plan, steps=WARMUP + MAX_ROUNDS + 1)  # the window's steps, not the run's
    private = setup(copy_of(), train_split, {}, mechanism, plan, cfg, device=device, generator=generator,
                    noise_generator=torch.Generator(device=device).manual_seed(seed), private=True,
                    integrity=False)  # the trial's own setup checked the step
    reference_plan = dataclasses.replace(plan, mechanism="nonprivate", parts=None, batch=plan.batch_selection)
    plain = setup(copy_of(), train_split, {}, get_mechanism("nonprivate"), reference_plan, cfg, device=device,
                  generator=torch.Generator().manual_seed(seed), private=False)
    batch = next(iter(private.training.loader))
    timers = {side: StepTimer(warmup=WARMUP, device=device, clock=clock if device.type == "cpu" else None)
              for side in ("private", "plain")}
    sides = {"private": private, "plain": plain}
    rounds, interval = 0, None

    def paired() -> list[float]:
        return [p / q for p, q in zip(timers["private"].times[WARMUP:], timers["plain"].times[WARMUP:], strict=True)
                if q > 0]

    while rounds < WARMUP + MAX_ROUNDS:
        for name in (("private", "plain") if rounds % 2 == 0 else ("plain", "private")):
            timers[name].start()
            train_step(sides[name], batch)
            timers[name].stop(batch.size)
        rounds += 1
        if rounds < WARMUP + MIN_ROUNDS:
            continue
        ratios = paired()  # on CUDA: one synchronisation a round
        interval = median_interval(ratios)
        if clock() - began >= budget_s or (
                interval is not None and interval[1] - interval[0] <= 2 * PRECISION * statistics.median(ratios)):
            break
    memory = {}
    gc.collect()  # once for both sides (a full collection is a good part of a small model's budget)
    for name, side in sides.items():
        with PeakMemory(device=device, collect=False) as peak:
            train_step(side, batch)
        memory[name] = peak.extra_mb
    private_s, plain_s = (statistics.median(timers[n].times[WARMUP:]) for n in ("private", "plain"))
    memory_ratio = memory["private"] / memory["plain"] if memory["plain"] >= memory_floor_mb else None
    ratios = paired()
    interval = median_interval(ratios)
    return Overhead(statistics.median(ratios) if ratios else None, memory_ratio, private_s, plain_s, rounds - WARMUP,
                    *(interval or (None, None)), clock() - began)


__all__ = ["Overhead", "median_interval", "overhead_budget", "paired_overhead"]
