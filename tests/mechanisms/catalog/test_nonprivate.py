"""mechanisms/catalog/nonprivate.py: the reference run plans nothing private (no parts, no noise, no epsilon) and
its audit release is the clipped sum itself."""

from __future__ import annotations

import numpy as np

from mechanisms.catalog.nonprivate import mechanism
from mechanisms.parts.plan import PrivacySpec


def test_the_reference_run_has_no_parts_noise_or_epsilon():
    plan = mechanism.plan(PrivacySpec(epsilon=None, delta=1e-5, dataset_size=1000, batch_size=100, epochs=2))
    assert not mechanism.private
    assert plan.parts is None and plan.sigma is None
    assert plan.epsilon_claimed is None and plan.epsilon_certified is None


def test_the_audit_release_is_the_clipped_sum_unchanged():
    sums = np.array([[0.25, -1.5], [3.0, 0.0]], dtype=np.float32)
    released = mechanism.privatize_step(sums, sigma=1.0, clip=1.0, rng=np.random.default_rng(0))
    assert released.dtype == np.float64 and np.array_equal(released, sums)
