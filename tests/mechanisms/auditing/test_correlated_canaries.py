"""The one-run audit of correlated-noise runs: canaries join as fixed-order examples do, and their scores are
whitened with the declared correlation, so a correct run gets a bound above zero and below its certificate, and
the bound is not loose because the noise is correlated."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mechanisms
from mechanisms.auditing.correlated_canaries import CorrelatedCanaries, simulate, simulated_run
from mechanisms.parts.plan import PrivacySpec


def _plan(mechanism_id: str, epsilon: float = 8.0, n: int = 1437, batch: int = 64, epochs: int = 6, **options):
    return mechanisms.get(mechanism_id).plan(PrivacySpec(epsilon=epsilon, delta=1e-5, dataset_size=n,
                                                         batch_size=batch, epochs=epochs, options=options))


@pytest.mark.parametrize("mechanism_id,options", [("dp-bandmf", {"bands": 2}), ("dpftrl-tree", {})])
def test_whitened_audit_of_the_certified_mechanism_is_valid_and_not_loose(mechanism_id, options):
    plan = _plan(mechanism_id, **options)
    steps_per_epoch = plan.batch_selection.steps_per_epoch
    white = simulate(plan.parts.noise, steps_per_epoch, 6, plan.sigma, 2000, seed=1).estimate(1e-5)
    raw = simulate(plan.parts.noise, steps_per_epoch, 6, plan.sigma, 2000, seed=1, whiten=False).estimate(1e-5)
    # canaries are pushed or not (add/remove): their bound is against the zero-out epsilon, below the certificate
    assert 0 < white.epsilon <= plan.extra["epsilon_zero_out"] <= plan.epsilon_certified
    assert white.epsilon > 1.5 * raw.epsilon  # ignoring the correlation would leave most of the signal unused


def test_whitened_scores_are_gaussian_with_the_pattern_signal():
    """Excluded canaries' scores are N(0, sigma^2) (in clip units); included ones are shifted by the whitened
    pattern's norm, ||C b|| for a banded C (sqrt(E (1 + 1/4)) at 2 bands)."""
    plan = _plan("dp-bandmf", bands=2)
    steps_per_epoch = plan.batch_selection.steps_per_epoch
    obs = simulate(plan.parts.noise, steps_per_epoch, 6, plan.sigma, 4000, seed=2)
    out, inside = obs.scores[~obs.included], obs.scores[obs.included]
    assert np.std(out) == pytest.approx(plan.sigma, rel=0.06)
    assert abs(np.mean(out)) < 0.1 * plan.sigma
    assert np.mean(inside) == pytest.approx(np.sqrt(6 * 1.25), rel=0.1 * plan.sigma)


def test_canaries_ride_a_real_run_and_join_as_fixed_order_examples():
    n, batch, epochs, m = 400, 50, 3, 64
    mechanism = mechanisms.get("dp-bandmf")
    plan = mechanism.plan(PrivacySpec(epsilon=None, delta=1e-5, dataset_size=n, batch_size=batch, epochs=epochs,
                                      sigma=0.5, options={"bands": 2}))
    model = torch.nn.Linear(32, 8)  # 264 coordinates for 64 canaries: none share one
    data = torch.utils.data.TensorDataset(torch.randn(n, 32), torch.randint(0, 8, (n,)))
    private = mechanism.make_private(model, torch.optim.SGD(model.parameters(), lr=0.05), data, plan,
                                     criterion=torch.nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0),
                                     noise_generator=torch.Generator().manual_seed(1))
    canaries = CorrelatedCanaries.attach_correlated(private.optimizer, m, noise=private.optimizer.noise,
                                                    steps_per_epoch=plan.batch_selection.steps_per_epoch, seed=3)
    for _ in range(epochs):
        for x, y in private.loader:
            private.optimizer.zero_grad()
            private.criterion(private.module(x), y).backward()
            private.optimizer.step()
    obs = canaries.observations()
    assert obs.steps == plan.steps == 24
    # the whitened residuals of excluded canaries are the i.i.d. draws: second moment sigma^2 (clip 1)
    count, sq, _ = obs.noise_moments
    assert sq / count == pytest.approx(0.25, rel=0.2)
    # every included canary joined exactly one step per epoch, at its offset
    joins = canaries._joins(plan.steps)
    assert (joins.sum(axis=0)[canaries.included] == epochs).all() and not joins[:, ~canaries.included].any()
    assert obs.scores[obs.included].mean() > obs.scores[~obs.included].mean()


@pytest.mark.parametrize("mechanism_id,options", [("dp-bandmf", {"bands": 2}), ("dp-bandmf", {"bands": 4}),
                                                  ("dpftrl-tree", {})])
def test_noise_checks_accept_the_declared_correlation_and_flag_it_undeclared(mechanism_id, options):
    """The issue-37 noise checks on excluded canaries: a correct correlated run (its part's declared correlation
    whitens the residuals) raises no alarm; the same noise read as independent (DP-SGD's declaration, i.e. tree or
    banded noise slipped into dpsgd) is flagged."""
    from mechanisms.auditing import noise_checks

    plan = _plan(mechanism_id, **options)
    steps_per_epoch = plan.batch_selection.steps_per_epoch
    noise = plan.parts.noise
    correct = simulate(noise, steps_per_epoch, 6, plan.sigma, 600, seed=4)
    assert not noise_checks.check_noise(correct.noise_summary, plan.sigma).violated
    canaries, observed = simulated_run(noise, steps_per_epoch, 6, plan.sigma, 600, seed=4)
    series = observed[:, ~canaries.included]  # the same run's excluded residuals, read as independent noise
    undeclared = noise_checks.check_noise(noise_checks.summarize(series), plan.sigma)
    assert undeclared.violated
