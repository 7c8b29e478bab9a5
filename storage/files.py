"""The store's own files on disk: that each is what it claims to be, and how one is replaced whole.

A folder store is `ledger.db` and `mlflow.db` (each with SQLite's `-wal`, `-shm` sidecars and the ledger's
`.lock`). Before anything is written, each must be a regular file (or absent): a symbolic link from one
to the other made `sweep run` write MLflow's 69 tables into the ledger before it refused, a folder in a
file's place made MLflow retry for 110 s, and a loop of links gave tracebacks. `refuse_odd` says each in
one line.

A rebuilt file replaces the old one in one step (`replace_whole`): it is built beside it as
`<name>.rebuilding`, the old file is kept under a name that says why (`.damaged-<stamp>`,
`.replaced-<stamp>`), and only then renamed into place, so a rebuild killed at any moment leaves the old
file or the new one, never half of one. A rebuilt MLflow database is only whole once the ledger points
at its runs: until then `<name>.unfinished` beside it records which file it is (`unfinished`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sqlite3
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from storage.errors import StoreError
from storage.faults import fault

SIDECARS = ("-wal", "-shm", "-journal")


def refuse_odd(paths: Iterable[Path | None], where: str, *, lock: Path | None = None) -> None:
    """One line, before anything is written, when one of the store's files is not a regular file: a
    symbolic link (to another store file, anywhere, or in a loop), a folder or anything else in its
    place, two names of one file, or the ledger's lock held by a process that is not a driver (a
    rebuild, a copy). Absent files are fine (a new store)."""
    seen: dict[tuple[int, int], Path] = {}
    for path in dict.fromkeys(p for p in paths if p is not None):
        for name in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm"))):
            try:
                info = os.lstat(name)
            except FileNotFoundError:
                continue
            except OSError as e:  # a name too long, a folder on the way that is a file or a loop
                raise StoreError(f"store {where}: {name} cannot be read ({e.strerror})") from None
            if stat.S_ISLNK(info.st_mode):
                target = _link_target(name)
                raise StoreError(f"store {where}: {name} is a symbolic link ({target}), not a file of its own; "
                                 "nothing was written. Move the link aside (and put the file it names in its "
                                 "place, if that file is this store's)")
            if stat.S_ISDIR(info.st_mode):
                raise StoreError(f"store {where}: {name} is a folder, not a SQLite file; nothing was written. "
                                 "Move it aside")
            if not stat.S_ISREG(info.st_mode):
                raise StoreError(f"store {where}: {name} is not a regular file; nothing was written. Move it aside")
            ident = (info.st_dev, info.st_ino)
            if ident in seen:
                raise StoreError(f"store {where}: {name} and {seen[ident]} are one file (hard links); nothing "
                                 "was written. Each must be its own file: move one aside")
            seen[ident] = name
    if lock is not None:
        held_by_another(lock, where)


def _link_target(path: Path) -> str:
    try:
        target = os.readlink(path)
    except OSError:
        return "unreadable"
    try:
        path.resolve(strict=True)
    except RuntimeError:
        return f"-> {target}, a loop of links"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"-> {target}, a loop of links"
        return f"-> {target}, which does not exist"
    return f"-> {target}"


def held_by_another(lock: Path, where: str) -> None:
    """Nothing: the ledger's lock (`<ledger>.lock`) is taken and released by privbench itself; a folder in
    its place is refused here, in one line (flock would raise IsADirectoryError)."""
    if lock.is_dir() or lock.is_symlink():
        raise StoreError(f"store {where}: {lock} is a {'folder' if lock.is_dir() else 'symbolic link'}, not the "
                         "store's lock file; nothing was written. Move it aside")


LOCK_WAIT_S = 10.0  # a driver holds SQLite's write lock for milliseconds; an open transaction for ever


def sqlite_locked(path: Path, where: str) -> None:
    """One line when another process holds SQLite's write lock on the file for more than `LOCK_WAIT_S`
    (an open transaction in a `sqlite3` shell, a backup tool): MLflow would otherwise retry, then print
    two tracebacks. Takes the write lock and gives it back at once; writes nothing (the driver calls it
    just before it writes, after the store's check: a damaged file is said there)."""
    if not path.is_file() or path.stat().st_size == 0 or not os.access(path, os.W_OK):
        return  # a read-only store: whether it may be written is said where it would be
    if write_locked(path, LOCK_WAIT_S):
        raise StoreError(f"store {where}: {path} is locked by another process (an open transaction, held "
                         f"over {LOCK_WAIT_S:g} s); nothing was written. End it and run again")


def write_locked(path: Path, wait: float = 0.0) -> bool:
    """Whether another process holds SQLite's write lock on the file (still, after `wait` seconds). Takes the
    lock and gives it back at once; any other error (a read-only file) is not a lock: False."""
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=wait, isolation_level=None)) as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")
    except sqlite3.OperationalError as e:
        return "locked" in str(e) or "busy" in str(e)
    return False


