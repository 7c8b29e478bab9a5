"""Where a store lives: one argument (a folder, a database URI or an MLflow server) -> concrete URIs.

A store is three things: the MLflow tracking store (runs), the sweep ledger (which trials exist and
who is running them) and the artifact root. They travel together so that a team that shares one of
them shares all three: a `postgresql://` store keeps the ledger in the same database, and its artifact
root is recorded in the ledger by the first driver; a tracking server's ledger is `--ledger` (a database
URI the team shares) or, by default, a per-user file that only that user resumes from.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib.util
import os
import re
import urllib.parse
from pathlib import Path

from storage.errors import StoreError
from storage.secrets import join_credentials, mask, mask_uri, remember_secret, split_credentials

# mask, mask_uri and split_credentials are re-exported: callers that resolve stores also mask and parse them.
__all__ = ["DATABASE_SCHEMES", "DEFAULT_STORE", "RELATIVE_ARTIFACTS", "SUPPORTED", "StoreLocation", "data_home",
           "mask", "mask_uri", "normalise_db_uri", "postgres_driver", "resolve", "split_credentials", "sqlite_path"]

DEFAULT_STORE = "./privbench-store"
# A store's own artifacts are named relative to its folder (`mlflow-artifacts:/SWEEP/RUN/artifacts`), so a
# store copied or moved elsewhere still finds them: privbench writes them under FOLDER/artifacts, and
# `privbench ui` serves them from there (`mlflow server --artifacts-destination`).
RELATIVE_ARTIFACTS = "mlflow-artifacts:"
DATABASE_SCHEMES = ("postgresql", "postgres", "sqlite")  # the back ends privbench is tested on
SUPPORTED = "a folder, sqlite:////path/to/file.db, postgresql://user:password@host/db or an http(s):// MLflow server"
def data_home() -> Path:
    """Per-user data folder (XDG), for what has no natural place next to a store."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "privbench"


@dataclasses.dataclass(frozen=True)
class StoreLocation:
    tracking_uri: str  # what MLflow's client talks to
    ledger_uri: str  # SQLAlchemy URL of the sweep ledger
    artifact_root: str | None  # None: the ledger's recorded root (database store) or the server's (http)
    folder: Path | None  # the local folder holding the store's files, if any
    kind: str  # folder | database | server
    artifacts_folder: Path | None = None  # where RELATIVE_ARTIFACTS URIs resolve: FOLDER/artifacts

    @property
    def display(self) -> str:
        """What messages show: the folder, or the URI with its password masked."""
        return str(self.folder) if self.kind == "folder" else mask_uri(self.tracking_uri)

    def exists(self) -> bool:
        """Whether a store was ever created here (servers and databases are asked when opened)."""
        path = sqlite_path(self.ledger_uri)
        try:
            return path is None or path.exists()
        except PermissionError:
            raise StoreError(f"store {self.display}: permission denied (this user cannot look inside "
                             f"{path.parent})") from None
        except OSError as e:  # a name too long, a loop of links
            raise StoreError(f"store {self.display[:120]}: {e.strerror or e}") from None


def sqlite_path(uri: str) -> Path | None:
    """The file of a `sqlite:///` URI (None for other databases)."""
    if not uri.startswith("sqlite:"):
        return None
    raw = uri.split(":///", 1)[1] if ":///" in uri else ""
    raw = raw.removeprefix("file:").split("?", 1)[0]
    return Path(raw) if raw and raw != ":memory:" else None


def postgres_driver() -> str:
    """The installed PostgreSQL driver SQLAlchemy should use (psycopg 3 first, then psycopg2)."""
    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return driver
    raise StoreError("postgresql:// stores need a PostgreSQL driver: pip install 'privbench[postgres]' "
                     "(installs psycopg[binary])")


def normalise_db_uri(uri: str) -> str:
    """`postgresql://` and `postgres://` name the installed driver explicitly (SQLAlchemy's default
    driver may not be the one installed), and the password is percent-escaped, so that one holding
    `/`, `@`, `#` or `:` reaches the server whole; other URIs are returned as they are."""
    scheme, user, password, rest = split_credentials(uri)
    remember_secret(password)
    if scheme in ("postgresql", "postgres"):
        scheme = f"postgresql+{postgres_driver()}"
    elif scheme.startswith("postgres+"):
        scheme = f"postgresql+{scheme.split('+', 1)[1]}"
    elif not scheme.startswith("postgresql"):
        return uri
    return join_credentials(scheme, user, password, rest)


