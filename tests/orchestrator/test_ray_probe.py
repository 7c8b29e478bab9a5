"""orchestrator/ray_probe.py: a real gRPC server (what Ray's head speaks) passes the probe; an HTTP/1 server, a port
that accepts and says nothing, and a closed port are each said in words, within the probe's timeout."""

from __future__ import annotations

import http.server
import socket
import threading
from concurrent import futures

import grpc
import pytest

from orchestrator.ray_probe import not_ray


def test_a_grpc_server_is_taken_for_ray():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert not_ray("127.0.0.1", port, timeout=5.0) is None
    finally:
        server.stop(None)


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        """No request log on the test's stderr."""


def test_pythons_http_server_is_not_ray():
    """http.server refuses HTTP/2.0 with a bare HTML page (no status line): still not Ray, and said so."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        said = not_ray("127.0.0.1", server.server_address[1], timeout=5.0)
    finally:
        server.shutdown()
        server.server_close()
    assert said is not None and f"answered at 127.0.0.1:{server.server_address[1]}" in said, said


@pytest.mark.parametrize("banner, named", [(b"SSH-2.0-OpenSSH_9.2\r\n", "an SSH server"),  # RFC 4253, 4.2
                                           (b"HTTP/1.1 400 Bad Request\r\n\r\n", "an HTTP/1 server")])
def test_a_known_banner_is_named(banner, named):
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()

        def answer() -> None:
            conn, _ = srv.accept()
            with conn:
                conn.sendall(banner)
                while conn.recv(4096):  # read the preface until the probe hangs up: no reset loses the banner
                    pass

        thread = threading.Thread(target=answer)
        thread.start()
        said = not_ray("127.0.0.1", srv.getsockname()[1], timeout=5.0)
        thread.join()
    assert said is not None and said.startswith(f"{named} answered at 127.0.0.1:"), said


def test_a_silent_port_and_a_closed_port_are_said_as_such():
    with socket.socket() as silent:  # listens (the kernel accepts) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        said = not_ray("127.0.0.1", silent.getsockname()[1], timeout=0.2)
    assert said is not None and "accepted the connection but did not answer within 0.2 s" in said, said
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    said = not_ray("127.0.0.1", port, timeout=1.0)
    assert said == f"127.0.0.1:{port} Connection refused", said
