"""The classic moments accountant (Abadi et al. 2016) against published numbers, and its place above the improved
RDP conversion and the PLD (arXiv 1911.11607)."""

import pytest

from mechanisms.accounting import epsilon, moments_accountant
from tests.events import poisson_event

Q = 256 / 60000


@pytest.mark.parametrize("sigma, epochs, published", [
    (1.1, 60, 3.01), (0.7, 45, 7.10), (1.3, 15, 1.19),  # TF-Privacy MNIST tutorial README
    (1.3, 20, 1.35), (0.7, 70, 8.68),  # GDP paper Figure 4, MA side
])
def test_moments_accountant_reproduces_published_numbers(sigma, epochs, published):
    steps = round(epochs * 60000 / 256)
    assert moments_accountant.epsilon_classic(sigma, Q, steps, 1e-5) == pytest.approx(published, abs=6e-3)


@pytest.mark.parametrize("sigma, q, steps", [(1.1, Q, 14063), (0.8, 0.0152, 198), (3.0, 0.08192, 2500)])
def test_classic_conversion_is_looser_than_improved_rdp_and_pld(sigma, q, steps):
    classic = moments_accountant.epsilon_classic(sigma, q, steps, 1e-5)
    improved = epsilon(poisson_event(sigma, q, steps), 1e-5, "rdp")
    tight = epsilon(poisson_event(sigma, q, steps), 1e-5, "pld")
    assert classic > improved > tight


def test_bad_input():
    with pytest.raises(ValueError):
        moments_accountant.epsilon_classic(0, Q, 10, 1e-5)
