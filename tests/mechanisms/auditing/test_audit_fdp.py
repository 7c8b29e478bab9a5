"""f-DP one-run estimator (Mahloujifar, Melis & Chaudhuri 2024): known answers, null scores, soundness."""

import numpy as np
import pytest
from scipy.special import expit
from scipy.stats import norm

from mechanisms.auditing import CanaryScoreAuditor, Split
from mechanisms.auditing.one_run import epsilon_one_run_fdp, fdp_objective


def quantile_normal(mu: float, n: int) -> np.ndarray:
    """jax_privacy's `_deterministic_normal`: n scores at the mid-quantiles of N(mu, 1)."""
    return norm.ppf(np.linspace(0, 1, n, endpoint=False) + 1 / (2 * n)) + mu


@pytest.mark.parametrize(("shift", "steinke", "fdp"), [(0, 0.0, 0.0), (1, 1.13346, 2.164749),
                                                       (2, 2.311945, 4.7218075), (4, 4.395568, 9.133752)])
def test_matches_jax_privacy_known_answers(shift, steinke, fdp):
    """jax_privacy tests/auditing_test.py `test_epsilon_one_run_close`: 10,000 + 10,000, 0.05, 1e-6."""
    auditor = CanaryScoreAuditor(quantile_normal(shift, 10_000), quantile_normal(0, 10_000))
    assert auditor.epsilon_one_run(0.05, 1e-6) == pytest.approx(steinke, rel=1e-5, abs=1e-9)
    assert auditor.epsilon_one_run_fdp(0.05, 1e-6) == pytest.approx(fdp, rel=1e-5, abs=1e-9)


def test_approx_dp_family_sits_between_steinke_and_the_gaussian_family():
    auditor = CanaryScoreAuditor(quantile_normal(1, 10_000), quantile_normal(0, 10_000))
    approx = auditor.epsilon_one_run_fdp(0.05, 1e-6, family="approx-dp")
    assert 1.13346 < approx < 2.164749


@pytest.mark.parametrize("family", ["gdp", "approx-dp"])
@pytest.mark.parametrize("seed", range(5))
def test_null_scores_give_zero(family, seed):
    """In and out canaries from one distribution: nothing to find (the bug jax_privacy fixed in epsilon_from_gdp)."""
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal(4000)
    included = rng.random(4000) < 0.5
    auditor = CanaryScoreAuditor(scores[included], scores[~included])
    assert auditor.epsilon_one_run_fdp(0.05, 1e-5, family=family) == 0.0
    assert auditor.epsilon_one_run(0.05, 1e-5) == 0.0
    same = CanaryScoreAuditor(quantile_normal(0, 5000), quantile_normal(0, 5000))
    assert same.epsilon_one_run_fdp(0.05, 1e-5, family=family) == 0.0


def test_objective_is_monotone_in_epsilon_and_rejects_only_strong_evidence():
    m, r, v = 20_000, 1000, 900
    values = [fdp_objective(m, r, v, e, 1e-5, 0.05, "approx-dp") for e in (0.0, 0.5, 1.0, 2.0, 4.0)]
    assert np.all(np.diff(values) <= 0)
    assert epsilon_one_run_fdp(m, r, r // 2, 0.05, 1e-5, family="approx-dp") == 0.0  # coin-flip accuracy
    assert epsilon_one_run_fdp(m, r, v, 0.05, 1e-5, family="approx-dp") > 1.0


def _randomized_response(eps: float, m: int, rng: np.random.Generator) -> CanaryScoreAuditor:
    """Each canary's membership reported truthfully w.p. e^eps / (1 + e^eps): exactly eps-DP, the worst
    case of the f_{eps, delta} family (its trade-off curve IS f_{eps, 0})."""
    included = rng.random(m) < 0.5
    truthful = rng.random(m) < expit(eps)
    scores = np.where(truthful, included, ~included).astype(float) + 1e-9 * rng.random(m)
    return CanaryScoreAuditor(scores[included], scores[~included])


def test_approx_dp_family_is_sound_on_its_worst_case_and_the_gaussian_family_is_not():
    """Why `epsilon_audited` uses the approx-dp family: on a pure eps-DP mechanism the G_mu family
    claims more than eps almost always (it rejects a Gaussian curve, not the (eps, delta) claim)."""
    rng = np.random.default_rng(3)
    eps, delta = 2.0, 1e-6
    approx, gdp = [], []
    for _ in range(100):
        auditor = _randomized_response(eps, 1000, rng)
        approx.append(auditor.epsilon_one_run_fdp(0.05, delta, family="approx-dp"))
        gdp.append(auditor.epsilon_one_run_fdp(0.05, delta))
    assert np.sum(np.array(approx) <= eps) >= 95
    assert np.median(approx) > 0.6 * eps  # and not vacuous
    assert np.sum(np.array(gdp) > eps) > 50


def test_split_strategy_and_invalid_arguments():
    auditor = CanaryScoreAuditor(quantile_normal(2, 4000), quantile_normal(0, 4000))
    split = auditor.epsilon_one_run_fdp(0.05, 1e-6, family="approx-dp", threshold_strategy=Split(seed=0))
    assert 0 < split < auditor.epsilon_one_run_fdp(0.05, 1e-6)
    for kwargs, match in [({"significance": 0.0}, "significance"), ({"delta": 0.0}, "delta"),
                          ({"one_sided": False}, "one_sided"), ({"family": "rdp"}, "family")]:
        args = {"significance": 0.05, "delta": 1e-6} | kwargs
        with pytest.raises(ValueError, match=match):
            auditor.epsilon_one_run_fdp(**args)
