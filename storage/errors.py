"""One exception for every problem with a store, phrased for a person: the CLI prints it on one line.

Database drivers and MLflow raise long, nested errors (a corrupt SQLite file is a 100-line
traceback); `translated` turns the ones that mean "this store is damaged, missing or read-only" into
a `StoreError` saying which file and what to do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class StoreError(RuntimeError):
    """A store that cannot be used as asked (missing, damaged, read-only, owned by someone else)."""


class Conflict(StoreError):
    """The sweep's experiment belongs to another ledger or to no privbench sweep."""


_HINTS = (
    ("file is not a database", "is not a SQLite database (corrupt or overwritten); restore it from a backup "
                               "or move the store aside"),
    ("database disk image is malformed", "is corrupt (malformed database image); restore it from a backup "
                                         "or move the store aside"),
    ("readonly database", "is read-only; privbench can read it (leaderboard, export, status) but `sweep run` "
                          "needs write access"),
    ("read-only", "is read-only; privbench can read it (leaderboard, export, status) but `sweep run` "
                  "needs write access"),
    ("no such table", "is missing privbench or MLflow tables (truncated or not a privbench store)"),
    ("unable to open database file", "cannot be opened (missing folder or no permission)"),
    ("does not exist", "does not exist"),
    ("connection refused", "refuses connections (is the server running?)"),
    ("password authentication failed", "rejected the credentials"),
)


def describe(exc: BaseException, where: str) -> str:
    """One line: what is wrong with `where` (already masked), from a driver or MLflow error."""
    from storage.location import mask

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


@contextlib.contextmanager
def translated(where: str) -> Iterator[None]:
    """Re-raise database/MLflow errors as a one-line `StoreError` about the store at `where`."""
    try:
        yield
    except StoreError:
        raise
    except Exception as exc:
        if not _is_store_error(exc):
            raise
        raise StoreError(describe(exc, where)) from exc