def _resolved(path: Path, raw: str) -> Path:
    """`path` made absolute, its links followed; a loop of links or a name the system refuses is one line."""
    try:
        return path.expanduser().resolve()
    except RuntimeError:  # Python 3.11's "Symlink loop from ..."
        raise StoreError(f"store {mask(raw)[:200]!r} is a loop of symbolic links; point --store at a folder") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StoreError(f"store {mask(raw)[:200]!r} is a loop of symbolic links; point --store at a folder") \
                from None
        raise StoreError(f"store {mask(raw)[:200]!r}: {e.strerror or e}") from None


def _unsupported(raw: str) -> StoreError:
    scheme = raw.split("://", 1)[0].split("+", 1)[0].lower()
    extra = (" (MySQL is not supported: the ledger's creation lock and lease updates are tested on "
             "SQLite and PostgreSQL only)") if scheme in ("mysql", "mariadb") else ""
    return StoreError(f"unsupported store {mask_uri(raw)!r}{extra}: use {SUPPORTED}")


def _is_database(uri: str) -> bool:
    return uri.split("://", 1)[0].split("+", 1)[0] in DATABASE_SCHEMES and "://" in uri


def _server_ledger(server: str) -> str:
    parsed = urllib.parse.urlparse(server)
    ident = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{parsed.hostname or 'server'}_{parsed.port or ''}{parsed.path}")
    return f"sqlite:///{data_home() / 'ledgers' / (ident.strip('_') + '.db')}"


def resolve(store: str | os.PathLike[str] | None = None, *, ledger: str | None = None,
            artifacts: str | None = None) -> StoreLocation:
    """`--store`, else `$PRIVBENCH_STORE`, else `./privbench-store/` (SQLite + local artifacts).

    `ledger` (`--ledger`, `$PRIVBENCH_LEDGER`) overrides where the ledger lives; `artifacts`
    (`--artifacts`, `$PRIVBENCH_ARTIFACTS`) the artifact root of new sweeps.
    """
    raw = str(store or os.environ.get("PRIVBENCH_STORE") or DEFAULT_STORE)
    ledger = ledger or os.environ.get("PRIVBENCH_LEDGER") or None
    artifacts = artifacts or os.environ.get("PRIVBENCH_ARTIFACTS") or None
    if ledger is not None:
        if not _is_database(ledger):
            raise StoreError("--ledger must be a database URI (postgresql://... or sqlite:///...), "
                             f"got {mask_uri(ledger)!r}")
        ledger = normalise_db_uri(ledger)
    if artifacts is not None and "://" not in artifacts:
        artifacts = Path(artifacts).expanduser().resolve().as_uri()
    if _is_database(raw):
        uri = normalise_db_uri(raw)
        path = sqlite_path(uri)
        if uri.startswith("sqlite:") and path is None:
            raise StoreError(f"a sqlite store needs a file: sqlite:////absolute/path/mlflow.db, got {raw!r}")
        own = None
        if path is not None:
            path = _resolved(path, raw)
            uri = f"sqlite:///{path}"
            own = path.parent / "artifacts"
            artifacts = artifacts or RELATIVE_ARTIFACTS
        return StoreLocation(uri, ledger or uri, artifacts, path.parent if path else None, "database", own)
    if raw.startswith(("http://", "https://")):
        # The password is percent-escaped for MLflow's client (requests decodes it): a `#`, `/` or `?` in
        # it would end the URL's host part for a URL parser, and MLflow would read the rest as a port.
        server = join_credentials(*split_credentials(raw.rstrip("/")))
        remember_secret(split_credentials(raw)[2])
        return StoreLocation(server, ledger or _server_ledger(server), artifacts, None, "server")
    if "://" in raw:
        raise _unsupported(raw)
    folder = _resolved(Path(raw), raw)
    return StoreLocation(
        tracking_uri=f"sqlite:///{folder / 'mlflow.db'}",
        ledger_uri=ledger or f"sqlite:///{folder / 'ledger.db'}",
        artifact_root=artifacts or RELATIVE_ARTIFACTS,
        folder=folder,
        kind="folder",
        artifacts_folder=folder / "artifacts",
    )
