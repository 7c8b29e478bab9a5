"""Book-keeping per-sample clipping: DP-SGD's clipped gradient sum in one backward pass (engine.py)."""

from mechanisms.bookkeeping.engine import BookkeepingEngine, BookkeepingLoss, BookkeepingLossValue, unsupported
from mechanisms.bookkeeping.registry import UnsupportedModule

__all__ = ["BookkeepingEngine", "BookkeepingLoss", "BookkeepingLossValue", "UnsupportedModule", "unsupported"]
