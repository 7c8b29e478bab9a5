"""mechanisms/catalog/dp_bandmf.py: `dp-bandmf`'s certificate and claim against the banded square root computed
by scipy and the sensitivity brute-forced over one example's participations, the overclaim when bands overlap,
the first release, and `dp-bandmf-4`."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
import scipy.linalg
import torch

import mechanisms
from mechanisms.framework.claims import claim_status
from mechanisms.parts.plan import PrivacySpec
from tests.mechanisms.catalog.fixed_order_setting import DELTA, EPOCHS, P, spec


def pld_epsilon(noise_multiplier: float) -> float:
    """dp-accounting's own PLD of one Gaussian at sensitivity 1 (the reference, not privbench's accounting)."""
    return dp_accounting.pld.PLDAccountant().compose(dp_accounting.GaussianDpEvent(noise_multiplier)).get_epsilon(DELTA)


def banded_sensitivity(bands: int) -> float:
    """Replace-one L2 sensitivity per unit clip of the b-banded square root of the prefix-sum matrix, by brute
    force: the coefficients are the first column of scipy's `sqrtm` of the b x b all-ones lower triangle; one
    example's columns (offset i, i + P, ...) are summed (aligned gradients are the worst case when C^T C >= 0),
    the largest norm over the P offsets, x2 for replace-one."""
    coefficients = np.real(scipy.linalg.sqrtm(np.tril(np.ones((bands, bands))))[:, 0])
    steps = EPOCHS * P
    strategy = sum(np.diag(np.full(steps - k, c), -k) for k, c in enumerate(coefficients))
    return 2 * max(np.linalg.norm(strategy[:, offset::P].sum(1)) for offset in range(P))


@pytest.mark.parametrize("bands", [1, 2, 3, 8])
def test_bandmf_certificate_equals_the_brute_forced_sensitivity(bands):
    """b <= P: the certificate is one Gaussian at sigma / sensitivity, and the paper's claim equals it."""
    sigma = 10.0
    plan = mechanisms.get("dp-bandmf").plan(spec(sigma=sigma, bands=bands))
    sens = banded_sensitivity(bands)
    assert plan.effective_event == dp_accounting.GaussianDpEvent(pytest.approx(sigma / sens))
    assert plan.epsilon_certified == pytest.approx(pld_epsilon(sigma / sens), rel=1e-3)
    assert plan.epsilon_claimed == pytest.approx(plan.epsilon_certified, rel=1e-3)
    assert claim_status(plan.epsilon_claimed, plan.epsilon_certified, None) == "ok"


def test_bandmf_with_more_bands_than_an_epoch_is_overclaimed():
    """b > P: the columns of one example's participations overlap, the certificate adds the overlap, the paper's
    sqrt(k) max-column-norm formula does not: the verdict shows it."""
    small = PrivacySpec(epsilon=None, delta=DELTA, dataset_size=100, batch_size=25, epochs=3, sigma=5.0,
                        options={"bands": 6})  # P = 4 < 6 bands
    plan = mechanisms.get("dp-bandmf").plan(small)
    assert plan.epsilon_certified > plan.epsilon_claimed * 1.01
    assert claim_status(plan.epsilon_claimed, plan.epsilon_certified, None) == "overclaimed"


def test_first_release_is_one_participation():
    """Without a stream, `release` is step 0 of a fresh one: the sums plus N(0, (s / c_0)^2), independent rows."""
    plan = mechanisms.get("dp-bandmf").plan(spec(sigma=2.0, bands=3))
    rows = torch.zeros(20000, 4, dtype=torch.float64)
    out = plan.parts.noise.release([rows], 2.0, torch.Generator().manual_seed(0))[0].numpy()
    assert np.std(out) == pytest.approx(2.0, rel=0.02)


def test_dp_bandmf_4_is_dp_bandmf_at_4_bands():
    """dp-bandmf-4: a second band count beside dp-bandmf's default 2 in one grid."""
    four = mechanisms.get("dp-bandmf-4").plan(spec(sigma=6.0))
    assert four.extra["options"] == {"bands": 4}
    assert four.epsilon_certified == pytest.approx(mechanisms.get("dp-bandmf").plan(spec(sigma=6.0, bands=4))
                                                   .epsilon_certified)
    assert four.epsilon_certified > mechanisms.get("dp-bandmf").plan(spec(sigma=6.0)).epsilon_certified
