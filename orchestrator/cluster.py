"""Connecting to Ray and turning a grid's resource requests into task options."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import os
import signal
import socket
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mechanisms.framework.integrity import OWN_PACKAGES
from orchestrator.ray_probe import not_ray
from storage.faults import fault

if TYPE_CHECKING:
    from workers.config import TrialConfig

CONNECT_TIMEOUT_S = 10.0
# what a trial runs on a worker: privbench's own packages but the dashboards, which only read the store
SHIPPED_PACKAGES = tuple(p for p in OWN_PACKAGES if p != "dashboards")


class ClusterError(RuntimeError):
    """Ray cannot be reached or started: a usage problem (exit 2), said in one line."""

    code = 2


class StoppedWhileStarting(ClusterError):
    """SIGTERM or Ctrl-C while Ray started: Ray was shut down again, and the driver exits 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} while Ray was starting; nothing was run")
        self.code = 128 + signum


def _renote(noted: list[int]) -> None:
    """Note SIGTERM and SIGINT in `noted` again, over any handler Ray's native code installed."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: noted.append(signum))


@contextlib.contextmanager
def _signals_deferred() -> Iterator[list[int]]:
    """While `ray.init` runs, SIGTERM and SIGINT are noted, not acted on, and said after it returns.

    `ray.init` installs its own SIGTERM handlers as it goes (`sys.exit(15)`, then one that kills the node's
    processes and exits 1); a SIGTERM that lands while Ray's C++ core is on the stack aborted the driver with
    Ray's crash dump (exit 134). Here every handler Ray installs during start-up is replaced by one that
    only notes the signal; the caller shuts Ray down and exits 143 (or 130). In the main thread only."""
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def note(signum: int, _frame: Any) -> None:
        noted.append(signum)

    old = {sig: signal.signal(sig, note) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        # lazy: optional dependency
        from ray._private import utils as ray_utils  # Ray's own way of installing its SIGTERM handler
    except ImportError:  # another Ray: its handlers are overridden once it returns
        ray_utils = None
    install = getattr(ray_utils, "set_sigterm_handler", None)

    def deferred(_handler: Any) -> None:
        signal.signal(signal.SIGTERM, note)
        fault("ray_sigterm_handler")  # the kill tests: SIGTERM while Ray starts

    if install is not None:
        ray_utils.set_sigterm_handler = deferred
    try:
        yield noted
    finally:
        if install is not None:
            ray_utils.set_sigterm_handler = install
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _host_port(address: str) -> tuple[str, int] | None:
    """The TCP endpoint an address names (`ray://host:10001`, `host:6379`); None for `auto`."""
    if address == "auto":
        return None
    expected = f"--address {address!r}: expected auto, ray://host:port or host:port"
    try:
        parsed = urllib.parse.urlparse(address if "://" in address else f"tcp://{address}")
        port = parsed.port
    except ValueError as e:  # a port out of range or not a number, an unclosed IPv6 bracket
        raise ClusterError(f"{expected} ({str(e).lower()})") from None
    if not parsed.hostname or port is None:
        raise ClusterError(expected)
    return parsed.hostname, port


def _reachable(address: str) -> None:
    """Fail in seconds, not never: Ray retries an unreachable head for a very long time."""
    endpoint = _host_port(address)
    if endpoint is None:
        return
    try:
        socket.create_connection(endpoint, timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


def runtime_env(plugins: Sequence[str] = ()) -> dict[str, Any]:
    """Ship privbench's own packages, and the grid's `plugins:` modules, to the cluster's workers
    (`py_modules`): nodes need only the dependencies installed, not privbench nor the plugins.
    `PRIVBENCH_SHIP_CODE=0` turns shipping privbench off (privbench installed on every node)."""
    from workers.plugins import shipped  # lazy: heavy (numpy)

    modules = shipped(plugins)
    if os.environ.get("PRIVBENCH_SHIP_CODE", "1") != "0":
        modules = [importlib.import_module(name) for name in SHIPPED_PACKAGES] + modules
    return {"py_modules": modules} if modules else {}


def connect(address: str | None, plugins: Sequence[str] = ()) -> dict[str, float]:
    """Start a local Ray instance (address None) or join one (`auto`, `ray://host:10001`, `host:port`).

    Returns the cluster's total resources. Joining a cluster ships privbench's code to it (see
    `runtime_env`); inside `ray job submit`, the job's own runtime_env is kept.
    """
    os.environ.setdefault("RAY_ACCEPT_CLUSTER_RESOURCES", "1")
    if address is not None:
        _reachable(address)

        endpoint = _host_port(address)
        answered = not_ray(*endpoint) if endpoint is not None else None
        if answered is not None:
            raise ClusterError(f"--address {address} is not a Ray cluster: {answered}")
    import ray  # lazy: heavy (ray)

    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": False}
        if address is None:
            kwargs["include_dashboard"] = False
            if plugins:  # local workers do not see modules the driver found beside the grid file
                from workers.plugins import shipped  # lazy: heavy (numpy)

                kwargs["runtime_env"] = {"py_modules": shipped(plugins)}
        elif not os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"):
            kwargs["runtime_env"] = runtime_env(plugins)
        with _signals_deferred() as noted:
            try:
                ray.init(address=address if address is not None else _local(), **kwargs)
            except Exception as e:  # noqa: BLE001 - any connection failure is a usage problem here
                said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ClusterError(f"cannot connect to Ray at {address or 'a new local instance'}: "
                                   f"{_full_temp_folder() or said}") from None
            _renote(noted)  # Ray's C++ core installs its own SIGTERM handler (abort) as it starts: ours again
            fault("ray_started")  # the kill tests: SIGTERM once Ray's processes run, before the sweep's handler
            if noted:
                ray.shutdown()
                raise StoppedWhileStarting(noted[0])
    return dict(ray.cluster_resources())


def _local() -> str | None:
    """What "no --address" asks Ray for: a new local instance ("local"). Why not Ray's default: without an
    address, `ray.init` joins the latest cluster a `ray start` made on this machine (`/tmp/ray/ray_current_cluster`),
    so a sweep joined whatever cluster another user or process had started there (seen: tests on two workers, a
    sweep's driver joining another test's two-node cluster and waiting on it). Inside `ray job submit` (RAY_ADDRESS
    set by the job) the job's cluster is the one meant: None lets Ray read it."""
    return None if os.environ.get("RAY_ADDRESS") else "local"


