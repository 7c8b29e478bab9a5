"""Epsilon from a sound accountant named by the user: non-private and unsupported events, an accountant that
cannot answer says None (never a guess), and bad delta or names are refused."""

import math

import dp_accounting
import pytest

from mechanisms.accounting import epsilon
from tests.events import MNIST, poisson_event


def test_unsupported_nonprivate_and_bad_input():
    assert epsilon(dp_accounting.NonPrivateDpEvent(), 1e-5) == math.inf
    assert epsilon(dp_accounting.UnsupportedDpEvent(), 1e-5) is None
    laplace = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.LaplaceDpEvent(1.0))
    assert epsilon(laplace, 1e-5, "prv") is None  # PRV adapter says unsupported, never guesses
    assert epsilon(laplace, 1e-5, "pld") is not None
    for delta in (0, 1, -1e-5, 2):
        with pytest.raises(ValueError, match="delta"):
            epsilon(poisson_event(*MNIST), delta)
    with pytest.raises(ValueError, match="unknown accountant"):
        epsilon(poisson_event(*MNIST), 1e-5, "gdp")