def fold_log(path: Path) -> bool:
    """Copy the file's write-ahead log into it as far as no reader holds it back (`PRAGMA wal_checkpoint` in
    PASSIVE mode: it never waits, and the log stays valid, so a busy store loses nothing). False: the disk is
    full. Nothing to do without a log, or for a file this user cannot write (read commands read both)."""
    log = path.with_name(path.name + "-wal")
    if not log.is_file() or log.stat().st_size == 0 or not os.access(path, os.W_OK):
        return True
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=0, isolation_level=None)) as db:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    except sqlite3.OperationalError as e:
        if "full" in str(e):
            return False
        if "locked" not in str(e) and "busy" not in str(e):
            raise
    return True


def stamp_name(path: Path, why: str) -> Path:
    """`<name>.<why>-<UTC stamp>` beside `path`, not yet taken."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    kept = path.with_name(f"{path.name}.{why}-{stamp}")
    n = 1
    while any(kept.with_name(kept.name + s).exists() for s in ("", *SIDECARS)):
        n += 1
        kept = path.with_name(f"{path.name}.{why}-{stamp}-{n}")
    return kept


def remove_leftovers(path: Path) -> None:
    """An interrupted build's file (and its sidecars): privbench's own, never a user's."""
    for name in (path, *(path.with_name(path.name + s) for s in SIDECARS)):
        name.unlink(missing_ok=True)


def seal(path: Path) -> None:
    """Make a freshly built SQLite file self-contained (its log folded in, rollback journal mode) and
    on disk, so it can be renamed into place without a sidecar."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode = DELETE").fetchone()
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _fsync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def replace_whole(path: Path, built: Path, why: str, *, sound: bool) -> Path | None:
    """Put the sealed file `built` in place of `path`; the old file (with its log) is kept as
    `<name>.<why>-<stamp>` first. Returns the kept name (None: there was no old file).

    Steps, each a kill point for the fault tests (`PRIVBENCH_FAULT=rebuild_kept` and so on): the old file
    is hard-linked (or copied) to its kept name, its log copied beside it; then its `-wal`/`-shm` are
    removed (a stale log would be replayed onto the new file) and the new file renamed over it, one
    atomic rename. A sound file's log is folded into it first, so removing the log loses nothing."""
    kept = None
    if path.exists():
        if sound and path.with_name(path.name + "-wal").exists():
            with contextlib.closing(sqlite3.connect(path)) as db:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        kept = stamp_name(path, why)
        try:
            os.link(path, kept)
        except OSError:
            shutil.copy2(path, kept)
        log = path.with_name(path.name + "-wal")
        if log.exists() and log.stat().st_size > 0:
            shutil.copy2(log, kept.with_name(kept.name + "-wal"))
        fault("rebuild_kept")
    for suffix in ("-wal", "-shm", "-journal"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    fault("rebuild_unlinked")
    os.replace(built, path)
    _fsync_folder(path.parent)
    fault("rebuild_replaced")
    return kept


def marker(path: Path) -> Path:
    return path.with_name(path.name + ".unfinished")


def mark_unfinished(path: Path, built: Path) -> None:
    """Record (beside `path`) that the file `built` is about to replace it and is not whole until the
    ledger points at it: a kill before `finished` leaves a store that every check names."""
    info = built.stat()
    tmp = marker(path).with_name(marker(path).name + ".tmp")
    tmp.write_text(json.dumps({"device": info.st_dev, "inode": info.st_ino}))
    os.replace(tmp, marker(path))
    _fsync_folder(path.parent)


def unfinished(path: Path) -> bool:
    """Whether the file at `path` is a rebuilt one the ledger does not point at yet (a kill between the
    rename and the ledger's update). A marker left from a build killed before its rename names another
    file: the old file is in place, whole."""
    try:
        recorded = json.loads(marker(path).read_text())
        info = path.stat()
    except (OSError, ValueError):
        return False
    return (info.st_dev, info.st_ino) == (recorded.get("device"), recorded.get("inode"))


def finished(path: Path) -> None:
    marker(path).unlink(missing_ok=True)
    marker(path).with_name(marker(path).name + ".tmp").unlink(missing_ok=True)
