"""Fixtures for store tests: a fresh, initialised store per test, copied from one made per session
(MLflow's schema migrations take seconds; copying the databases takes milliseconds)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest


def _copy_db(src: Path, dst: Path) -> None:
    with contextlib.closing(sqlite3.connect(src)) as a, contextlib.closing(sqlite3.connect(dst)) as b:
        a.backup(b)  # consistent even while the source is open in WAL mode


@pytest.fixture(scope="session")
def store_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from storage.location import resolve
    from storage.store import Store

    folder = tmp_path_factory.mktemp("template") / "store"
    Store(resolve(folder), create=True)
    return folder


@pytest.fixture
def store(tmp_path: Path, store_template: Path) -> Path:
    """An initialised, empty store (overrides the suite's plain `store` folder fixture)."""
    folder = tmp_path / "store"
    folder.mkdir()
    for name in ("mlflow.db", "ledger.db"):
        _copy_db(store_template / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def pg():
    """A throwaway PostgreSQL cluster from Debian's binaries for the whole session, always stopped."""
    from tests.servers import postgres

    with postgres() as server:
        yield server
