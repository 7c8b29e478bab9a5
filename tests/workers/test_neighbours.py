"""Neighbouring-data checks of the plan-time code (issue 47, item 1): a plan hook, a claim, a model builder or a
dataset that reads the training set is not `ok`, with a reason naming the value; the built-ins stay `ok`."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch
from torch import nn

import mechanisms
from mechanisms.catalog.dpsgd import DpSgd
from mechanisms.framework.mechanism import Claim
from mechanisms.parts.clipping import FlatClipping
from mechanisms.parts.noise_addition import GaussianNoise
from mechanisms.parts.plan import Parts
from workers import cache, datasets, models, neighbours
from workers.datasets.contract import DATASETS, Dataset, Split, Splits, neighbouring, records_are_rows, replace_record
from workers.models.contract import MODELS, Model, ModelBundle
from workers.trial import as_config, plan_phase, run_trial

SETTING = dict(sweep="t", trial_key="k", dataset="digits", model="mlp", mechanism="dpsgd", epsilon=2.0, delta=1e-5,
               seed=0, train=dict(epochs=2, batch_size=64, lr=0.5), audit={"mode": "off"})


# ---- broken plugins, as a researcher would write them from docs/plugins.md ---------------------------------
class ClipFromData(DpSgd):
    """`parts()` sets the clip to the median per-example norm of the training set (issue 47, case f)."""

    ID = "test-clip-from-data"

    def parts(self, spec, options):
        train = datasets.load("digits").train
        clipper = FlatClipping(float(np.median(np.linalg.norm(train.inputs.reshape(len(train), -1), axis=1))) / 8)
        return Parts(spec.batch_selection, clipper, GaussianNoise(clipper.bound))


class CountsInClaim(DpSgd):
    """`claim()` writes the class counts into `Claim.extra` (case g)."""

    ID = "test-counts-in-claim"

    def claim(self, sigma, spec, options, parts, certified):
        return Claim(certified, "pld", {"counts": np.bincount(datasets.load("digits").train.labels).tolist()})


class Standardise(nn.Module):
    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def standardising_mlp(splits, hidden: int = 32) -> ModelBundle:
    """The builder standardises with the training split's mean and std, stored as buffers (case c)."""
    x = torch.from_numpy(datasets.load(splits.name).train.inputs)
    module = nn.Sequential(Standardise(x.mean(0), x.std(0) + 1e-3), nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(),
                           nn.Linear(hidden, splits.num_classes))
    return ModelBundle(module, lambda split: (torch.from_numpy(split.inputs),))


def peeking_mlp(splits, hidden: int = 32) -> ModelBundle:
    """The builder reads the training rows it is handed, as every builder could before."""
    mean = torch.from_numpy(splits.train.inputs).mean(0)
    module = nn.Sequential(Standardise(mean, torch.ones_like(mean)), nn.Flatten(), nn.Linear(64, hidden))
    return ModelBundle(module, lambda split: (torch.from_numpy(split.inputs),))


def _digits_records() -> Splits:
    return datasets.get_loader("digits")[0](**{})


def standardised_digits() -> Splits:
    """An opaque loader: pixels standardised with the training split's mean and std (case e)."""
    rows = datasets.load("digits")
    mean, std = rows.train.inputs.mean(0), rows.train.inputs.std(0) + 1e-6
    scale = lambda s: dataclasses.replace(s, inputs=((s.inputs - mean) / std).astype(np.float32))  # noqa: E731
    return dataclasses.replace(rows, train=scale(rows.train), val=scale(rows.val), test=scale(rows.test))


def batch_standardised(records: np.ndarray) -> np.ndarray:
    """A 'per-record' transform that standardises with the statistics of the records it is given."""
    x = records[:, None].astype(np.float32)
    return (x - x.mean(0)) / (x.std(0) + 1e-6) if len(x) else x


