"""Clopper-Pearson bounds: exact coverage, edges."""

import numpy as np
import pytest

from mechanisms.auditing.binomial import clopper_pearson_lower, clopper_pearson_upper


@pytest.mark.parametrize("n", [20, 200, 2000])
@pytest.mark.parametrize("frac", [0.0, 0.05, 0.5, 0.9])
def test_upper_bound_is_where_observing_k_or_fewer_has_probability_significance(n, frac):
    k = int(frac * n)
    p = float(clopper_pearson_upper(k, n, 0.05))
    from scipy.stats import binom

    assert binom.cdf(k, n, p) == pytest.approx(0.05, rel=1e-6)


def test_coverage_by_simulation():
    """The 95% upper bound is above the true rate in at least 95% of experiments."""
    rng = np.random.default_rng(0)
    for p_true in (0.001, 0.05, 0.3):
        k = rng.binomial(500, p_true, size=20_000)
        covered = np.mean(clopper_pearson_upper(k, 500, 0.05) >= p_true)
        assert covered >= 0.95


def test_edges_and_lower_bound():
    assert clopper_pearson_upper(10, 10, 0.05) == 1.0
    assert clopper_pearson_upper(0, 10_000, 0.05) == pytest.approx(1 - 0.05 ** (1 / 10_000))
    assert clopper_pearson_lower(0, 100, 0.05) == 0.0
    lo, hi = clopper_pearson_lower(30, 100, 0.025), clopper_pearson_upper(30, 100, 0.025)
    assert lo < 0.3 < hi
    with pytest.raises(ValueError):
        clopper_pearson_upper(11, 10, 0.05)
    with pytest.raises(ValueError):
        clopper_pearson_upper(1, 10, 0.0)
