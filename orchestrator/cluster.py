"""Connecting to Ray and turning a grid's resource requests into task options."""

from __future__ import annotations

import os
from typing import Any

import ray


def connect(address: str | None) -> dict[str, float]:
    """Start a local Ray instance (address None) or join one (`auto`, `ray://host:10001`, `host:port`).

    Returns the cluster's total resources. Workers find privbench as an installed package, so every
    node of a remote cluster needs it installed (pip install privbench or the checkout).
    """
    os.environ.setdefault("RAY_ACCEPT_CLUSTER_RESOURCES", "1")
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": False}
        if address is None:
            kwargs["include_dashboard"] = False
        ray.init(address=address, **kwargs)
    return dict(ray.cluster_resources())


def gpus_for(request: Any, cluster_gpus: float) -> float:
    """`auto` = 1 GPU per trial when the cluster has GPUs, else 0; a number is taken as is."""
    if request == "auto":
        return 1.0 if cluster_gpus >= 1 else 0.0
    return float(request)


def resource_problems(trials: list[dict[str, Any]], resources: dict[str, float]) -> list[str]:
    """Requests the cluster can never satisfy (checked before anything is written)."""
    problems: list[str] = []
    cpus, gpus = resources.get("CPU", 0.0), resources.get("GPU", 0.0)
    want_cpu = max((float(t["resources"]["cpus"]) for t in trials), default=0.0)
    want_gpu = max((gpus_for(t["resources"]["gpus"], gpus) for t in trials), default=0.0)
    if want_cpu > cpus:
        problems.append(f"resources.cpus: a trial asks for {want_cpu:g} CPUs, the cluster has {cpus:g}")
    if want_gpu > gpus:
        problems.append(f"resources.gpus: a trial asks for {want_gpu:g} GPUs, the cluster has {gpus:g} "
                        "(use gpus: auto to run on CPU when there is none)")
    return problems
