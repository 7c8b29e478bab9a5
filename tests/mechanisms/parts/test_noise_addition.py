"""Noise parts: correlated noise is a declared interface (`RunNoise`, with its per-run `RunStream`), which planning,
training and the integrity checks ask for with `isinstance`; a part that only looks like one is not taken for one."""

from __future__ import annotations

import dataclasses

import dp_accounting
import numpy as np
import pytest
import torch

import mechanisms
from mechanisms.framework.integrity.verdict import step_findings
from mechanisms.parts.batch_selection import batch_selection
from mechanisms.parts.clipping import FlatClipping
from mechanisms.parts.correlated_noise import BandedToeplitz, CorrelatedNoise, RestartedTree
from mechanisms.parts.noise_addition import (
    BatchClippedGaussian,
    FrequencyNoise,
    GaussianNoise,
    RunNoise,
    RunStream,
)
from mechanisms.parts.plan import Parts, PrivacySpec

SAMPLER = batch_selection("fixed-order", 200, 50, 2)


@pytest.mark.parametrize("strategy", [BandedToeplitz.square_root(2), RestartedTree(4)])
def test_correlated_noise_declares_the_run_interface(strategy):
    noise = CorrelatedNoise(1.0, strategy, SAMPLER.participation)
    assert isinstance(noise, RunNoise)
    stream = noise.start()
    assert isinstance(stream, RunStream)
    assert stream.step_objects() == (stream, stream.strategy)
    assert noise.correlation.name.startswith(strategy.name)
    white = np.random.default_rng(0).standard_normal((8, 3))
    assert noise.correlation.whiten(white).shape == white.shape


def test_memoryless_noise_is_not_run_noise():
    for noise in (GaussianNoise(1.0), BatchClippedGaussian(1.0, 2.0), FrequencyNoise(1.0, (1.0, 1.0))):
        assert not isinstance(noise, RunNoise)


def test_run_noise_without_its_declarations_cannot_be_made():
    class Partial(RunNoise):
        def release(self, sums, sigma, generator, **_):
            return list(sums)

        def noise_multiplier(self, sigma, clipper, relation):
            return sigma

    with pytest.raises(TypeError, match="start"):
        Partial()


@dataclasses.dataclass(frozen=True)
class LookAlike(GaussianNoise):
    """What the probes used to accept: the attributes of correlated noise without the declared interface."""

    covers_run = True
    participation = SAMPLER.participation

    def start(self):
        return self


def test_a_look_alike_is_planned_as_per_step_noise():
    """The plan composes the look-alike per step (no run-wide Gaussian, no participation check); being a
    plugin's class it is not certified either."""
    run = Parts(SAMPLER, FlatClipping(1.0), CorrelatedNoise(1.0, BandedToeplitz.square_root(1), SAMPLER.participation))
    assert run.certification_gap() is None
    assert run.dp_event(2.0) == dp_accounting.GaussianDpEvent(run.noise_multiplier(2.0))
    fake = Parts(SAMPLER, FlatClipping(1.0), LookAlike(1.0))
    gap = fake.certification_gap()
    assert "not one of privbench's parts" in gap and "participation" not in gap


def test_training_opens_a_stream_for_run_noise_only_and_checks_what_it_runs():
    """make_private opens one stream for run noise (none for memoryless noise), and the step check covers every
    object the stream declares it runs: code replaced on its strategy is caught."""
    spec = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=200, batch_size=50, epochs=2, sigma=1.0)
    data = torch.utils.data.TensorDataset(torch.randn(200, 3), torch.randint(0, 2, (200,)))

    def private(mechanism_id, options=None):
        mechanism = mechanisms.get(mechanism_id)
        plan = mechanism.plan(dataclasses.replace(spec, options=options or {}))
        model = torch.nn.Linear(3, 2)
        return mechanism.make_private(model, torch.optim.SGD(model.parameters(), lr=0.0), data, plan,
                                      criterion=torch.nn.CrossEntropyLoss(),
                                      generator=torch.Generator().manual_seed(0))

    assert private("dpsgd").optimizer.noise_stream is None
    training = private("dp-bandmf", {"bands": 2})
    stream = training.optimizer.noise_stream
    assert isinstance(stream, RunStream)
    assert step_findings(training).passed, step_findings(training).reason
    stream.strategy.next = lambda like: torch.zeros_like(like)  # this test's code, not privbench's
    finding = step_findings(training)
    assert not finding.passed and "next was replaced" in finding.reason
