"""Fault points: a test hook that stops the driver at an exact moment of recording.

Kill tests need a driver that dies (or pauses, or sees a full disk) between two given writes, not at a
random time. Production code marks those moments with `fault("after_create_run")` and the like; the call
does nothing unless the environment variable `PRIVBENCH_FAULT` is set, which only tests do.

`PRIVBENCH_FAULT=POINT[:K[:ACTION]]` acts the K-th time (default: the first) this process reaches
`fault(POINT)`. ACTION is empty (SIGKILL: the driver dies there), `stop` (SIGSTOP: a paused driver,
resumed with SIGCONT), `enospc` (the disk is full: OSError 28 raised at that write) or `term` (SIGTERM, as
`kill` or a scheduler sends it).
"""

from __future__ import annotations

import errno
import os
import signal

FAULT_ENV = "PRIVBENCH_FAULT"


def fault(point: str) -> None:
    """Test hook: `PRIVBENCH_FAULT=after_create_run` (or `after_create_run:3`, the third time) kills
    this process with SIGKILL at that point, so kill tests hit exact moments instead of random ones.
    A third field picks another fault: `:stop` (SIGSTOP: a paused driver, resumed with SIGCONT) or
    `:enospc` (the disk is full: OSError 28 at that write). A no-op when the variable is not set."""
    wanted = os.environ.get(FAULT_ENV)
    if not wanted or wanted.split(":", 1)[0] != point:
        return
    _, nth, action = (wanted.split(":") + ["", ""])[:3]
    count = _FAULT_COUNTS[point] = _FAULT_COUNTS.get(point, 0) + 1
    if count != int(nth or 1):
        return
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    elif action == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    else:
        os.kill(os.getpid(), signal.SIGKILL)


_FAULT_COUNTS: dict[str, int] = {}
