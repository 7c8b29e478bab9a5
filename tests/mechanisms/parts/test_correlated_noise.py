"""Correlated noise and participation parts against independent references: dp-accounting's RDP of restarted tree
aggregation (Kairouz et al. 2021, Appendix D), dense strategy matrices built in the test, a brute-force maximum
over participation patterns, the streamed noise's covariance on many draws and the prefix-sum errors the papers
state."""

from __future__ import annotations

import itertools
import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.rdp import rdp_privacy_accountant

from mechanisms.accounting import epsilon
from mechanisms.parts.batch_selection import FixedOrderSampling, PoissonSampling, batch_selection
from mechanisms.parts.clipping import FlatClipping
from mechanisms.parts.correlated_noise import (
    BandedToeplitz,
    CorrelatedNoise,
    RestartedTree,
    square_root_coefficients,
)
from mechanisms.parts.noise_addition import GaussianNoise
from mechanisms.parts.participation import Participation
from mechanisms.parts.plan import Parts

ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE = dp_accounting.NeighboringRelation.REPLACE_ONE
REPLACE_SPECIAL = dp_accounting.NeighboringRelation.REPLACE_SPECIAL  # zero-out: a record replaced by a zero one
ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [128, 256, 512]


# ---- independent references ---------------------------------------------------------------------------------

def dense_tree(leaves: int) -> np.ndarray:
    """Node-incidence matrix of one tree: a row per dyadic interval [k 2^l, (k+1) 2^l) inside [0, leaves)."""
    rows = []
    level = 0
    while (1 << level) <= leaves:
        for k in range(leaves >> level):
            row = np.zeros(leaves)
            row[k << level:(k + 1) << level] = 1
            rows.append(row)
        level += 1
    return np.array(rows)


def dense_banded(coefficients, steps: int) -> np.ndarray:
    c = np.zeros((steps, steps))
    for i in range(steps):
        for j in range(max(0, i - len(coefficients) + 1), i + 1):
            c[i, j] = coefficients[i - j]
    return c


def brute_sensitivity(c: np.ndarray, patterns) -> float:
    """max over patterns of max over unit u_j of || sum_j C[:, j] u_j ||: with C^T C >= 0 the same u everywhere,
    i.e. sqrt(1^T G_pi 1); checked against random directions too."""
    gram = c.T @ c
    assert (gram >= -1e-12).all()
    return math.sqrt(max(gram[np.ix_(p, p)].sum() for p in patterns))


def admissible(steps: int, k: int, sep: int):
    for size in range(1, k + 1):
        for p in itertools.combinations(range(steps), size):
            if all(b - a >= sep for a, b in itertools.pairwise(p)):
                yield list(p)


# ---- sensitivity ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("leaves,epochs", [(1, 3), (5, 2), (8, 3), (13, 4), (100, 2), (234, 5)])
def test_tree_sensitivity_and_epsilon_match_dp_accountings_tree_aggregation(leaves, epochs):
    sigma, delta = 3.0, 1e-5
    participation = Participation.cyclic(leaves, epochs)
    tree = RestartedTree(leaves)
    assert tree.sensitivity(participation) ** 2 == pytest.approx(epochs * dense_tree(leaves).sum(0).max())
    noise = CorrelatedNoise(1.0, tree, participation)
    z = noise.noise_multiplier(sigma, FlatClipping(1.0), ADD_REMOVE)  # zero-out: the paper's relation
    restarts = dp_accounting.SelfComposedDpEvent(dp_accounting.SingleEpochTreeAggregationDpEvent(sigma, leaves), epochs)
    reference = rdp_privacy_accountant.RdpAccountant(ORDERS, REPLACE_SPECIAL).compose(restarts).get_epsilon(delta)
    ours = epsilon(dp_accounting.GaussianDpEvent(z), delta, "rdp")
    assert ours == pytest.approx(reference, rel=1e-3)
    # replace-one (what fixed-order certifies) doubles the sensitivity: the reference at sigma / 2
    z_replace = noise.noise_multiplier(sigma, FlatClipping(1.0), REPLACE)
    assert z_replace == pytest.approx(z / 2)


