"""A trial's peak memory does not depend on what its process did before (issue: two DP trials of one sweep
read 396 MB and 0.41 MB): the same book-keeping steps, measured in a fresh interpreter before and after a
256 MB temporary was allocated and freed, read alike. Without releasing the C heap's free memory at entry
the step after the temporary read 17 MB against 58 MB (measured), because it reused freed pages unseen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ENV = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parents[1])}  # privbench installed or not


def _measure(*workloads: str) -> list[float]:
    out = subprocess.run([sys.executable, str(HERE / "memory_orders.py"), *workloads], capture_output=True,
                         text=True, check=True, env=ENV, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="the CPU figure needs Linux /proc")
def test_peak_memory_is_independent_of_what_ran_before():
    # the process's first steps also make one-time allocations (55-67 MB against 35-46 MB after, measured), so the
    # steps compared are the second and the one after the temporary (their ratio read 0.88-1.19 over 8 runs)
    _, warm, big, after_big = _measure("step", "step", "big", "step")
    assert big > 200  # the temporary was seen
    assert min(warm, after_big) > 20  # the steps hold per-example activations and gradients: tens of MB
    assert 0.6 < after_big / warm < 1.7, (warm, after_big)


def test_step_timer_on_the_cpu_reads_the_host_clock_around_each_step_as_before(monkeypatch):
    """On the CPU the work runs as it is launched, so the timer is today's: the host clock around the step, less
    the audit's seconds; median over the steps after warm-up, examples over the summed time."""
    from workers import measure

    ticks = iter([0.0, 1.0, 10.0, 10.5, 20.0, 20.25, 30.0, 30.5])  # four steps of 1, 0.5, 0.25, 0.5 s
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(ticks))
    timer = measure.StepTimer(warmup=1, device="cpu")
    for excluded in (0.0, 0.0, 0.0, 0.25):
        timer.start()
        timer.stop(10, excluded_s=excluded)
    assert timer.times == [1.0, 0.5, 0.25, 0.25]
    assert timer.median_s == 0.25 and timer.examples_per_s == 40 / 2.0


def test_the_paired_overhead_never_costs_more_than_the_training_it_measures():
    """Rounds beyond MIN_ROUNDS run only while the measurement, its setups included, has spent less than its budget
    (`overhead_budget`: a tenth of the trial's training, at most BUDGET_S) and the ratio's 95% interval is wider
    than PRECISION; the record states the interval it reached."""
    import torch

    import mechanisms
    from mechanisms.parts.plan import PrivacySpec
    from workers import datasets, models
    from workers.config import TrainConfig
    from workers.overhead import BUDGET_S, MAX_ROUNDS, MIN_ROUNDS, PRECISION, overhead_budget, paired_overhead

    splits = datasets.load("digits")
    bundle = models.build("mlp", splits)
    plan = mechanisms.get("dpsgd").plan(PrivacySpec(epsilon=None, sigma=1.0, delta=1e-5, dataset_size=len(splits.train),
                                                    batch_size=64, epochs=1))
    cfg = TrainConfig(epochs=1, batch_size=64, lr=0.1)
    run = lambda budget: paired_overhead(bundle.module, bundle, splits.train, mechanisms.get("dpsgd"), plan, cfg,  # noqa: E731
                                         device=torch.device("cpu"), seed=0, budget_s=budget)
    spent = run(0.0)
    assert spent.rounds == MIN_ROUNDS and spent.ratio_low <= spent.step_time_ratio <= spent.ratio_high
    assert overhead_budget(0.5) == pytest.approx(0.05) and overhead_budget(100.0) == BUDGET_S
    budget = BUDGET_S
    full = run(budget)
    assert MIN_ROUNDS < full.rounds <= MAX_ROUNDS  # an mlp step takes milliseconds: more rounds fit
    # past the budget: at most the last round, the two memory steps and one garbage collection
    assert full.seconds <= budget + 3 * (full.private_step_s + full.nonprivate_step_s) + 0.5
    narrow = (full.ratio_high - full.ratio_low) <= 2 * PRECISION * full.step_time_ratio
    assert narrow or full.seconds >= budget  # it stopped at the precision, or when the budget was spent


def test_a_short_private_trial_still_gets_the_fewest_rounds_that_state_an_interval():
    """Issue 48, 7: a trial whose budget (a tenth of its training) cannot pay for the fewest rounds that state an
    interval still takes them, so that its `step x` is the paired measurement and not the ratio of two trials'
    medians. Before, one epoch of digits (a few dozen steps) was not measured at all."""
    import yaml

    from orchestrator import grid
    from tests.conftest import TINY
    from workers.overhead import MIN_ROUNDS, WARMUP, overhead_budget
    from workers.trial import accelerator_phase, plan_phase

    spec = grid.parse(yaml.safe_dump(TINY | {"grid": TINY["grid"] | {"mechanism": ["dpsgd"]}}))
    (config,) = spec.trials
    metrics = accelerator_phase(config, plan_phase(config)).metrics
    assert 2 * (WARMUP + MIN_ROUNDS) * metrics["step_time_s"] > overhead_budget(metrics["train_s"])  # too short
    assert metrics["paired_rounds"] >= MIN_ROUNDS
    assert metrics["step_time_ratio_low"] <= metrics["step_time_ratio"] <= metrics["step_time_ratio_high"]


def test_a_trial_after_the_freeze_still_has_its_garbage_collected():
    """`freeze_long_lived` (once per process, at a trial's start) keeps the imports out of later full collections;
    a cycle made after it, as a trial's model and hooks may make, is still freed by the memory baseline's collection."""
    import gc
    import weakref

    from workers.measure import freeze_long_lived, release_free_memory

    freeze_long_lived()
    assert gc.get_freeze_count() > 0

    class Node:
        pass

    node = Node()
    node.self = node  # a cycle: reference counting alone never frees it
    ref = weakref.ref(node)
    del node
    release_free_memory()
    assert ref() is None
