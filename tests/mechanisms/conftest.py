"""Fixtures of the mechanism suites that run real sweeps."""

from __future__ import annotations

import pytest


@pytest.fixture
def own_ray():
    """No Ray running: the sweep starts its own local instance, which ships the grid's `plugins:` modules (found
    beside the grid file) to its workers; it is shut down after."""
    import ray

    ray.shutdown()
    yield
    ray.shutdown()
