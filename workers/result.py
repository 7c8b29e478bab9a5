"""The result of one trial: produced here, crossed to the driver as a plain JSON-ready mapping."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

STATUSES = ("finished", "failed")


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """Everything the driver records for a trial; `None` marks a value that does not apply."""

    sweep: str
    trial_key: str
    status: str
    config: dict[str, Any]
    metrics: dict[str, float | None] = dataclasses.field(default_factory=dict)
    curves: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    privacy: dict[str, Any] = dataclasses.field(default_factory=dict)
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None
    traceback: str | None = None
    timing: dict[str, Any] = dataclasses.field(default_factory=dict)  # where its time went (`workers.timing`)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def to_record(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        json.dumps(record, allow_nan=True)  # fail here, in the worker, if something is not serialisable
        return record
