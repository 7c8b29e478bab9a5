"""Real servers for tests: a throwaway PostgreSQL (Debian's binaries) and an `mlflow server`.

Both bind a free loopback port, run in their own process group, and are always stopped (the whole
group) when the test or session ends, so the suite leaves no process behind. Waits poll a real
condition (the server answers) with a bounded deadline.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

PG_USER = "privbench-pg"  # postgres refuses to run as root
PG_PASSWORD = "s3cret-pw"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_bin(name: str) -> str:
    """Debian keeps the server binaries in /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    raise FileNotFoundError(f"{name} not found: install Debian's postgresql package (scripts/setup.sh does)")


def _as_pg_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", PG_USER, "--", *cmd]


def _ensure_user() -> None:
    if os.geteuid() != 0:
        return
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
                       check=True, capture_output=True)


class Postgres:
    """One PostgreSQL cluster; `database()` gives a fresh, empty database URI (with a password)."""

    def __init__(self) -> None:
        _ensure_user()
        self.root = Path(tempfile.mkdtemp(prefix="privbench-pg-", dir="/tmp"))
        self.port = free_port()
        self.data, self.log = self.root / "data", self.root / "server.log"
        pwfile = self.root / "pw"
        pwfile.write_text(PG_PASSWORD + "\n")
        if os.geteuid() == 0:
            owner = pwd.getpwnam(PG_USER)
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            os.chown(pwfile, owner.pw_uid, owner.pw_gid)
        self.root.chmod(0o700)
        subprocess.run(_as_pg_user([pg_bin("initdb"), "-D", str(self.data), "-U", "postgres", "-E", "UTF8",
                                    "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]),
                       check=True, capture_output=True)
        subprocess.run(_as_pg_user([pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                                    "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                                          "-c fsync=off -c max_connections=200", "start"]),
                       check=True, capture_output=True)
        self._count = 0

    def uri(self, database: str = "postgres", *, driver: str = "") -> str:
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return f"{scheme}://postgres:{PG_PASSWORD}@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        import psycopg

        self._count += 1
        name = f"t{os.getpid()}_{self._count}"
        with psycopg.connect(self.uri(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.uri(name)

    def stop(self) -> None:
        subprocess.run(_as_pg_user([pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"]),
                       capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def postgres() -> Iterator[Postgres]:
    server = Postgres()
    try:
        yield server
    finally:
        server.stop()


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)  # poll interval while the server starts
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


def stop_group(proc: subprocess.Popen) -> None:
    """Stop a process started with start_new_session=True and everything it forked."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def mlflow_server(backend_uri: str, artifacts: Path) -> Iterator[str]:
    """A real `mlflow server` (artifacts proxied through it) on a free loopback port; yields its URL."""
    port = free_port()
    log = open(artifacts.parent / f"mlflow-server-{port}.log", "w")  # noqa: SIM115 - closed below
    env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri,
                             "--artifacts-destination", str(artifacts), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_group(proc)
        log.close()
