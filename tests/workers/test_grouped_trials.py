"""Real trials through `workers.trial.run_trial` with declared privacy units and with augmentation with
multiplicity (digits, mlp, 2 epochs, batch 64, target epsilon 2, delta 1e-5, seed 0): each is `ok` at the
certified epsilon of plain DP-SGD at its geometry, and the accountant's epsilon for units is dp-accounting's
for the unit-level geometry. Grouping that cannot run as accounted fails the trial, never passes as `ok`."""

from __future__ import annotations

import dataclasses
import warnings

import dp_accounting
import numpy as np
import pytest

from workers import datasets
from workers.config import TrainConfig
from workers.datasets.contract import DATASETS, Dataset, records_are_rows, register
from workers.trial import run_trial

BASE = {"dataset": "digits", "model": "mlp", "mechanism": "dpsgd", "epsilon": 2.0, "delta": 1e-5, "seed": 0,
        "train": {"epochs": 2, "batch_size": 64}, "audit": {"mode": "off"}, "resources": {"cpus": 1, "gpus": 0}}


def digits_pairs():
    """Digits where one person owns two consecutive training rows (719 units over 1,438 rows)."""
    splits = datasets.load("digits")
    train = dataclasses.replace(splits.train, units=np.arange(len(splits.train)) // 2)
    return dataclasses.replace(splits, name="digits-pairs", train=train)


@pytest.fixture(scope="module")
def records():
    warnings.filterwarnings("ignore")
    # digits' rows as its records (the identity transform): privbench can check them on a neighbour
    register(Dataset("digits-pairs", "image", "digits, two rows per person", digits_pairs, transform=records_are_rows))
    try:
        units = run_trial(BASE | {"dataset": "digits-pairs"})
        rows = units["metrics"]["n_train"] if units["status"] == "finished" else 1438
        at_units_geometry = run_trial(BASE | {"train": BASE["train"] | {"max_train_examples": int(rows) // 2}})
        augmult = run_trial(BASE | {"train": BASE["train"] | {"augmult": 2}})
        plain = run_trial(BASE)
        ghost = run_trial(BASE | {"dataset": "digits-pairs", "train": BASE["train"] | {"grad_sample_mode": "ghost"}})
    finally:
        DATASETS.unregister("digits-pairs")
    return {"units": units, "at_units_geometry": at_units_geometry, "augmult": augmult, "plain": plain,
            "ghost": ghost}


def reference_epsilon(multiplier: float, q: float, steps: int, delta: float) -> float:
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(multiplier)), steps)
    return dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(delta)


def test_units_trial_is_ok_at_plain_dpsgds_epsilon_over_as_many_rows_as_units(records):
    units, same = records["units"], records["at_units_geometry"]
    assert units["status"] == same["status"] == "finished", units.get("traceback") or same.get("traceback")
    p, q = units["privacy"], same["privacy"]
    assert p["claim_status"] == q["claim_status"] == "ok" and p["integrity_failed"] == []
    assert p["row_grouping"] == {"privacy_unit": "declared units", "units": 719, "rows": 1438, "largest_unit": 2,
                                 "augmult": 1, "engine": "bk"}
    assert p["grad_sample_mode"] == "bk" and p["bk_fallback"] is None
    for key in ("sigma", "sample_rate", "steps", "epsilon_certified", "effective_event"):
        assert p[key] == q[key], key
    assert (p["sample_rate"], p["steps"]) == (64 / 719, 2 * round(719 / 64))
    assert units["metrics"]["steps_run"] == p["steps"]


def test_the_accountant_counts_units_as_dp_accounting_does(records):
    p = records["units"]["privacy"]
    multiplier = float(p["effective_event"].split("noise_multiplier=")[1].split(")")[0])
    truth = reference_epsilon(multiplier, 64 / 719, p["steps"], p["delta"])
    assert p["epsilon_certified"] >= truth * (1 - 1e-6)
    assert p["epsilon_certified"] == pytest.approx(truth, rel=2e-3)
    rows_truth = reference_epsilon(multiplier, 64 / 1438, p["steps"], p["delta"])
    assert rows_truth < 0.6 * truth  # accounted over rows, the same run would claim far less than it spends


def test_augmult_trial_is_ok_at_plain_dpsgds_epsilon(records):
    aug, plain = records["augmult"], records["plain"]
    assert aug["status"] == plain["status"] == "finished", aug.get("traceback")
    p, q = aug["privacy"], plain["privacy"]
    assert p["claim_status"] == q["claim_status"] == "ok" and p["integrity_failed"] == []
    assert p["row_grouping"]["augmult"] == 2 and p["row_grouping"]["privacy_unit"] == "record"
    for key in ("sigma", "sample_rate", "steps", "epsilon_certified"):
        assert p[key] == q[key], key
    assert q["row_grouping"] is None


def test_units_with_an_engine_that_clips_rows_fail_the_trial(records):
    ghost = records["ghost"]
    assert ghost["status"] == "failed" and "clip a unit's rows together" in ghost["error"]


@pytest.mark.parametrize(("train", "message"), [
    ({"augmult": 2, "grad_sample_mode": "ghost"}, "augmult 2 clips each record's copies together"),
    ({"augmult": 2, "precision": "bf16"}, "augmult 2 clips each record's copies together"),
    ({"augmult": 2, "compile": True}, "augmult 2"),
    ({"augmult": 0}, "augmult must be >= 1"),
])
def test_augmult_settings_that_cannot_run_are_refused(train, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**train)


def test_a_units_rows_are_one_contribution_to_a_released_statistic():
    """Private normalisation with declared units: the statistic's clip applies to a unit's summed rows, so
    removing a unit of three rows moves the released sum by at most the bound (per row it would be 3 bounds)."""
    import torch

    import mechanisms
    from mechanisms.parts.plan import PrivacySpec
    from mechanisms.parts.releases import DatasetStatistic
    from workers.datasets.contract import Split
    from workers.models.contract import ModelBundle, Statistic
    from workers.train import release_statistics

    release = DatasetStatistic("total", (1.0,), 1.0)  # the same seed each time: the same noise, which cancels
    received = []

    def released(split: Split) -> torch.Tensor:
        bundle = ModelBundle(torch.nn.Linear(2, 2), lambda s: (torch.from_numpy(s.inputs),),
                             statistics=(Statistic(release, lambda xs: xs[0].unsqueeze(1).double(),
                                                   lambda sums, n: received.append(sums)),))
        spec = PrivacySpec(epsilon=None, sigma=1.0, delta=1e-5, dataset_size=datasets.unit_count(split),
                           batch_size=1, epochs=1, dataset_statistics=(release,))
        release_statistics(bundle, split, mechanisms.get("dpsgd").plan(spec), torch.Generator().manual_seed(0))
        return received[-1]

    inputs = np.array([[1.0, 0.0]] * 3 + [[0.0, 0.5], [0.0, -0.5]], dtype=np.float32)
    whole = Split(inputs, np.zeros(5, dtype=np.int64), units=np.array([7, 7, 7, 1, 2]))
    without = whole.subset(np.array([3, 4]))
    moved = released(whole) - released(without)
    assert float(moved.norm()) == pytest.approx(1.0, rel=1e-6)
    per_row = released(dataclasses.replace(whole, units=None)) - released(dataclasses.replace(without, units=None))
    assert float(per_row.norm()) == pytest.approx(3.0, rel=1e-6)


def test_max_train_examples_keeps_whole_units():
    """A smoke run's (and `gpus: auto`'s one-batch probe's) subset counts units, as the batch size does."""
    from workers.datasets.contract import Split
    from workers.trial import _at_most

    units = np.array([0, 0, 1, 1, 1, 2, 3, 3, 4, 4])
    split = Split(np.arange(10, dtype=np.float32)[:, None], np.zeros(10, dtype=np.int64), units=units)
    kept = _at_most(split, 2)
    assert datasets.unit_count(kept) == 2
    for u in np.unique(kept.units):
        assert np.sum(kept.units == u) == np.sum(units == u)  # every row of a kept unit
        assert np.array_equal(kept.inputs[kept.units == u, 0], np.flatnonzero(units == u))
    assert _at_most(split, 5) is split


def test_grouped_steps_never_wait_on_the_host():
    """0 host synchronisations per step with declared units and with augmult, on the book-keeping engine, counted
    by benchmarks/step_profile.py's dispatch mode (through benchmarks/grouping_cost.py, which also times them)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    import grouping_cost

    variants = {"dpsgd (bk)": (None, 1, 1), "units of 2": (None, 2, 1), "augmult 2": (None, 1, 2)}
    result = grouping_cost.measure("mlp", 64, rounds=1, steps=2, variants=variants)
    assert {name: m["syncs_per_step"] for name, m in result.items()} == dict.fromkeys(variants, 0.0)
    assert result["units of 2"]["rows_per_step"] > 0 and result["augmult 2"]["rows_per_step"] > 0