MIN_TEMP_MB = 64  # below this, a new local Ray cannot write its session files


def _full_temp_folder() -> str | None:
    """Why a local Ray could not start when its temporary folder is full (Ray itself says "Timed out
    waiting for file"), else None."""
    folder = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or tempfile.gettempdir()  # as Ray picks it
    try:
        info = os.statvfs(folder)
    except OSError:
        return None
    free_mb = info.f_bavail * info.f_frsize / 2**20
    if free_mb >= MIN_TEMP_MB:
        return None
    return (f"the temporary folder {folder} is full ({free_mb:.0f} MB free; Ray writes its session files "
            "there): free some space, or set TMPDIR to a folder with room")


# Packing `gpus: auto`: a trial's share of a GPU is 1/k for the most trials k that fit in its memory, each
# needing its measured peak (one training step and one evaluation batch, `workers.trial.step_memory`) with
# HEADROOM for what one step does not show (fragmentation, a longer text batch), plus its own CUDA context.
HEADROOM = 1.5
CUDA_CONTEXT_MB = 600.0
MAX_PER_GPU = 8  # more processes than this on one GPU contend for it more than they share it


def packed_share(need_mb: float, gpu_mb: float) -> float:
    """The GPU share of a trial that needs `need_mb` on a GPU of `gpu_mb`: 1/k, rounded down to Ray's
    precision (1e-4) so that k shares fit in one GPU; 1.0 when two do not fit."""
    per_trial = need_mb * HEADROOM + CUDA_CONTEXT_MB
    k = max(1, min(MAX_PER_GPU, int(gpu_mb // per_trial)))
    return 1.0 if k == 1 else math.floor(1e4 / k) / 1e4


def gpus_for(request: Any, cluster_gpus: float, memory: tuple[float, float | None] | None = None) -> float:
    """`auto`: no GPU on a cluster without one; else the packed share for the trial's measured memory
    (need, GPU size in MB), or a whole GPU when it was not measured. A number is taken as is."""
    if request != "auto":
        return float(request)
    if cluster_gpus < 1:
        return 0.0
    if memory is None or memory[1] is None or not memory[0] > 0:
        return 1.0
    return packed_share(*memory)


def resolve_gpus(trials: list[TrialConfig], cluster_gpus: float,
                 memory: Mapping[str, tuple[float, float | None]] | None = None) -> list[TrialConfig]:
    """The trials with `gpus: auto` resolved for this cluster (`gpus_for`, with the memory measured per
    `TrialConfig.memory_key`); other settings unchanged."""
    memory = memory or {}
    return [t if t.resources.gpus != "auto" else dataclasses.replace(t, resources=dataclasses.replace(
        t.resources, gpus=gpus_for("auto", cluster_gpus, memory.get(t.memory_key)))) for t in trials]


def resource_problems(trials: list[TrialConfig], resources: dict[str, float]) -> list[str]:
    """Requests the cluster can never satisfy (checked before anything is written)."""
    problems: list[str] = []
    cpus, gpus = resources.get("CPU", 0.0), resources.get("GPU", 0.0)
    want_cpu = max((float(t.resources.cpus) for t in trials), default=0.0)
    want_gpu = max((gpus_for(t.resources.gpus, gpus) for t in trials), default=0.0)
    if want_cpu > cpus:
        problems.append(f"resources.cpus: a trial asks for {want_cpu:g} CPUs, the cluster has {cpus:g}")
    if want_gpu > gpus:
        problems.append(f"resources.gpus: a trial asks for {want_gpu:g} GPUs, the cluster has {gpus:g} "
                        "(use gpus: auto to run on CPU when there is none)")
    return problems
