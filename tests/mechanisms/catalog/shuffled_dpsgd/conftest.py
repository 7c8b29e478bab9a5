"""Shared fixtures of the shuffled DP-SGD tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Two threads on a shared 2-core machine make tiny models 30x slower (oversubscription)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
