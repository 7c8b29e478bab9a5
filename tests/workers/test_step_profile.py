"""A training step never waits on the host: 0 synchronisations per steady-state step for every registry model,
DP-SGD (one-run canaries attached) and non-private, counted by benchmarks/step_profile.py's dispatch mode."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import step_profile


@pytest.fixture(autouse=True)
def feature_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVBENCH_CACHE_DIR", str(tmp_path))  # the scatternet models' scattering features


@pytest.mark.parametrize("mechanism", ["dpsgd", "nonprivate"])
@pytest.mark.parametrize("model", list(step_profile.MODELS))
def test_no_host_synchronisation_in_a_steady_state_step(model, mechanism):
    profile = step_profile.profile(model, mechanism, steps=2)
    assert profile.syncs_per_step == 0, profile.syncs
    assert profile.ops_per_step > 0
    assert profile.canaries == (mechanism == "dpsgd")


def test_the_integrity_checks_add_no_synchronisation():
    """Every step's checks (`integrity.StepGuard`: bounds, stream, observers, the bound's range, the model shadow)
    and adaptive clipping's state, hook copies and replay trace stay on the device."""
    profile = step_profile.profile("mlp", "dpsgd-adaclip", steps=2)
    assert profile.syncs_per_step == 0, profile.syncs


def test_the_model_shadows_block_comparison_adds_no_synchronisation():
    """The model-update shadow compares its steps a block at a time, inside the step that fills the block: the
    steps counted here include one such comparison."""
    import torch

    from workers.train import train_step

    s, batches = step_profile.build("mlp", "dpsgd", device=torch.device("cpu"), canaries=False)
    shadow = s.training.optimizer.guard.shadow
    for _ in range(2):
        train_step(s, next(batches))
    counter = step_profile.StepCounter(step_profile.host_tensors(s))
    with counter:
        for _ in range(shadow.block - 2):
            train_step(s, next(batches))
    assert shadow._step == 0  # the block filled and was compared inside the counted steps
    assert counter.syncs == []


def test_the_counter_sees_a_synchronisation():
    """The counter is not blind: a step that reads its loss on the host (the loop before this issue) counts it."""
    import torch

    from workers.train import train_step

    s, batches = step_profile.build("mlp", "dpsgd", device=torch.device("cpu"), canaries=True)
    train_step(s, next(batches))
    counter = step_profile.StepCounter()
    with counter:
        float(train_step(s, next(batches)))
    assert counter.syncs == ["_local_scalar_dense"]