@pytest.mark.parametrize("steps,sep,k", [(6, 2, 3), (8, 3, 3), (9, 4, 2), (7, 7, 1)])
def test_brute_force_over_patterns(steps, sep, k):
    """Every strategy's stated sensitivity equals the brute-force maximum over admissible patterns built from
    the dense matrix (min-separation; and cyclic where it applies)."""
    for bands in (1, 2, sep):
        coefficients = square_root_coefficients(bands)
        strategy = BandedToeplitz(coefficients)
        dense = dense_banded(coefficients, steps)
        minsep = Participation(steps, k, sep, "min-separation")
        assert strategy.sensitivity(minsep) == pytest.approx(brute_sensitivity(dense, admissible(steps, k, sep)))
    for bands in (sep + 1, steps):  # more bands than the separation: overlapping columns, brute-forced
        strategy = BandedToeplitz.square_root(bands)
        dense = dense_banded(strategy.coefficients, steps)
        minsep = Participation(steps, k, sep, "min-separation")
        assert strategy.sensitivity(minsep) == pytest.approx(brute_sensitivity(dense, admissible(steps, k, sep)))
    # cyclic (what fixed-order runs): the offsets' patterns only
    if steps % sep == 0:
        epochs = steps // sep
        cyclic = Participation.cyclic(sep, epochs)
        cyclic_patterns = [list(range(i, steps, sep)) for i in range(sep)]
        for bands in (1, 2, 3, steps):
            strategy = BandedToeplitz.square_root(bands)
            assert strategy.sensitivity(cyclic) == pytest.approx(
                brute_sensitivity(dense_banded(strategy.coefficients, steps), cyclic_patterns))
        tree = RestartedTree(sep)
        dense = np.kron(np.eye(epochs), dense_tree(sep))
        assert tree.sensitivity(cyclic) == pytest.approx(brute_sensitivity(dense, cyclic_patterns))
        assert tree.sensitivity(Participation(steps, epochs, sep, "min-separation")) == pytest.approx(
            brute_sensitivity(dense, admissible(steps, epochs, sep)))


def test_sensitivity_bounds_random_neighbours():
    """No pair of neighbouring gradient streams moves C g by more than the stated sensitivity."""
    rng = np.random.default_rng(0)
    steps, sep, k = 8, 4, 2
    strategy = BandedToeplitz.square_root(3)
    c = dense_banded(strategy.coefficients, steps)
    bound = strategy.sensitivity(Participation(steps, k, sep, "min-separation"))
    patterns = list(admissible(steps, k, sep))
    for _ in range(2000):
        pattern = patterns[rng.integers(len(patterns))]
        u = rng.normal(size=(steps, 5))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        diff = np.zeros((steps, 5))
        diff[pattern] = u[pattern]
        assert np.linalg.norm(c @ diff) <= bound + 1e-9


def test_square_root_coefficients_square_to_prefix_sums():
    """Kalinin & Lampert: the full Toeplitz square root squares to the all-ones lower-triangular A."""
    steps = 12
    c = dense_banded(square_root_coefficients(steps), steps)
    assert np.allclose(c @ c, np.tril(np.ones((steps, steps))))
    assert square_root_coefficients(4) == pytest.approx((1.0, 0.5, 0.375, 0.3125))


# ---- streamed noise -----------------------------------------------------------------------------------------

def _streamed(noise: CorrelatedNoise, steps: int, rows: int, seed: int = 0) -> np.ndarray:
    """(steps, rows) per-step noise of `rows` independent runs, through the stream training uses."""
    stream = noise.start()
    gen = torch.Generator().manual_seed(seed)
    zero = [torch.zeros(rows, 1, dtype=torch.float64)]
    return np.stack([stream.release(zero, 1.0, gen)[0][:, 0].numpy() for _ in range(steps)])


@pytest.mark.parametrize("bands", [1, 2, 4, 8])
def test_banded_stream_covariance_is_inverse_c(bands):
    steps = 8
    strategy = BandedToeplitz.square_root(bands)
    noise = CorrelatedNoise(1.0, strategy, Participation.cyclic(steps, 1))
    w = _streamed(noise, steps, 40_000)
    c_inv = np.linalg.inv(dense_banded(strategy.coefficients, steps))
    expected = c_inv @ c_inv.T
    assert np.abs(np.cov(w) - expected).max() < 0.05
    assert np.allclose(noise.covariance(steps), expected)
    # prefix-sum error (the papers' MSE ||A C^-1||_F^2 / T): streamed vs dense
    a = np.tril(np.ones((steps, steps)))
    mse = ((a @ w) ** 2).mean(axis=1).mean()
    assert mse == pytest.approx(np.linalg.norm(a @ c_inv) ** 2 / steps, rel=0.03)
    # whitening with the declared correlation gives independent unit draws
    white = noise.whiten(w)
    assert np.abs(np.cov(white) - np.eye(steps)).max() < 0.05


def test_full_square_root_prefix_error_closed_form():
    """Full Toeplitz square root: B = C = A^1/2, so the prefix-sum variance at t is sum_{k <= t} r_k^2 (Kalinin &
    Lampert's Eq. for the square-root factorisation)."""
    steps = 10
    noise = CorrelatedNoise(1.0, BandedToeplitz.square_root(steps), Participation.cyclic(steps, 1))
    prefix = np.cumsum(_streamed(noise, steps, 40_000, seed=1), axis=0)
    r = np.array(square_root_coefficients(steps))
    assert np.allclose(prefix.var(axis=1), np.cumsum(r ** 2), rtol=0.04)


