"""Book-keeping per-sample clipping: DP-SGD's clipped gradient sum in one backward pass (engine.py)."""

from mechanisms.clipping_engine.engine import BookkeepingEngine, BookkeepingLoss, BookkeepingLossValue, unsupported
from mechanisms.clipping_engine.rules import UnsupportedModule

__all__ = ["BookkeepingEngine", "BookkeepingLoss", "BookkeepingLossValue", "UnsupportedModule", "unsupported"]
