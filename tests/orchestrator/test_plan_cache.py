"""The calibration cache (issue 39): a plan is read back only for the very settings and code it was made for; any
changed input misses, and a ledger row cannot make the driver run code."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import yaml

from orchestrator import grid, plan_cache
from tests.conftest import TINY
from workers.trial import plan_phase

DP = {k: v for k, v in TINY.items() if k != "sigma"} | {
    "grid": TINY["grid"] | {"mechanism": ["dpsgd"], "epsilon": [8]},
    "train": TINY["train"] | {"max_train_examples": 256}}


def config_of(**changes):
    (config,) = grid.parse(yaml.safe_dump(DP | changes)).trials
    return config


@pytest.fixture
def st(store):
    from orchestrator.runner import locate
    from storage.store import Store

    s = Store(locate(str(store)), create=True)
    yield s
    s.close()


def test_every_input_of_a_plan_is_in_its_key(monkeypatch):
    base = config_of()
    train = DP["train"]
    changed = {
        "accountant": config_of(accountant="rdp"),
        "sampler": config_of(sampler="fixed"),
        "epochs": config_of(train=train | {"epochs": 2}),
        "batch size (the rate)": config_of(train=train | {"batch_size": 32}),
        "training set (the rate)": config_of(train=train | {"max_train_examples": 512}),
        "delta": config_of(delta=1e-6),
        "target epsilon": config_of(grid=DP["grid"] | {"epsilon": [4]}),
        "clip": config_of(train=train | {"clip": 2.0}),
        "mechanism": config_of(grid=DP["grid"] | {"mechanism": ["dpsgd-gdp"]}),
        "model": config_of(grid=DP["grid"] | {"model": ["linear"]}),
        "calibration": config_of(calibration="certified"),
    }
    keys = {name: plan_cache.key(c) for name, c in changed.items()}
    assert plan_cache.key(base) not in keys.values(), [n for n, k in keys.items() if k == plan_cache.key(base)]
    assert len(set(keys.values())) == len(keys)
    assert plan_cache.key(config_of(seeds=[3])) == plan_cache.key(base)  # the seed is not an input of the plan
    before = plan_cache.key(base)
    monkeypatch.setattr(plan_cache, "code_digest", lambda: "another version of the mechanisms")
    assert plan_cache.key(base) != before
    monkeypatch.undo()
    with_plugin = dataclasses.replace(base, code={"mechanism": "x: pkg 1.0 sha256:abc"})
    assert plan_cache.key(with_plugin) != before


def test_a_cached_plan_is_the_plan_and_a_changed_input_misses(st):
    config = config_of()
    made = plan_phase(config)
    assert plan_cache.lookup(st, config) is None
    plan_cache.keep(st, config, made)
    hit = plan_cache.lookup(st, config)
    assert hit is not None and hit.cached and hit.seconds < 0.2
    assert hit.plan == made.plan and hit.spec == made.spec
    assert hit.findings == made.findings and {f.check for f in hit.findings} >= {"neighbour_plan", "neighbour_model"}
    assert plan_cache.lookup(st, config_of(delta=1e-6)) is None
    assert plan_cache.lookup(st, config_of(accountant="rdp")) is None


def test_a_ledger_row_cannot_make_the_driver_run_code(st):
    config = config_of()

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    st.add_calibration(plan_cache.key(config), {}, pickle.dumps(Evil()))
    assert plan_cache.lookup(st, config) is None


def test_the_cache_can_be_turned_off(st, monkeypatch):
    config = config_of()
    plan_cache.keep(st, config, plan_phase(config))
    monkeypatch.setenv("PRIVBENCH_PLAN_CACHE", "0")
    assert plan_cache.lookup(st, config) is None


def test_a_cached_plan_for_another_training_set_is_refused_by_the_trial():
    """A hit is still checked against the process that runs: a cached plan whose spec is not the trial's (data
    changed on the worker since) stops the trial, saying where the plan came from."""
    from workers.trial import accelerator_phase

    config = config_of()
    cached = dataclasses.replace(plan_phase(config), cached=True)
    other = config_of(train=DP["train"] | {"max_train_examples": 300})
    with pytest.raises(RuntimeError, match="calibration cache"):
        accelerator_phase(other, cached)
