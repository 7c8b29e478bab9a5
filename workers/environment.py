"""Process-wide settings, applied by one explicit call at the entry points (the CLI and each trial).

Nothing in privbench changes environment variables, warning filters or library constants on import:
importing `mechanisms` in a notebook leaves the process as it was. `configure()` is idempotent.
"""

from __future__ import annotations

import os
import warnings


def configure() -> None:
    """Hugging Face offline unless the user chose (`PRIVBENCH_HF_OFFLINE=0` allows the hub), and Opacus'
    warning about full backward hooks on a first layer whose input needs no gradient (expected) silenced."""
    from workers.datasets.hf import hub_offline_default  # lazy: heavy (numpy)

    if os.environ.get("PRIVBENCH_HF_OFFLINE", "1") != "0":
        hub_offline_default()
    warnings.filterwarnings("ignore", message="Full backward hook is firing")


__all__ = ["configure"]