def test_plain_tree_prefix_error_is_popcount():
    """Plain tree aggregation: the prefix sum at t is the sum of popcount(t + 1) node draws (Kairouz et al.), and two
    prefixes share the nodes their decompositions share."""
    leaves = 11
    noise = CorrelatedNoise(1.0, RestartedTree(leaves, honaker=False), Participation.cyclic(leaves, 2))
    prefix = np.cumsum(_streamed(noise, leaves, 40_000, seed=2), axis=0)

    def nodes(t):
        out, start = set(), 0
        for level in reversed(range((t + 1).bit_length())):
            if (t + 1) >> level & 1:
                out.add((level, start >> level))
                start += 1 << level
        return out

    expected = np.array([[len(nodes(s) & nodes(t)) for t in range(leaves)] for s in range(leaves)])
    assert np.abs(np.cov(prefix) - expected).max() < 0.08
    assert [expected[t, t] for t in range(leaves)] == [bin(t + 1).count("1") for t in range(leaves)]


def test_honaker_tree_node_variance_and_restart():
    """Honaker's estimate of a full subtree of 2^l leaves has variance 2^l / (2^(l+1) - 1) (less than the plain
    tree's 1); the tree restarts after `leaves` steps (no correlation across epochs)."""
    leaves = 8
    noise = CorrelatedNoise(1.0, RestartedTree(leaves), Participation.cyclic(leaves, 2))
    w = _streamed(noise, 2 * leaves, 40_000, seed=3)
    prefix = np.cumsum(w[:leaves], axis=0)
    for level in range(4):
        t = (1 << level) - 1
        assert prefix[t].var() == pytest.approx(2 ** level / (2 ** (level + 1) - 1), rel=0.04)
    across = np.corrcoef(w)[:leaves, leaves:]
    assert np.abs(across).max() < 0.03
    assert np.allclose(noise.covariance(2 * leaves)[:leaves, leaves:], 0)
    white = noise.whiten(w)
    assert np.abs(np.cov(white) - np.eye(2 * leaves)).max() < 0.05


# ---- the parts' certificate ----------------------------------------------------------------------------------

def test_fixed_order_sampler_is_fixed_and_cyclic():
    sampler = batch_selection("fixed-order", 103, 10, 3)
    assert isinstance(sampler, FixedOrderSampling) and sampler.steps == 30
    gen = torch.Generator().manual_seed(5)
    first = [s.index.tolist() for s in sampler.epoch(gen)]
    second = [s.index.tolist() for s in sampler.epoch(torch.Generator().manual_seed(99))]
    assert first == second  # independent of the trial's generator: fixed before training
    assert sorted(i for b in first for i in b) == list(range(103))
    assert sampler.participation == Participation(30, 3, 10, "cyclic")
    assert sampler.neighboring_relation == REPLACE


def test_fixed_order_dpsgd_certifies_as_shuffle_without_amplification():
    sigma, delta = 1.5, 1e-5
    fixed = Parts(batch_selection("fixed-order", 1000, 100, 4), FlatClipping(1.0), GaussianNoise(1.0))
    shuffle = Parts(batch_selection("shuffle", 1000, 100, 4), FlatClipping(1.0), GaussianNoise(1.0))
    assert fixed.certification_gap() is None
    assert epsilon(fixed.dp_event(sigma), delta, "pld") == pytest.approx(epsilon(shuffle.dp_event(sigma), delta, "pld"))
    # 4 epochs, each one Gaussian at sigma / 2 (replace-one): one Gaussian at sigma / (2 * 2)
    assert epsilon(fixed.dp_event(sigma), delta, "pld") == pytest.approx(
        epsilon(dp_accounting.GaussianDpEvent(sigma / 4), delta, "pld"), rel=1e-3)


def test_correlated_parts_certify_one_gaussian_and_refuse_other_samplers():
    sampler = batch_selection("fixed-order", 1000, 100, 3)
    strategy = BandedToeplitz.square_root(2)
    parts = Parts(sampler, FlatClipping(2.0), CorrelatedNoise(2.0, strategy, sampler.participation))
    assert parts.certification_gap() is None
    sens = math.sqrt(3 * (1 + 0.25))  # 3 non-overlapping columns of norm^2 1 + 1/4
    assert parts.noise_multiplier(4.0) == pytest.approx(4.0 / (2 * sens))  # replace-one: x2
    assert parts.dp_event(4.0) == dp_accounting.GaussianDpEvent(4.0 / (2 * sens))
    poisson = Parts(PoissonSampling(1000, 100, 3), FlatClipping(2.0),
                    CorrelatedNoise(2.0, strategy, sampler.participation))
    assert "participation" in poisson.certification_gap()
    assert isinstance(poisson.dp_event(1.0), dp_accounting.UnsupportedDpEvent)
    wrong = Parts(sampler, FlatClipping(2.0), CorrelatedNoise(2.0, strategy, Participation.cyclic(10, 2)))
    assert "executes" in wrong.certification_gap()
    wider = Parts(sampler, FlatClipping(2.0), CorrelatedNoise(2.0, strategy, Participation(30, 3, 5, "min-separation")))
    assert wider.certification_gap() is None  # a min-separation schema that admits the cyclic patterns
