"""Time and memory of training steps, measured the same way for every mechanism."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import statistics
import threading
import time
from typing import Any

import psutil
import torch


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def release_free_memory(collect: bool = True) -> bool:
    """Hand the C heap's free memory back to the kernel (glibc `malloc_trim(0)`, every arena), after a
    garbage collection: what earlier work freed but the allocator kept would otherwise be reused without
    raising the resident size, and a block measured after it would read low (0.41 MB against 396 MB for two
    trials of one sweep in one worker). Returns False where there is no glibc. `collect` False: no garbage
    collection first (the caller made one and freed nothing since)."""
    if collect:
        gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0)) or True
    except (OSError, AttributeError):
        return False


def freeze_long_lived() -> None:
    """Once per process, before a trial makes anything: collect garbage, then move every object alive now (the
    imported modules, the worker's caches) to the collector's permanent generation (`gc.freeze`). Why: every
    trial's memory baseline makes a full collection, which walked the ~376,000 objects of torch's and
    privbench's imports each time (0.19 CPU s per trial in a reused worker); after the freeze it walks only what
    later work made. Objects made after the freeze, a trial's model and batches among them, are collected as
    before, so memory a trial frees is still handed back before the next one is measured."""
    if gc.get_freeze_count() == 0:  # the collector itself says whether this process froze already
        gc.collect()
        gc.freeze()


def reset_peak_rss() -> bool:
    """Reset the kernel's resident high-water mark (VmHWM) to the current RSS: Linux `clear_refs` "5"."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Peak extra memory while the block runs: resident memory on CPU, allocated memory on a GPU.

    CPU (Linux): the kernel's high-water mark VmHWM is reset through /proc/self/clear_refs at entry and
    read at exit, so a step of a few milliseconds is seen exactly (a sampling thread missed such steps
    and read 0.0). `ru_maxrss` cannot be reset and is inherited across fork (measured here), so it is
    not used. Where /proc is unavailable a sampling thread is the fallback. On CUDA (`device` given and
    a GPU present) `extra_mb` is `torch.cuda.max_memory_allocated` above the allocation at entry.
    The figure is the extra memory the block needed above what was live when it started, independent of
    what the process did before: on CPU the C heap's free memory is released first (`release_free_memory`),
    so memory an earlier trial freed and the allocator kept is not reused unseen; on CUDA the figure counts
    allocated tensors only, never the caching allocator's reserve, and the peak counter is reset at entry.
    """

    def __init__(self, interval_s: float = 0.005, device: Any = None, collect: bool = True) -> None:
        self._collect = collect  # False: the caller has just collected garbage (a full collection costs ~0.3 s)
        self._proc = psutil.Process()
        self._interval = interval_s
        self._stop = threading.Event()
        self._cuda = device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available()
        self._device = device
        self._kernel = False
        self.baseline = self.peak = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> PeakMemory:
        if self._cuda:
            torch.cuda.synchronize(self._device)
            torch.cuda.reset_peak_memory_stats(self._device)
            self.baseline = self.peak = torch.cuda.memory_allocated(self._device)
            return self
        release_free_memory(self._collect)
        self._kernel = reset_peak_rss() and _status_kb("VmHWM") is not None
        rss = _status_kb("VmRSS") if self._kernel else None
        if rss is not None:
            self.baseline = self.peak = rss * 1024
        else:
            self._kernel = False
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._cuda:
            torch.cuda.synchronize(self._device)
            self.peak = torch.cuda.max_memory_allocated(self._device)
            return
        if self._kernel:
            self.peak = max(self.baseline, (_status_kb("VmHWM") or 0) * 1024)
            return
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def extra_mb(self) -> float:
        return (self.peak - self.baseline) / 2**20


class StepTimer:
    """Per-step times; the first `warmup` steps are left out of the median.

    On CUDA each step is bracketed by device events recorded in the stream and read once, when the times are
    asked for: the time the device spent on the step, not the time the host took to launch it (the launches
    return long before the kernels finish). On the CPU the work runs as it is launched, so the host clock
    around the step is its time, as before; `clock` replaces that clock (e.g. `time.process_time`).
    """

    def __init__(self, warmup: int = 2, device: Any = None, clock: Any = None) -> None:
        self._times: list[float] = []
        self.examples = 0
        self._warmup = warmup
        self._t0 = 0.0
        self._clock = clock or time.perf_counter  # on the CPU: the host clock around the step, or a given one
        self._cuda = device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available()
        self._pending: list[tuple[Any, Any, float]] = []  # CUDA: (start event, end event, excluded seconds)
        self._start: Any = None

    def start(self) -> None:
        if self._cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = self._clock()

    def stop(self, n_examples: int, excluded_s: float = 0.0) -> None:
        """`excluded_s`: time inside the step that belongs to an audit, not to the mechanism."""
        if self._cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((self._start, end, excluded_s))
        else:
            self._times.append(self._clock() - self._t0 - excluded_s)
        self.examples += n_examples

    @property
    def times(self) -> list[float]:
        """Every step's seconds (on CUDA: one synchronisation, then the events' elapsed times)."""
        if self._pending:
            torch.cuda.synchronize()
            self._times += [start.elapsed_time(end) / 1e3 - excluded for start, end, excluded in self._pending]
            self._pending = []
        return self._times

    @property
    def median_s(self) -> float | None:
        usable = self.times[self._warmup:] or self.times
        return statistics.median(usable) if usable else None

    @property
    def examples_per_s(self) -> float | None:
        total = sum(self.times)
        return self.examples / total if total > 0 else None