def shifted_digits() -> Splits:
    """Each training image plus its 8 one-pixel shifts, stored as 9 rows (case d), the records declared rows."""
    rows = datasets.load("digits")
    x, y = rows.train.inputs, rows.train.labels
    shifts = [np.roll(np.roll(x, dy, axis=-2), dx, axis=-1) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
    return dataclasses.replace(rows, train=Split(np.concatenate(shifts), np.tile(y, 9)))


PLUGINS = [ClipFromData(), CountsInClaim()]
MODEL_PLUGINS = [Model("test-standardising-mlp", ("image",), "leaks", standardising_mlp),
                 Model("test-peeking-mlp", ("image",), "reads splits.train", peeking_mlp)]
DATASET_PLUGINS = [Dataset("test-standardised-digits", "image", "opaque", standardised_digits),
                   Dataset("test-batch-standardised-digits", "image", "mixing transform",
                           lambda: _digits_records(), transform=batch_standardised),
                   Dataset("test-shifted-digits", "image", "9 rows a record", shifted_digits,
                           transform=records_are_rows)]


@pytest.fixture(scope="module", autouse=True)
def plugins():
    for m in PLUGINS:
        mechanisms.register(m)
    for m in MODEL_PLUGINS:
        models.register(m)
    for d in DATASET_PLUGINS:
        datasets.register(d)
    yield
    for m in PLUGINS:
        mechanisms.unregister(m.ID)
    for m in MODEL_PLUGINS:
        MODELS.unregister(m.name)
    for d in DATASET_PLUGINS:
        DATASETS.unregister(d.name)


def failed_checks(config: dict) -> dict[str, str]:
    return {f.check: f.reason for f in plan_phase(as_config(config)).findings if not f.passed}


# ---- each plan-time route, checked in the plan phase --------------------------------------------------------
def test_the_control_passes_every_check_at_the_issue_plan_within_a_few_cpu_seconds():
    c0 = time.process_time()
    planned = plan_phase(as_config(SETTING))
    assert time.process_time() - c0 < 10  # the whole plan phase, twice the plan-time code, on a loaded machine
    assert {f.check: f.passed for f in planned.findings} == dict.fromkeys(
        ("neighbour_plan", "neighbour_model", "neighbour_rows", "row_measures"), True)
    assert (round(planned.plan.sigma, 4), round(planned.plan.sample_rate, 4), planned.plan.steps) == \
        (1.0629, 0.0445, 44)


def test_a_clip_set_from_the_training_set_is_named():
    assert failed_checks(SETTING | {"mechanism": "test-clip-from-data"}) == {
        "neighbour_plan": "the plan's `parts.clip_bound` depends on the training set"}


def test_class_counts_in_the_claim_are_named():
    assert failed_checks(SETTING | {"mechanism": "test-counts-in-claim"}) == {
        "neighbour_plan": "the plan's `extra.counts` depends on the training set"}


def test_a_buffer_computed_from_the_training_set_is_named():
    assert failed_checks(SETTING | {"model": "test-standardising-mlp"}) == {
        "neighbour_model": "the model's buffer `0.mean` depends on the training set"}


def test_a_builder_reading_the_training_rows_is_refused_in_one_line():
    with pytest.raises(AttributeError, match=r"sees public information only .*`splits.train` holds private rows"):
        plan_phase(as_config(SETTING | {"model": "test-peeking-mlp"}))


def test_an_opaque_loader_is_never_passed_silently_and_its_standardisation_is_seen():
    failed = failed_checks(SETTING | {"dataset": "test-standardised-digits"})
    assert set(failed) == {"neighbour_rows", "row_measures"}
    assert "its training rows were not checked" in failed["neighbour_rows"]
    assert "a standardisation fitted on the training split" in failed["row_measures"]


def test_a_transform_mixing_records_is_named():
    failed = failed_checks(SETTING | {"dataset": "test-batch-standardised-digits"})
    assert failed["neighbour_rows"].startswith("the dataset `test-batch-standardised-digits`'s rows depend on "
                                               "other records: replacing training record 0 changed")


def test_several_rows_from_one_record_are_measured_and_seen_through_privbench_s_load():
    failed = failed_checks(SETTING | {"dataset": "test-shifted-digits"})
    assert "one-pixel shifts of another record's row" in failed["row_measures"]
    # the loader reads digits through privbench, so it made its rows of the neighbour: record 0's 8 shifts moved too
    assert "replacing training record 0 changed 8 other rows" in failed["neighbour_rows"]


# ---- real trials ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("over", "check"), [({}, None), ({"mechanism": "test-counts-in-claim"}, "neighbour_plan"),
                                             ({"model": "test-standardising-mlp"}, "neighbour_model")],
                         ids=["control", "claim", "buffer"])
