"""The audit's neighbouring pairs (`AuditCase`): a pair that does not differ, or whose halves differ in shape, is
refused where it is made; Nasr et al.'s Dirac canary is one spike of the clipping bound (one per tensor under
per-layer clipping), which the default statistic reads exactly."""

import numpy as np
import pytest

from mechanisms.auditing import AuditCase
from mechanisms.auditing.cases import dirac_case


def test_cases_are_validated():
    with pytest.raises(ValueError, match="non-zero"):
        AuditCase("zero", np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        AuditCase("bad", np.ones(3), np.zeros(4))


def test_dirac_canary_is_one_clipped_spike_and_per_layer_one_per_tensor():
    case = dirac_case(50, 2.0, np.random.default_rng(0))
    assert np.count_nonzero(case.canary) == 1 and np.linalg.norm(case.canary) == 2.0
    assert case.score(case.base[None, :] + case.canary)[0] == pytest.approx(2.0)  # side B: the canary's norm
    assert case.score(case.base[None, :])[0] == pytest.approx(0.0, abs=1e-12)  # side A: 0
    blocks = dirac_case(7, 1.0, np.random.default_rng(1), block_bounds=((3, 0.6), (4, 0.8)))
    assert [np.abs(blocks.canary[:3]).max(), np.abs(blocks.canary[3:]).max()] == [0.6, 0.8]
    assert np.count_nonzero(blocks.canary) == 2 and np.linalg.norm(blocks.canary) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="cover"):
        dirac_case(8, 1.0, np.random.default_rng(2), block_bounds=((3, 0.6), (4, 0.8)))
