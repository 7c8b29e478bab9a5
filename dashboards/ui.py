"""`privbench ui`: the MLflow UI (tracking server) on a store, bound to loopback by default.

MLflow's server runs on a private loopback port behind a small front that privbench serves on the port the
user asked for. The front passes every request through unchanged, except that the UI's page gets a few
lines that set the browser's *defaults* where it has none yet (MLflow keeps these in the browser, never on
the server): the "Model training" pages rather than GenAI's (MLflow 3 decides this per browser, whatever
the experiment's kind), the assistant panel closed, and each sweep's runs view (storage/mlflow_view.py) as
its experiment's first view. A user's own choices are never overwritten. The keys are MLflow 3.x's own
(`BROWSER_DEFAULTS`, `experiment_view_key`); tests/dashboards/test_mlflow_ui.py checks them in Chromium.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Mapping
from typing import IO, Any

from storage.location import RELATIVE_ARTIFACTS, StoreLocation
from storage.mlflow_view import RUNS_VIEW_KEY

BROWSER_DEFAULTS = {  # MLflow UI localStorage keys -> JSON values, set only where the browser has none
    "mlflow.workflowType_v1": json.dumps("machine_learning"),
    "mlflow.assistant.panelOpen_v1": "false",
    "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true",
}
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade"}
BACKEND_WAIT_S = 120.0  # a request that comes while MLflow is still starting waits for it this long


class UiError(RuntimeError):
    """The server cannot start (port busy, bad host): said in one line, exit 2."""


def experiment_view_key(experiment_id: str) -> str:
    """Where MLflow's UI keeps the runs table's state of one experiment (columns, search) in the browser."""
    return f"MLflowLocalStorage-1.1-ExperimentPage-{json.dumps([experiment_id])}-ReactComponentState"


def browser_defaults(views: Mapping[str, str]) -> dict[str, str]:
    """BROWSER_DEFAULTS and, per experiment id, its runs view (the JSON of its runs-view tag)."""
    return BROWSER_DEFAULTS | {experiment_view_key(e): view for e, view in views.items()}


def page_script(defaults: Mapping[str, str]) -> bytes:
    """The lines the UI's page gets: each default is set only where the browser has no value of its own."""
    data = json.dumps(dict(defaults)).replace("</", "<\\/")
    return (f"<script>(function(){{var d={data};for(var k in d){{try{{if(localStorage.getItem(k)===null)"
            f"localStorage.setItem(k,d[k]);}}catch(e){{}}}}}})();</script>").encode()


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
    if location.artifacts_folder is not None:  # the store's own artifacts, wherever the store is now
        env["MLFLOW_SERVE_ARTIFACTS"] = "true"
        env["MLFLOW_ARTIFACTS_DESTINATION"] = str(location.artifacts_folder)
    if location.artifact_root and location.artifact_root != RELATIVE_ARTIFACTS:
        env["MLFLOW_DEFAULT_ARTIFACT_ROOT"] = location.artifact_root
    return env


# What `mlflow server` prints on every start that says nothing to a privbench user (its defaults, which
# privbench chose), its INFO lines, and the deprecation warnings of its dependencies.
NOISE = re.compile(r"Registry store URI not provided|\[MLflow\] Security middleware enabled with default settings"
                   r"|DeprecationWarning|^\s+warnings\.warn\(|^(\S+ \S+ )?INFO[: ]")


def _relay(stream: IO[str], sink: IO[str]) -> None:
    """Copy the server's output to `sink`, less its start-up noise (errors and warnings pass); a line left
    out takes the indented lines under it along (a warning's source line: `  from starlette... import`)."""
    dropped = False
    for line in stream:
        if dropped and line[:1].isspace():
            continue
        dropped = bool(NOISE.search(line))
        if not dropped:
            sink.write(line)
            sink.flush()


class _Front(http.server.ThreadingHTTPServer):
    """The port the user opens: every request goes to MLflow's server unchanged; the UI's page (`/`) gets
    `script` at the start of its head."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], backend: tuple[str, int], script: bytes,
                 alive: Any) -> None:
        family = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_STREAM)[0][0]
        self.address_family = family
        super().__init__(address, _Passage)
        self.backend, self.script, self.alive = backend, script, alive

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # the browser closed the page: nothing to say
            return
        super().handle_error(request, client_address)


class _Passage(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Front

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - no access log, as MLflow's own
        return

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        deadline = time.monotonic() + BACKEND_WAIT_S
        while True:
            conn = http.client.HTTPConnection(*self.server.backend, timeout=600)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                break
            except ConnectionRefusedError:  # MLflow is still starting
                if time.monotonic() > deadline or not self.server.alive():
                    self.send_error(502, "the MLflow server is not running")
                    return
                time.sleep(0.25)
            except OSError:
                self.send_error(502, "the MLflow server did not answer")
                return
            finally:
                conn.close()
        page = self.command == "GET" and urllib.parse.urlsplit(self.path).path in ("/", "/index.html")
        if page and "text/html" in (answer.getheader("Content-Type") or ""):
            data = data.replace(b"<head>", b"<head>" + self.server.script, 1)
        self.send_response(answer.status, answer.reason)
        for key, value in answer.getheaders():
            if key.lower() not in HOP_BY_HOP | {"content-length"}:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _forward


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def home_url(host: str, port: int) -> str:
    """The UI's experiments list."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}/#/experiments"


def runs_table_url(host: str, port: int, experiment_id: str, view: bool = False) -> str:
    """The experiment's runs table. MLflow 3's UI opens an experiment on its GenAI overview when its
    workflow switch (kept in the browser) says GenAI, its default; `workflowType` in the link overrides it.
    `view`: select privbench's runs view (storage/mlflow_view.py) by its share key, for a browser that has its
    own columns saved (MLflow then shows a "shared view" banner); `privbench ui` prints links without it, as
    its front makes the view each experiment's first one."""
    share = f"&viewStateShareKey={RUNS_VIEW_KEY}" if view else ""
    return home_url(host, port) + f"/{experiment_id}/runs?workflowType=machine_learning{share}"


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


def serve(location: StoreLocation, host: str = "127.0.0.1", port: int = 5000,
          views: Mapping[str, str] | None = None) -> int:
    """Run the MLflow server behind the front until it exits or this process gets SIGINT/SIGTERM; returns
    an exit code. `views`: experiment id -> its runs view, made the browser's first view of it.

    The server runs in its own process group (it forks workers), and the whole group is stopped on
    the way out, so no server outlives `privbench ui`.
    """
    check_bindable(host, port)
    inner = _free_loopback_port()
    proc = subprocess.Popen(server_command("127.0.0.1", inner), env=server_env(location), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    relay = threading.Thread(target=_relay, args=(proc.stdout, sys.stderr), daemon=True)
    relay.start()
    try:
        front = _Front((host, port), ("127.0.0.1", inner), page_script(browser_defaults(views or {})),
                       alive=lambda: proc.poll() is None)
    except OSError as e:
        _stop_group(proc)
        raise UiError(f"cannot serve on {host}:{port}: {e.strerror}") from None
    threading.Thread(target=front.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
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
        front.shutdown()
        front.server_close()
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