def test_a_trial_is_ok_only_when_its_plan_time_code_does_not_read_the_training_set(over, check):
    record = run_trial(SETTING | over)
    assert record["status"] == "finished", record.get("traceback")
    privacy = record["privacy"]
    assert {"neighbour_plan", "neighbour_model", "neighbour_rows", "row_measures"} <= set(privacy["integrity_checks"])
    if check is None:
        assert privacy["claim_status"] == "ok" and privacy["integrity_failed"] == []
        assert privacy["epsilon_certified"] == pytest.approx(2.0, rel=1e-2)
    else:
        assert privacy["claim_status"] == "uncertified" and privacy["epsilon_certified"] is None
        assert privacy["integrity_checks"][check] is False
        assert any(f.startswith(f"{check}: ") and "depends on the training set" in f
                   for f in privacy["integrity_failed"])


# ---- the parts ---------------------------------------------------------------------------------------------
def test_a_neighbour_replaces_one_record_by_another_class_keeping_n():
    records = _digits_records()
    other = replace_record(records, 5)
    assert len(other.train) == len(records.train)
    assert np.flatnonzero(other.train.labels != records.train.labels).tolist() == [5]
    assert (other.train.inputs[5] != records.train.inputs[5]).any()
    assert np.array_equal(np.delete(other.train.inputs, 5, 0), np.delete(records.train.inputs, 5, 0))


def test_load_hands_the_neighbour_to_whoever_asks_inside_the_check_only():
    real = datasets.load("digits")
    with neighbouring(lambda n: n - 1):
        first, again = datasets.load("digits"), datasets.load("digits")
        assert first is again  # loaded once per check
    assert neighbours.changed_rows(real.train, first.train).tolist() == [len(real.train) - 1]
    assert neighbours.changed_rows(real.train, datasets.load("digits").train).tolist() == []


def test_the_worker_cache_hands_out_no_real_rows_during_the_check():
    real, _ = cache.cached_dataset("digits", {}, lambda: datasets.load("digits"))
    with neighbouring(lambda n: 0):
        rows, hit = cache.cached_dataset("digits", {}, lambda: datasets.load("digits"))
    assert not hit and neighbours.changed_rows(real.train, rows.train).tolist() == [0]
    again, hit = cache.cached_dataset("digits", {}, lambda: datasets.load("digits"))
    assert hit and again is real


def test_declared_units_allow_their_rows_to_differ_together():
    @dataclasses.dataclass(frozen=True)
    class UnitSplit(Split):
        units: np.ndarray | None = None

    a = UnitSplit(np.zeros((4, 2), np.float32), np.zeros(4, np.int64), np.array([0, 0, 1, 1]))
    b = dataclasses.replace(a, inputs=np.array([[1, 1], [1, 1], [0, 0], [0, 0]], np.float32))
    assert neighbours._rows_finding("d", a, b, 0, True).passed
    assert not neighbours._rows_finding("d", dataclasses.replace(a, units=None), b, 0, True).passed


def test_first_difference_names_the_path_and_counts_nan_equal():
    a = {"extra": {"counts": [1, 2]}, "sigma": float("nan"), "t": (1, np.zeros(3))}
    assert neighbours.first_difference(a, a) is None
    assert neighbours.first_difference(a, {**a, "extra": {"counts": [1, 3]}}) == "extra.counts"
    assert neighbours.first_difference(a, {**a, "t": (1, np.ones(3))}) == "t"
    assert neighbours.first_difference(a, {**a, "new": 1}) == "new"


def test_model_state_covers_buffers_and_plain_tensor_attributes():
    module = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    module[0].scale = torch.ones(1)
    state = neighbours.model_state(module)
    assert state["1.running_mean"][0] == "buffer" and state["0.weight"][0] == "parameter"
    assert state["0.scale"][0] == "tensor attribute"


def test_the_built_in_datasets_rows_show_nothing():
    for name in ("digits", "breast-cancer", "synthetic"):
        assert neighbours.measured(datasets.load(name).train) == [], name
