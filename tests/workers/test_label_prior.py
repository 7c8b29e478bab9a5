"""The honest route to a class prior: the label histogram released through a `Statistic` (each example's one-hot
row clipped to 1 and noised, composed into the plan), never read from the private rows by the builder."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from workers import datasets, models
from workers.train import release_statistics
from workers.trial import run_trial

BASE = {"dataset": "digits", "model": "mlp", "mechanism": "dpsgd", "epsilon": 2.0, "delta": 1e-5, "seed": 0,
        "train": {"epochs": 2, "batch_size": 64}, "audit": {"mode": "off"}, "resources": {"cpus": 1, "gpus": 0}}


class _ReferencePlan:
    parts = None  # a reference run: the statistic is released exactly, so the prior is the true class shares


def test_the_prior_is_the_log_of_the_class_shares_when_released_exactly():
    splits = datasets.load("digits")
    bundle = models.build("mlp", splits, {"label_prior": "private"})
    release_statistics(bundle, splits.train, _ReferencePlan(), None)
    shares = np.bincount(splits.train.labels, minlength=10) / len(splits.train)
    assert torch.allclose(bundle.module[-1].bias.double(), torch.from_numpy(np.log(shares)), atol=1e-6)


@pytest.fixture(scope="module")
def records():
    warnings.filterwarnings("ignore")
    return run_trial(BASE | {"model_options": {"label_prior": "private"}}), run_trial(BASE)


def test_a_private_prior_is_accounted_and_the_trial_stays_ok(records):
    prior, plain = records
    assert prior["status"] == plain["status"] == "finished", prior.get("error")
    p, q = prior["privacy"], plain["privacy"]
    assert p["claim_status"] == "ok" and p["integrity_failed"] == [], p["integrity_failed"]
    assert [r["statistic"] for r in p["parts"]["dataset_releases"]] == ["label_counts"]
    assert p["epsilon_certified"] <= 2.0 and p["sigma"] > q["sigma"]  # the release costs some of the budget
