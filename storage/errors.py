"""One exception for every problem with a store, phrased for a person: the CLI prints it on one line.

Database drivers and MLflow raise long, nested errors (a corrupt SQLite file is a 100-line
traceback); `translated` turns the ones that mean "this store is damaged, missing or read-only" into
a `StoreError` saying which file and what to do.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from storage.secrets import mask


class StoreError(RuntimeError):
    """A store that cannot be used as asked (missing, damaged, read-only, owned by someone else)."""


class Conflict(StoreError):
    """The sweep's experiment belongs to another ledger or to no privbench sweep."""


class StoreLost(StoreError):
    """The store failed while a sweep was recording (deleted, replaced, disk full, server gone): what was
    recorded before is kept, and a rerun resumes. The driver stops with exit 1 (not 2: nothing was wrong
    with the command)."""


class Locked(StoreError):
    """Another process held a store file's write lock longer than SQLite waits (an open transaction, a backup
    tool): nothing more was written, what was recorded is kept, and the command exits 2 (run it again once the
    other process is done; a sweep resumes)."""


class Damaged(StoreError):
    """A store file that SQLite's integrity check finds damaged: nothing is written until it is mended."""


WRITE_ACCESS = "needs write access (read commands — leaderboard, export, sweep status — work on it as it is)"
DISK_FULL = "the disk is full; what was recorded is kept: free some space and run the sweep again to resume"


_HINTS = (
    ("file is not a database", "is not a SQLite database (corrupt or overwritten); restore it from a backup "
                               "or move the store aside"),
    ("database disk image is malformed", "is corrupt (malformed database image); restore it from a backup "
                                         "or move the store aside"),
    ("readonly database", f"is read-only: `sweep run` {WRITE_ACCESS}"),
    ("read-only", f"is read-only: `sweep run` {WRITE_ACCESS}"),
    ("database or disk is full", DISK_FULL),
    ("no space left on device", DISK_FULL),
    ("database is locked", "is locked by another process (an open transaction, a backup tool); what was recorded "
                           "is kept: end that process and run the command again"),
    ("max retries exceeded", "stopped answering (server down or unreachable); what was recorded is kept: "
                             "rerun the sweep once it is back to resume"),
    ("no such table", "is missing privbench or MLflow tables (truncated or not a privbench store)"),
    ("unable to open database file", "cannot be opened (missing folder or no permission)"),
    ("does not exist", "does not exist"),
    ("connection refused", "refuses connections (is the server running?)"),
    ("permission denied", "cannot be read by this user (permission denied)"),
    ("password authentication failed", "rejected the credentials"),
)


def describe(exc: BaseException, where: str) -> str:
    """One line: what is wrong with `where` (already masked), from a driver or MLflow error."""
    text = str(getattr(exc, "orig", None) or exc)
    low = text.lower()
    for needle, hint in _HINTS:
        if needle in low:
            return f"store {where} {hint}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return mask(f"store {where}: {first[:300]}")


def _is_store_error(exc: BaseException) -> bool:
    names = {c.__module__.split(".")[0] + "." + c.__name__ for c in type(exc).__mro__}
    return any(n.startswith(("sqlalchemy.", "sqlite3.", "psycopg", "psycopg2.", "mlflow.MlflowException",
                             "alembic.")) for n in names)


def _os_error(exc: OSError, where: str) -> StoreError | None:
    """The file-system errors a store meets: no permission, a full disk (a traceback otherwise)."""
    if exc.errno in (errno.EACCES, errno.EPERM):
        return StoreError(f"store {where} cannot be used by this user: permission denied"
                          + (f" on {exc.filename}" if exc.filename else ""))
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreLost(f"store {where}: {DISK_FULL}")
    if exc.errno in (errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.EROFS, errno.EIO):
        return StoreError(f"store {where[:120]}: {exc.strerror}")
    return None


@contextlib.contextmanager
def translated(where: str) -> Iterator[None]:
    """Re-raise database/MLflow errors (and a denied or full file system) as a one-line `StoreError`
    about the store at `where`."""
    try:
        yield
    except StoreError:
        raise
    except OSError as exc:
        mapped = _os_error(exc, where)
        if mapped is None:
            raise
        raise mapped from exc
    except Exception as exc:
        if not _is_store_error(exc):
            raise
        kind = Locked if "database is locked" in str(exc).lower() else StoreError
        raise kind(describe(exc, where)) from exc
