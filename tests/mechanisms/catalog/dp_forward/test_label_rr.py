"""mechanisms/catalog/dp_forward/label_rr.py: DP-Forward's label privacy. k-ary randomized response keeps a
label with probability e^eps / (e^eps + k - 1), and its shuffled (amplified) delta equals a brute-force enumeration
of every output sequence, giving the paper's "RR costs only 0.03" on SST-2."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from mechanisms.catalog.dp_forward import label_rr
from tests.mechanisms.catalog.dp_forward.dp_forward_setting import DELTA, LN9


def test_label_rr_costs_the_papers_point_03_on_sst2():
    """Table 5's 'RR costs only 0.03' (SST-2, keep 0.9) is RR on a size-one subsample, q = 1/N, N releases."""
    assert 0.025 < label_rr.shuffled_rr_epsilon(LN9, 2, 67_349, DELTA) < 0.032
    assert label_rr.shuffled_rr_epsilon(LN9, 2, 1, DELTA) == pytest.approx(LN9)


@pytest.mark.parametrize(("classes", "n", "eps"), [(2, 4, 0.3), (3, 5, 0.8), (4, 3, 0.1)])
def test_shuffled_rr_delta_matches_brute_force(classes, n, eps):
    """The binomial sums equal a full enumeration of every output sequence (both directions)."""
    q = 1 / n
    keep = 1 / (1 + (classes - 1) * math.exp(-1.5))
    a, b = keep, (1 - keep) / (classes - 1)
    mix = np.array([(1 - q) * b + q * a, (1 - q) * a + q * b] + [b] * (classes - 2))
    plain = np.array([b, a] + [b] * (classes - 2))
    worst = 0.0
    for up, lo in ((mix, plain), (plain, mix)):
        total = 0.0
        for seq in itertools.product(range(classes), repeat=n):
            pu, pl = np.prod(up[list(seq)]), np.prod(lo[list(seq)])
            total += max(0.0, pu - math.exp(eps) * pl)
        worst = max(worst, total)
    assert label_rr.shuffled_rr_delta(eps, 1.5, classes, n) == pytest.approx(worst, rel=1e-9, abs=1e-14)


def test_randomized_response_is_k_ary_rr():
    rng = np.random.default_rng(0)
    labels = np.zeros(300_000, dtype=np.int64)
    out = label_rr.randomized_response(labels, 1.0, 4, rng)
    keep = math.e / (math.e + 3)
    assert (out == 0).mean() == pytest.approx(keep, abs=0.003)
    for other in (1, 2, 3):
        assert (out == other).mean() == pytest.approx((1 - keep) / 3, abs=0.003)
