"""`privbench ui`: the MLflow UI (tracking server) on a store, bound to loopback by default."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any

from storage.location import StoreLocation
from storage.mlflow_view import RUNS_VIEW_KEY


class UiError(RuntimeError):
    """The server cannot start (port busy, bad host): said in one line, exit 2."""


def server_command(host: str, port: int) -> list[str]:
    """The server's command line: no store URI in it (see `server_env`), since every user sees argv (`ps`)."""
    return [sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port), "--workers", "1"]


def server_env(location: StoreLocation) -> dict[str, str]:
    """The store reaches `mlflow server` through its environment, which only this user (and root) can read:
    `mlflow server` reads these variables for its options and hands the URI on to its workers the same way.
    Uvicorn's access log (a line per request) is off; real errors still print."""
    env = {"MLFLOW_DISABLE_TELEMETRY": "true"} | os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                        "MLFLOW_BACKEND_STORE_URI": location.tracking_uri,
                        "MLFLOW_REGISTRY_STORE_URI": location.tracking_uri}
    env.setdefault("MLFLOW_UVICORN_OPTS", "--no-access-log")
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    if location.artifact_root:
        env["MLFLOW_DEFAULT_ARTIFACT_ROOT"] = location.artifact_root
    return env


# What `mlflow server` prints on every start that says nothing to a privbench user (its defaults, which
# privbench chose), its INFO lines, and the deprecation warnings of its dependencies.
NOISE = re.compile(r"Registry store URI not provided|\[MLflow\] Security middleware enabled with default settings"
                   r"|DeprecationWarning|^\s+warnings\.warn\(|^(\S+ \S+ )?INFO[: ]")


def _relay(stream: IO[str], sink: IO[str]) -> None:
    """Copy the server's output to `sink`, less its start-up noise (errors and warnings pass)."""
    for line in stream:
        if not NOISE.search(line):
            sink.write(line)
            sink.flush()


def runs_table_url(host: str, port: int, experiment_id: str, view: bool = True) -> str:
    """The experiment's runs table. MLflow 3's UI opens an experiment on its GenAI overview when its
    workflow switch (kept in the browser) says GenAI, its default; `workflowType` in the link overrides it.
    `view`: the experiment carries privbench's runs view (storage/mlflow_view.py), which the link selects."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    share = f"&viewStateShareKey={RUNS_VIEW_KEY}" if view else ""
    return f"http://{shown}:{port}/#/experiments/{experiment_id}/runs?workflowType=machine_learning{share}"


def check_bindable(host: str, port: int) -> None:
    """MLflow's server exits 0 when it cannot bind; find out first, and say so."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UiError(f"cannot serve on {host}:{port}: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(addr)
        except OSError as e:
            raise UiError(f"cannot serve on {host}:{port}: {e.strerror}") from None


def serve(location: StoreLocation, host: str = "127.0.0.1", port: int = 5000) -> int:
    """Run the MLflow server until it exits or this process gets SIGINT/SIGTERM; returns an exit code.

    The server runs in its own process group (it forks workers), and the whole group is stopped on
    the way out, so no server outlives `privbench ui`.
    """
    check_bindable(host, port)
    proc = subprocess.Popen(server_command(host, port), env=server_env(location), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    relay = threading.Thread(target=_relay, args=(proc.stdout, sys.stderr), daemon=True)
    relay.start()
    stopping: list[float] = []

    def stop(signum: int, _: Any) -> None:  # only signal here: waiting happens in the loop below
        stopping.append(time.monotonic())
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if stopping and time.monotonic() - stopping[0] > 10:  # it ignored SIGTERM
                    os.killpg(proc.pid, signal.SIGKILL)
    finally:
        _stop_group(proc)
        for s, handler in previous.items():
            signal.signal(s, handler)
    if stopping:
        return 0
    return code or 1  # the server ended by itself: something went wrong even if it said 0


def _stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    try:  # workers that outlived the server's own exit
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
