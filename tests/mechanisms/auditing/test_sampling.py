"""How the audit samples a step's scores: the support path (only the coordinates a case touches) gives the same
scores as whole rows, and a path that cannot hold for a case is refused."""

import numpy as np
import pytest
from scipy.stats import ks_2samp

import mechanisms
from mechanisms.auditing import AuditCase
from mechanisms.auditing.cases import dirac_case
from mechanisms.auditing.sampling import choose_path, sample_scores

DPSGD = mechanisms.get("dpsgd")


def test_support_path_has_the_same_scores_as_whole_rows():
    case = dirac_case(512, 1.0, np.random.default_rng(3))
    full = sample_scores(DPSGD, case, sigma=0.7, clip=1.0, samples=6_000, seed=1, path="full")
    support = sample_scores(DPSGD, case, sigma=0.7, clip=1.0, samples=6_000, seed=2, path="support")
    for a, b in ((full.held_in, support.held_in), (full.held_out, support.held_out)):
        assert ks_2samp(a, b).pvalue > 1e-3
    assert np.mean(full.held_in) == pytest.approx(1.0, abs=0.05)
    assert np.std(full.held_out) == pytest.approx(0.7, rel=0.05)


def test_paths_are_validated():
    custom = AuditCase("max", np.ones(4), np.zeros(4), statistic=lambda rows: rows.max(axis=1))
    assert choose_path(custom, coordinatewise=True) == "full"
    with pytest.raises(ValueError, match="support path"):
        choose_path(custom, coordinatewise=True, path="support")
