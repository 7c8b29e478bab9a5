"""The noise checks on excluded canaries' residuals: calibrated on correct noise, and what they catch."""

import numpy as np
import pytest

from mechanisms.auditing import noise_checks as nc

T, N, SIGMA = 200, 300, 1.3  # steps, excluded canaries, declared noise multiplier


def residuals(seed: int, sigma: float = SIGMA) -> np.ndarray:
    return sigma * np.random.default_rng(seed).standard_normal((T, N))


def test_correct_gaussian_noise_raises_no_alarm_over_200_seeds():
    alarms = [seed for seed in range(200) if nc.check_noise(nc.summarize(residuals(seed)), SIGMA).violated]
    assert alarms == []


def test_the_standard_scores_of_correct_noise_are_standard():
    z = {}
    for seed in range(60):
        for f in nc.check_noise(nc.summarize(residuals(1000 + seed)), SIGMA).findings:
            z.setdefault(f.check, []).append(f.z)
    for check, values in z.items():
        if check != "step scale":  # the minimum over steps: not centred by design
            assert abs(np.mean(values)) < 0.5 and 0.7 < np.std(values) < 1.3, (check, np.mean(values), np.std(values))


def test_reused_noise_is_flagged_as_repeating():
    y = np.repeat(residuals(1)[:1], T, axis=0)  # the same noise vector every step
    report = nc.check_noise(nc.summarize(y), SIGMA)
    assert report.violated and "noise repeats across steps" in report.labels()
    assert any("repeats" in words for words in report.reasons())


def test_half_scale_noise_is_flagged_as_below_declared():
    report = nc.check_noise(nc.summarize(residuals(2, SIGMA / 2)), SIGMA)
    assert report.violated and report.labels()[0] == "noise below declared"
    assert "0.50 of it" in report.reasons()[0]


def test_a_single_quiet_step_is_flagged():
    y = residuals(3)
    y[57] /= 3
    report = nc.check_noise(nc.summarize(y), SIGMA)
    assert [f.check for f in report.failed] == ["step scale"] and "step 58" in report.reasons()[0]


def test_more_noise_than_declared_is_no_finding():
    assert not nc.check_noise(nc.summarize(residuals(4, 2 * SIGMA)), SIGMA).violated


def test_tree_noise_is_flagged_undeclared_and_accepted_when_declared():
    y = nc.tree_noise(T, N, SIGMA, np.random.default_rng(5))
    undeclared = nc.check_noise(nc.summarize(y), SIGMA)
    assert undeclared.violated and "noise correlated across steps" in undeclared.labels()
    assert "declares noise independent" in undeclared.reasons()[0]
    tree = nc.Covariance(nc.tree_covariance(T), "tree aggregation")
    assert not nc.check_noise(nc.summarize(y, tree), SIGMA).violated
    alarms = sum(nc.check_noise(nc.summarize(nc.tree_noise(T, N, SIGMA, np.random.default_rng(s)), tree),
                                SIGMA).violated for s in range(10))
    assert alarms == 0


def test_a_canary_mean_moves_no_independence_check():
    """Included canaries sharing an excluded one's coordinate push it by a constant mean q s: the lag and
    partial-sum checks read differences and centred sums, so they stay quiet."""
    rng = np.random.default_rng(6)
    pushes = rng.choice([-1.0, 1.0], size=N) * (rng.random((T, N)) < 0.2)  # i.i.d. across steps
    report = nc.check_noise(nc.summarize(residuals(7) + pushes), SIGMA)
    assert not report.violated, report.reasons()


def test_too_few_residuals_skip_with_a_reason_and_the_summary_round_trips():
    report = nc.check_noise(nc.summarize(residuals(8)[:3, :10]), SIGMA)
    assert not report.findings and "fewer than 1,000" in report.skipped
    summary = nc.summarize(residuals(9))
    again = nc.NoiseSummary.from_dict(summary.to_dict())
    assert again.to_dict() == summary.to_dict()
    zs = [[f.z for f in nc.check_noise(s, SIGMA).findings] for s in (again, summary)]
    assert zs[0] == zs[1]


