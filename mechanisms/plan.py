"""What a trial asks of a mechanism (`PrivacySpec`) and what the mechanism answers (`PrivacyPlan`).

A mechanism never reports an epsilon it computed from its own code path alone: the plan carries the
`DpEvent` describing the noise the code *effectively* adds, and the certified epsilon is a pure function
of that event (dp-accounting style), so it can be recomputed by any reference accountant later.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import dp_accounting

CALIBRATIONS = ("claimed", "certified")
SAMPLERS = ("poisson", "fixed", "shuffle")


@dataclasses.dataclass(frozen=True)
class PrivacySpec:
    """The privacy side of one trial: target, batch geometry and how to calibrate."""

    epsilon: float | None  # target; None means "no target" (nonprivate, or an explicit sigma)
    delta: float
    dataset_size: int
    batch_size: int
    epochs: int
    clip: float = 1.0
    calibration: str = "claimed"
    accountant: str = "pld"
    sampler: str = "poisson"
    sigma: float | None = None  # an explicit noise multiplier skips calibration
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    model_dim: int | None = None  # trainable parameters (e.g. d in the shuffled-DP-SGD accountant)
    n_tensors: int | None = None  # trainable parameter tensors (per-layer clipping's sensitivity)

    def __post_init__(self) -> None:
        if self.epsilon is not None and not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"epsilon must be a positive finite number, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta}")
        if self.dataset_size < 1 or self.batch_size < 1 or self.epochs < 1:
            raise ValueError("dataset_size, batch_size and epochs must be >= 1")
        if self.batch_size > self.dataset_size:
            raise ValueError(f"batch_size {self.batch_size} exceeds dataset_size {self.dataset_size}")
        if self.clip <= 0:
            raise ValueError(f"clip must be > 0, got {self.clip}")
        if self.calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {self.calibration!r}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if self.sigma is not None and self.sigma <= 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma}")

    @property
    def sample_rate(self) -> float:
        return self.batch_size / self.dataset_size

    @property
    def steps(self) -> int:
        """Expected number of updates: `epochs` passes of `dataset_size / batch_size` steps each."""
        return self.epochs * max(1, round(self.dataset_size / self.batch_size))


@dataclasses.dataclass(frozen=True)
class PrivacyPlan:
    """A mechanism's answer: its noise, and the three sources of truth about that noise.

    `epsilon_claimed` comes from the mechanism's own published analysis (`claimed_by` names it);
    `epsilon_certified` from the reference accountant applied to `effective_event`; `None` where no
    value applies (nonprivate: both None; no sound analysis: certified None).
    """

    mechanism: str
    sigma: float | None
    sample_rate: float
    steps: int
    delta: float
    sampler: str
    accountant: str
    claimed_by: str | None
    epsilon_claimed: float | None
    epsilon_certified: float | None
    effective_event: dp_accounting.DpEvent
    notes: str = ""
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def as_record(self) -> dict[str, Any]:
        """Plain JSON-ready view (the event as its repr, which dp-accounting keeps readable)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["effective_event"] = repr(self.effective_event)
        out["extra"] = dict(self.extra)
        return out
