"""Time and memory of training steps, measured the same way for every mechanism."""

from __future__ import annotations

import statistics
import threading
import time

import psutil


class PeakMemory:
    """Peak resident memory above the level at start, sampled by a thread.

    `ru_maxrss` cannot be reset and is inherited across fork (measured on this project's 2-core CPU), and a Ray worker
    runs many trials, so we sample RSS instead; the result is the extra memory the steps needed.
    """

    def __init__(self, interval_s: float = 0.005) -> None:
        self._proc = psutil.Process()
        self._interval = interval_s
        self._stop = threading.Event()
        self.baseline = self.peak = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def extra_mb(self) -> float:
        return (self.peak - self.baseline) / 2**20


class StepTimer:
    """Per-step wall times; the first `warmup` steps are excluded from the median."""

    def __init__(self, warmup: int = 2) -> None:
        self.times: list[float] = []
        self.examples = 0
        self._warmup = warmup
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self, n_examples: int, excluded_s: float = 0.0) -> None:
        """`excluded_s`: time inside the step that belongs to an audit, not to the mechanism."""
        self.times.append(time.perf_counter() - self._t0 - excluded_s)
        self.examples += n_examples

    @property
    def median_s(self) -> float | None:
        usable = self.times[self._warmup:] or self.times
        return statistics.median(usable) if usable else None

    @property
    def examples_per_s(self) -> float | None:
        total = sum(self.times)
        return self.examples / total if total > 0 else None
