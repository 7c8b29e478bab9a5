"""aGM / aMGM against published test vectors, dp-accounting's independent analytic Gaussian, and the
exact privacy-loss curve (arXiv 2309.06746 §2.4-2.6)."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import gaussian_mechanism
from dp_accounting.pld import privacy_loss_mechanism
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.accounting import analytic_gaussian as ag
from mechanisms.accounting.reference import pld_accountant

# epsilon -> (delta0, B, sigma at S = 1), delta = 1e-5 (paper)
DIGEST_1E5 = {
    0.1: (0.13821, 0.032521, 30.7496), 0.5: (0.23842, 0.142211, 7.031827), 1: (0.28621, 0.268051, 3.730632),
    2: (0.33190, 0.501552, 1.993812), 3: (0.35633, 0.719117, 1.390593), 4: (0.37230, 0.924931, 1.081162),
    8: (0.40559, 1.666031, 0.600229), 12: (0.42160, 2.316725, 0.431644), 16: (0.43150, 2.905478, 0.344177),
    24: (0.44355, 3.953415, 0.252946),
}
# (delta, epsilon) -> B (paper, other deltas)
DIGEST_OTHER = {(1e-6, 0.5): 0.124106, (1e-6, 1): 0.236704, (1e-6, 4): 0.837859, (1e-6, 8): 1.531545,
                (1e-3, 0.5): 0.216914, (1e-3, 1): 0.388401, (1e-3, 4): 1.214952, (1e-3, 8): 2.083274}


@pytest.mark.parametrize("epsilon", sorted(DIGEST_1E5))
def test_algorithm1_matches_published_vectors(epsilon):
    delta0, bound, sigma = DIGEST_1E5[epsilon]
    result = ag.analytic_bound(epsilon, 1e-5)
    assert result.delta0 == pytest.approx(delta0, abs=1e-5)
    assert result.value == pytest.approx(bound, rel=1e-5)
    assert result.branch == "alpha>1"
    assert ag.agm_sigma(epsilon, 1e-5) == pytest.approx(sigma, rel=1e-5)
    assert ag.agm_sigma(epsilon, 1e-5, sensitivity=2.0) == pytest.approx(2 * sigma, rel=1e-5)


@pytest.mark.parametrize("delta, epsilon", sorted(DIGEST_OTHER))
def test_algorithm1_other_deltas(delta, epsilon):
    assert ag.analytic_bound(epsilon, delta).value == pytest.approx(DIGEST_OTHER[delta, epsilon], rel=1e-5)


def test_issue_vectors_and_single_release_delta():
    assert [round(ag.agm_sigma(e, 1e-5), 4) for e in (1, 4, 8)] == [3.7306, 1.0812, 0.6002]
    # the shuffled DP-SGD paper's unit-test value of Theorem 6 at d = 1 is this same curve
    assert ag.agm_delta(1.0, 1.0) == pytest.approx(0.12693673750664392, rel=1e-12)


@pytest.mark.parametrize("epsilon, delta_true", [(8, 7.97e-6), (12, 5.94e-5), (16, 3.36e-4), (24, 5.70e-3)])
def test_classical_gm_sigma_true_delta(epsilon, delta_true):
    """The classical sigma = sqrt(2 ln(1.25/delta))/epsilon under-noises beyond epsilon ~ 8.4."""
    sigma_gm = math.sqrt(2 * math.log(1.25 / 1e-5)) / epsilon
    assert ag.agm_delta(epsilon, sigma_gm) == pytest.approx(delta_true, rel=2e-3)


@settings(max_examples=25, deadline=None)
@given(epsilon=st.floats(0.01, 40), log_delta=st.floats(-12, math.log(0.4)))
def test_agm_sigma_equals_dp_accounting(epsilon, log_delta):
    delta = math.exp(log_delta)
    ours = ag.agm_sigma(epsilon, delta)
    assert ours == pytest.approx(gaussian_mechanism.get_sigma_gaussian(epsilon, delta), rel=1e-7)
    # exact: the calibrated ratio sits on the curve, and never on the wrong side of it
    assert ag.agm_delta(epsilon, ours) <= delta * (1 + 1e-9)
    assert ag.agm_delta(epsilon, ours) == pytest.approx(delta, rel=1e-6)


def test_both_branches_agree_with_the_direct_curve():
    """delta >= delta0 takes the alpha <= 1 branch (small epsilon, large delta); it must still be exact."""
    for epsilon, delta in [(1e-3, 0.3), (0.01, 0.2), (0.05, 0.3), (0.5, 0.3)]:
        result = ag.analytic_bound(epsilon, delta)
        assert result.branch == ("alpha<=1" if delta >= result.delta0 else "alpha>1")
        assert ag.gaussian_delta(epsilon, result.value) == pytest.approx(delta, rel=1e-8)
        assert ag.agm_sigma(epsilon, delta) == pytest.approx(
            gaussian_mechanism.get_sigma_gaussian(epsilon, delta), rel=1e-7)
    assert ag.analytic_bound(1e-3, 0.3).branch == "alpha<=1"
    assert ag.analytic_bound(1.0, 1e-5).branch == "alpha>1"


def test_small_epsilon_limit():
    """epsilon -> 0 (epsilon << B^2): B -> 2 Phi^-1((1 + delta)/2)."""
    from scipy.stats import norm
    assert ag.analytic_bound(1e-13, 1e-5).value == pytest.approx(2 * norm.ppf((1 + 1e-5) / 2), rel=1e-3)


@settings(max_examples=20, deadline=None)
@given(sigma=st.floats(0.05, 50), log_delta=st.floats(-12, -1))
def test_agm_epsilon_inverse_and_independent_reference(sigma, log_delta):
    delta = math.exp(log_delta)
    eps = ag.agm_epsilon(sigma, delta)
    assert eps == pytest.approx(gaussian_mechanism.get_epsilon_gaussian(sigma, delta), rel=1e-7, abs=1e-10)
    if eps > 0:
        assert ag.agm_sigma(eps, delta) == pytest.approx(sigma, rel=1e-7)


def test_agm_delta_matches_dp_accounting_privacy_loss():
    for sigma, sens, eps in [(1.0, 1.0, 0.5), (2.5, 2.0, 1.0), (0.6, 1.0, 8.0)]:
        loss = privacy_loss_mechanism.GaussianPrivacyLoss(standard_deviation=sigma, sensitivity=sens)
        assert ag.agm_delta(eps, sigma, sens) == pytest.approx(loss.get_delta_for_epsilon(eps), rel=1e-9)


@settings(max_examples=20, deadline=None)
@given(e1=st.floats(0.05, 20), e2=st.floats(0.05, 20), d1=st.floats(-11, -2), d2=st.floats(-11, -2),
       s=st.floats(0.1, 10))
def test_agm_sigma_monotone(e1, e2, d1, d2, s):
    lo_e, hi_e = sorted((e1, e2))
    lo_d, hi_d = sorted((math.exp(d1), math.exp(d2)))
    assert ag.agm_sigma(hi_e, lo_d, s) <= ag.agm_sigma(lo_e, lo_d, s) * (1 + 1e-12)
    assert ag.agm_sigma(lo_e, hi_d, s) <= ag.agm_sigma(lo_e, lo_d, s) * (1 + 1e-12)
    assert ag.agm_sigma(lo_e, lo_d, s) == pytest.approx(s * ag.agm_sigma(lo_e, lo_d), rel=1e-9)


def test_amgm_degenerates_to_agm():
    """d = 1 (1 x 1 covariances) and scaled identities: aMGM is aGM (paper §4.2.2)."""
    for eps in (0.5, 1, 8):
        agm = ag.agm_sigma(eps, 1e-5, 2.0)
        assert ag.amgm_scale(np.eye(1), np.eye(1), eps, 1e-5, 2.0) == pytest.approx(agm, rel=1e-12)
        assert ag.amgm_sigma(eps, 1e-5, 2.0) == pytest.approx(agm, rel=1e-12)
        # Sigma = a I, Psi = b I: the product of the smallest singular values is sqrt(a b)
        scale = ag.amgm_scale(4 * np.eye(5), 0.25 * np.eye(3), eps, 1e-5, 2.0)
        assert scale * math.sqrt(4 * 0.25) == pytest.approx(agm, rel=1e-12)
        assert ag.amgm_epsilon(np.eye(1) * agm**2, np.eye(1), 1e-5, 2.0) == pytest.approx(eps, rel=1e-7)


def _random_spd(rng, n):
    a = rng.standard_normal((n, n))
    return a @ a.T + 0.1 * np.eye(n)


def test_amgm_theorem6_general_covariances_is_tight():
    """Theorem 6 with general Sigma, Psi: the worst-case difference (rank 1, along the bottom eigenvectors)
    hits delta exactly; any other difference of the same norm leaks less (Lemma 4/5 and Eq. 5)."""
    rng = np.random.default_rng(0)
    eps, delta, sens = 2.0, 1e-5, 1.5
    for n, d in [(3, 4), (5, 2), (1, 6)]:
        row, col = _random_spd(rng, n), _random_spd(rng, d)
        scale = ag.amgm_scale(row, col, eps, delta, sens)
        row_inv, col_inv = np.linalg.inv(scale**2 * row), np.linalg.inv(col)

        def ratio(diff, row_inv=row_inv, col_inv=col_inv):  # ||U^-1 Delta V^-T||_F, Sigma = UU^T, Psi = VV^T
            return math.sqrt(np.trace(col_inv @ diff.T @ row_inv @ diff))

        u, v = np.linalg.eigh(row)[1][:, 0], np.linalg.eigh(col)[1][:, 0]
        worst = sens * np.outer(u, v)
        assert ag.gaussian_delta(eps, ratio(worst)) == pytest.approx(delta, rel=1e-6)
        for _ in range(20):
            other = rng.standard_normal((n, d))
            other *= sens / np.linalg.norm(other)
            assert ag.gaussian_delta(eps, ratio(other)) <= delta * (1 + 1e-9)
        assert ag.amgm_is_private(scale**2 * row, col, eps, delta, sens)
        assert not ag.amgm_is_private(0.98 * scale**2 * row, col, eps, delta, sens)
        assert ag.amgm_epsilon(scale**2 * row, col, delta, sens) == pytest.approx(eps, rel=1e-7)


def test_amgm_releases_compose_exactly():
    """k releases at sqrt(k) S / B compose to (epsilon, delta): checked with dp-accounting's PLD."""
    eps, delta, k = 8.0, 1e-5, 3
    sigma = ag.amgm_sigma(eps, delta, sensitivity=2.0, releases=k)
    assert sigma == pytest.approx(2.079, abs=1e-3)  # paper example
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma / 2.0), k)
    assert pld_accountant().compose(event).get_epsilon(delta) == pytest.approx(eps, rel=1e-2)


@pytest.mark.parametrize("call", [
    lambda: ag.agm_sigma(0, 1e-5), lambda: ag.agm_sigma(-1, 1e-5), lambda: ag.agm_sigma(1, 0),
    lambda: ag.agm_sigma(1, 1), lambda: ag.agm_sigma(1, 1e-5, sensitivity=0),
    lambda: ag.agm_epsilon(0, 1e-5), lambda: ag.agm_epsilon(1, 1.5), lambda: ag.agm_sigma(math.nan, 1e-5),
    lambda: ag.amgm_scale(np.array([[1.0, 2.0], [2.0, 1.0]]), np.eye(2), 1, 1e-5),
    lambda: ag.amgm_scale(np.array([[1.0, 0.5], [0.0, 1.0]]), np.eye(2), 1, 1e-5),
    lambda: ag.amgm_sigma(1, 1e-5, releases=0),
])
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()
