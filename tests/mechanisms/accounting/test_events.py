"""`DpsgdRun`, the event the claimed accountants read, is a view: `DpsgdSetting.run` is the one place it is made,
and its numbers are those of the setting (and so of the spec) it comes from."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from mechanisms.accounting.compare import DpsgdSetting
from mechanisms.accounting.events import DpsgdRun
from mechanisms.catalog import dpsgd_shuffle_rdp
from mechanisms.parts.plan import PrivacySpec
from mechanisms.parts.releases import DatasetStatistic

ROOT = Path(__file__).resolve().parents[3]
STATISTIC = DatasetStatistic("moments", (0.3, 0.15), 8.0)


@pytest.mark.parametrize("sampler, kind", [("poisson", "poisson"), ("shuffle", "uniform"), ("fixed", "uniform")])
def test_the_run_of_a_setting_carries_its_numbers(sampler, kind):
    setting = DpsgdSetting.of(sampler, 6_000, 256, 3, 1e-5, dim=1e4, batch_clip_ratio=0.5, delta_split=0.25)
    run = setting.run(1.7)
    assert isinstance(run, DpsgdRun)
    assert (run.noise_multiplier, run.sampling_probability, run.steps, run.sampler) == (
        1.7, setting.sample_rate, setting.steps, kind)
    assert (run.dim, run.batch_clip_ratio, run.batch_size, run.delta_split, run.once) == (1e4, 0.5, 256, 0.25, ())


def test_the_claimed_run_of_shuffle_rdp_is_the_poisson_view_of_its_spec():
    """Their analysis reads Poisson sampling at q = B / N over the executed steps, each statistic row its own
    Gaussian: the run of the spec with the sampler they claim."""
    spec = PrivacySpec(epsilon=3.0, delta=1e-5, dataset_size=6_000, batch_size=512, epochs=4, sampler="shuffle",
                       dataset_statistics=(STATISTIC,))
    run = dpsgd_shuffle_rdp.claimed_run(2.0, spec)
    claimed = dataclasses.replace(spec, sampler="poisson").batch_selection
    assert run == DpsgdRun(noise_multiplier=2.0, sampling_probability=claimed.sample_rate, steps=claimed.steps,
                           sampler="poisson", once=STATISTIC.row_multipliers())
    assert run.steps == spec.steps  # shuffled and Poisson batches give the same number of steps


def test_only_the_setting_makes_a_dpsgd_run():
    """A `DpsgdRun(` call anywhere else in the library would be a second shape of the setting."""
    found = [str(path.relative_to(ROOT)) for package in ("mechanisms", "orchestrator", "workers", "storage",
                                                         "dashboards", "privbench")
             for path in (ROOT / package).rglob("*.py") if re.search(r"(?<!class )\bDpsgdRun\(", path.read_text())]
    assert sorted(found) == ["mechanisms/accounting/compare.py"]
