"""Where a store lives: one argument (a folder, a database URI or an MLflow server) -> concrete URIs."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

DEFAULT_STORE = "./privbench-store"


@dataclasses.dataclass(frozen=True)
class StoreLocation:
    tracking_uri: str  # what MLflow's client talks to
    ledger_uri: str  # SQLAlchemy URL of the sweep ledger
    artifact_root: str | None  # None: the tracking server decides
    folder: Path | None  # the local folder to create, if any

    def create(self) -> None:
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)

    def exists(self) -> bool:
        return self.folder is None or (self.folder / "ledger.db").exists()


def resolve(store: str | os.PathLike[str] | None = None) -> StoreLocation:
    """`--store`, else `$PRIVBENCH_STORE`, else `./privbench-store/` (SQLite + local artifacts)."""
    raw = str(store or os.environ.get("PRIVBENCH_STORE") or DEFAULT_STORE)
    ledger_override = os.environ.get("PRIVBENCH_LEDGER")
    if raw.startswith(("postgresql://", "postgresql+", "mysql://", "sqlite:///")):
        return StoreLocation(raw, ledger_override or raw, None, None)
    if raw.startswith(("http://", "https://")):
        folder = Path(DEFAULT_STORE).resolve()
        return StoreLocation(raw, ledger_override or f"sqlite:///{folder / 'ledger.db'}", None, folder)
    if "://" in raw:
        raise ValueError(f"unsupported store {raw!r}: use a folder, postgresql://, sqlite:/// or http(s)://")
    folder = Path(raw).expanduser().resolve()
    return StoreLocation(
        tracking_uri=f"sqlite:///{folder / 'mlflow.db'}",
        ledger_uri=ledger_override or f"sqlite:///{folder / 'ledger.db'}",
        artifact_root=(folder / "artifacts").as_uri(),
        folder=folder,
    )
