"""`DpsgdSetting` is a view of the one privacy setting (`PrivacySpec`): built from a spec, it reads the spec's
sampler, delta and dataset statistics, and its certified epsilon is the trial plan's for the same spec."""

from __future__ import annotations

import dataclasses

import pytest

import mechanisms
from mechanisms.accounting.compare import DpsgdSetting, epsilon_of, sigma_for
from mechanisms.framework.integrity.verdict import plan_for
from mechanisms.parts.plan import PrivacySpec
from mechanisms.parts.releases import DatasetStatistic

STATISTIC = DatasetStatistic("moments", (0.3, 0.15), 8.0)


def spec(**changes) -> PrivacySpec:
    base = {"epsilon": None, "sigma": 1.3, "delta": 1e-5, "dataset_size": 6_000, "batch_size": 256, "epochs": 3}
    return PrivacySpec(**(base | changes))


@pytest.mark.parametrize("changes", [{}, {"sampler": "shuffle"}, {"sampler": "fixed", "delta": 1e-6},
                                     {"dataset_statistics": (STATISTIC,)}],
                         ids=["poisson", "shuffle", "fixed", "statistics"])
def test_the_setting_of_a_spec_is_a_view_of_it(changes):
    source = spec(**changes)
    setting = DpsgdSetting.of_spec(source)
    assert setting.selection == source.batch_selection and setting.delta == source.delta
    assert setting.statistics == source.dataset_statistics
    assert (setting.sample_rate, setting.steps, setting.sampler) == (source.sample_rate, source.steps, source.sampler)
    # its certified event and epsilon are the trial plan's (DP-SGD's parts at the spec's clip): one setting, one event
    plan = plan_for(mechanisms.get("dpsgd"), source)
    assert setting.parts().dp_event(plan.sigma) == plan.effective_event
    assert epsilon_of(setting, plan.sigma, "pld").epsilon == plan.epsilon_certified


def test_a_trial_geometry_is_checked_by_the_spec_it_is_built_from():
    """`DpsgdSetting.of` makes the spec, so bad geometry fails with the spec's own message."""
    built = DpsgdSetting.of("shuffle", 6_000, 256, 3, 1e-5, dim=100.0)
    assert built == DpsgdSetting.of_spec(spec(sampler="shuffle", sigma=None), batch_size=256, dim=100.0)
    for bad in ((6_000, 8_000, 3, 1e-5), (6_000, 256, 0, 1e-5), (6_000, 256, 3, 1.0)):
        with pytest.raises(ValueError) as from_spec:
            PrivacySpec(epsilon=None, dataset_size=bad[0], batch_size=bad[1], epochs=bad[2], delta=bad[3])
        with pytest.raises(ValueError) as from_cli:
            DpsgdSetting.of("poisson", *bad)
        assert str(from_cli.value) == str(from_spec.value)


def test_sigma_for_a_target_meets_it_on_the_spec_the_setting_views():
    source = spec(sigma=None, epsilon=2.0)
    setting = DpsgdSetting.of_spec(source)
    sigma = sigma_for(setting, 2.0).sigma
    plan = plan_for(mechanisms.get("dpsgd"), dataclasses.replace(source, epsilon=None, sigma=sigma))
    assert plan.epsilon_certified <= 2.0
