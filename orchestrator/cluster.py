"""Connecting to Ray and turning a grid's resource requests into task options."""

from __future__ import annotations

import dataclasses
import os
import socket
import urllib.parse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.config import TrialConfig

CONNECT_TIMEOUT_S = 10.0
SHIPPED_PACKAGES = ("orchestrator", "workers", "mechanisms", "storage")


class ClusterError(RuntimeError):
    """Ray cannot be reached or started: a usage problem (exit 2), said in one line."""


def _host_port(address: str) -> tuple[str, int] | None:
    """The TCP endpoint an address names (`ray://host:10001`, `host:6379`); None for `auto`."""
    if address == "auto":
        return None
    parsed = urllib.parse.urlparse(address if "://" in address else f"tcp://{address}")
    if not parsed.hostname or parsed.port is None:
        raise ClusterError(f"--address {address!r}: expected auto, ray://host:port or host:port")
    return parsed.hostname, parsed.port


def _reachable(address: str) -> None:
    """Fail in seconds, not never: Ray retries an unreachable head for a very long time."""
    endpoint = _host_port(address)
    if endpoint is None:
        return
    try:
        socket.create_connection(endpoint, timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


def runtime_env() -> dict[str, Any]:
    """Ship privbench's own packages to the cluster's workers (`py_modules`): nodes need only the
    dependencies installed, not privbench. `PRIVBENCH_SHIP_CODE=0` turns it off (privbench installed
    on every node)."""
    if os.environ.get("PRIVBENCH_SHIP_CODE", "1") == "0":
        return {}
    import importlib

    return {"py_modules": [importlib.import_module(name) for name in SHIPPED_PACKAGES]}


def connect(address: str | None) -> dict[str, float]:
    """Start a local Ray instance (address None) or join one (`auto`, `ray://host:10001`, `host:port`).

    Returns the cluster's total resources. Joining a cluster ships privbench's code to it (see
    `runtime_env`); inside `ray job submit`, the job's own runtime_env is kept.
    """
    os.environ.setdefault("RAY_ACCEPT_CLUSTER_RESOURCES", "1")
    if address is not None:
        _reachable(address)
    import ray

    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": False}
        if address is None:
            kwargs["include_dashboard"] = False
        elif not os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"):
            kwargs["runtime_env"] = runtime_env()
        try:
            ray.init(address=address, **kwargs)
        except Exception as e:  # noqa: BLE001 - any connection failure is a usage problem here
            raise ClusterError(f"cannot connect to Ray at {address or 'a new local instance'}: "
                               f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
    return dict(ray.cluster_resources())


def gpus_for(request: Any, cluster_gpus: float) -> float:
    """`auto` = 1 GPU per trial when the cluster has GPUs, else 0; a number is taken as is."""
    if request == "auto":
        return 1.0 if cluster_gpus >= 1 else 0.0
    return float(request)


def resolve_gpus(trials: list[TrialConfig], cluster_gpus: float) -> list[TrialConfig]:
    """The trials with `gpus: auto` resolved for this cluster (`gpus_for`); other settings unchanged."""
    return [t if t.resources.gpus != "auto" else
            dataclasses.replace(t, resources=dataclasses.replace(t.resources, gpus=gpus_for("auto", cluster_gpus)))
            for t in trials]


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
