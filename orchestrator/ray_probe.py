"""Is it Ray that answers at an address? Ray's head (GCS) and its client server speak gRPC, that is
HTTP/2: sent HTTP/2's client preface, they answer with a SETTINGS frame. Anything else (a web server,
SSH, a database, a port that accepts and says nothing) would leave `ray.init` retrying for minutes."""

from __future__ import annotations

import socket

PROBE_TIMEOUT_S = 5.0
# HTTP/2 client preface, then an empty SETTINGS frame (length 0, type 4, flags 0, stream 0).
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
SETTINGS = 4
KNOWN = ((b"SSH-", "an SSH server"), (b"HTTP/", "an HTTP/1 server"), (b"220", "a mail or FTP server"),
         (b"+OK", "a POP3 server"), (b"-ERR", "a Redis server"), (b"\x15\x03", "a TLS server"))


def not_ray(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when an HTTP/2 (gRPC) server answers at host:port, else what answered, in words."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            conn.sendall(PREFACE)
            first = conn.recv(64)
    except TimeoutError:
        return f"something at {host}:{port} accepted the connection but did not answer within {timeout:g} s"
    except OSError as e:
        return f"{host}:{port} {e.strerror or e}"
    if len(first) >= 4 and first[3] == SETTINGS:
        return None
    if not first:
        return f"something at {host}:{port} closed the connection without answering"
    what = next((name for prefix, name in KNOWN if first.startswith(prefix)), None)
    shown = first[:40].decode("ascii", "replace").splitlines()[0] if first[:1].isascii() else first[:8].hex()
    return f"{what or 'a server that is not Ray'} answered at {host}:{port} ({shown!r})"
