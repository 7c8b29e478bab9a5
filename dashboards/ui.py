"""`privbench ui`: the MLflow UI (tracking server) on a store, bound to loopback by default."""

from __future__ import annotations

import os
import subprocess
import sys

from storage.location import StoreLocation


def server_command(location: StoreLocation, host: str, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", location.tracking_uri,
           "--host", host, "--port", str(port), "--workers", "1"]
    if location.artifact_root:
        cmd += ["--default-artifact-root", location.artifact_root]
    return cmd


def serve(location: StoreLocation, host: str = "127.0.0.1", port: int = 5000) -> int:
    """Run the MLflow server in the foreground until interrupted; returns its exit code."""
    env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(server_command(location, host, port), env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        return proc.wait()