def test_the_series_keeper_caps_what_it_holds():
    keeper = nc.SeriesKeeper(np.arange(5000), steps=nc.MAX_VALUES // 100)
    assert keeper.columns.size == 100
    keeper.add(np.ones((3, 6000)))
    assert keeper.rows[0].shape == (3, 100)


@pytest.mark.parametrize("steps", [7, 64])
def test_tree_covariance_matches_simulated_tree_noise(steps):
    """The declared covariance whitens the simulated noise to the identity (the checks' premise)."""
    sims = nc.tree_noise(steps, 10_000, 1.0, np.random.default_rng(steps))
    white = nc.Covariance(nc.tree_covariance(steps)).whiten(sims)
    assert np.cov(white) == pytest.approx(np.eye(steps), abs=0.07)
    assert not np.allclose(np.cov(sims), np.eye(steps), atol=0.3)  # the raw noise is not white


def simulated_sums(seed: int, push: float, m: int = 2000, steps: int = 300, q: float = 0.05,
                   sigma: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """Summed residuals of m canaries (half included) over a run whose step pushes a joining canary by `push`."""
    rng = np.random.default_rng(seed)
    included = np.arange(m) % 2 == 0
    joins = rng.binomial(steps, q, size=m) * included
    return push * joins + sigma * np.sqrt(steps) * rng.standard_normal(m), included


def test_the_push_check_raises_no_alarm_on_a_correct_step_over_200_seeds():
    checks = [nc.push_check(*simulated_sums(seed, 1.0), 0.05, 300) for seed in range(200)]
    assert sum(c.failed for c in checks) == 0
    assert np.mean([c.push for c in checks]) == pytest.approx(1.0, abs=0.05)
    assert np.std([c.z for c in checks]) == pytest.approx(1.0, abs=0.2)


def test_the_push_check_flags_a_canary_pushed_at_twice_the_bound():
    check = nc.push_check(*simulated_sums(0, 2.0), 0.05, 300)
    assert check.failed and check.push == pytest.approx(2.0, abs=0.3) and "2" in check.words
    assert nc.push_check(*simulated_sums(0, 0.5), 0.05, 300).failed is False  # less weight is not a leak
    assert nc.push_check(np.zeros(4), np.zeros(4, dtype=bool), 0.05, 300) is None


def shared_layout_residuals(seed: int, n: int = 300, m: int = 1800, steps: int = 100, q: float = 0.1,
                            sigma: float = SIGMA) -> tuple[np.ndarray, np.ndarray]:
    """What m canaries sharing n coordinates observe in a correct run (white_box's layout, pushes of 1), and one
    excluded canary per coordinate (as DiracCanaries.noise_columns takes them)."""
    from mechanisms.auditing.white_box import CanaryLayout

    rng = np.random.default_rng(seed)
    layout = CanaryLayout.draw(n, m, rng)
    included = rng.random(m) < 0.5
    joins = included & (rng.random((steps, m)) < q)
    flat = (np.arange(steps)[:, None] * n + layout.coordinates[None, :]).ravel()
    pushed = np.bincount(flat, weights=(joins * layout.signs).ravel(), minlength=steps * n).reshape(steps, n)
    observed = (pushed + sigma * rng.standard_normal((steps, n)))[:, layout.coordinates] * layout.signs
    excluded = np.flatnonzero(~included)
    _, first = np.unique(layout.coordinates[excluded], return_index=True)
    return observed, excluded[np.sort(first)]


def test_shared_coordinates_are_read_once_and_raise_no_alarm():
    alarms = [s for s in range(100) if nc.check_noise(nc.summarize(np.take(*shared_layout_residuals(s), axis=1)),
                                                       SIGMA).violated]
    assert alarms == []
    lag1 = {"once": [], "every": []}  # every excluded canary: one draw counted ~3 times, z spread ~sqrt(3)
    for seed in range(30):
        observed, once = shared_layout_residuals(100 + seed)
        for name, cols in (("once", once), ("every", excluded_of(100 + seed))):
            lag1[name] += [f.z for f in nc.check_noise(nc.summarize(observed[:, cols]), SIGMA).findings
                           if f.check == "lag 1"]
    assert np.std(lag1["once"]) < 1.3 < np.std(lag1["every"])


def excluded_of(seed: int, m: int = 1800) -> np.ndarray:
    """The excluded canaries of `shared_layout_residuals(seed)` (the same draws, in the same order)."""
    from mechanisms.auditing.white_box import CanaryLayout

    rng = np.random.default_rng(seed)
    CanaryLayout.draw(300, m, rng)
    return np.flatnonzero(~(rng.random(m) < 0.5))
