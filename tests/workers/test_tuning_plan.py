"""A tuned candidate's plan phase: the sigma the plan reports is the one the account chose and the one that
trains, `epsilon_certified` stays the executed run's PLD value, and under `budget: total` the selection's
epsilon meets the target (never above it)."""

from __future__ import annotations

import dataclasses

import dp_accounting
import pytest
import yaml

import mechanisms
from mechanisms.accounting.sound import epsilon as certified_epsilon
from mechanisms.accounting.tuning_cost import RunCount, account, tuned_epsilon
from orchestrator import grid
from workers.trial import plan_phase
from workers.tuning_candidates import TuningSetting, candidate_fields

GRID = {
    "name": "tuned", "seeds": [0], "delta": 1e-5,
    "grid": {"dataset": ["digits"], "model": ["mlp"], "mechanism": ["dpsgd", "dpsgd-gdp"], "epsilon": [2]},
    "dataset_options": {"digits": {"val_fraction": 0.1}},
    "train": {"epochs": 2, "batch_size": 64, "lr": 0.5},
    "audit": {"mode": "off"},
    "tune": {"space": {"lr": [0.1, 0.5], "clip": [0.5, 1.0]}, "runs": {"distribution": "poisson", "mean": 8}},
}


def candidates(seeds: tuple[int, ...] = (0,), **tune) -> list:
    raw = GRID | {"seeds": list(seeds), "tune": GRID["tune"] | tune}
    return list(grid.parse(yaml.safe_dump(raw)).trials)


@pytest.mark.parametrize("mechanism", ["dpsgd", "dpsgd-gdp"])
def test_budget_total_meets_the_target_with_the_executed_sigma(mechanism):
    trial = next(t for t in candidates() if t.mechanism == mechanism)
    planned = plan_phase(trial)
    plan, fields = planned.plan, planned.tuning
    assert fields["tuning_budget"] == "total" and "tuning_runs" not in fields  # the plan is shared across cells
    setting = TuningSetting.from_dict(trial.tuning)
    assert candidate_fields(trial.tuning) == {"tuning_runs": setting.runs, "tuning_cell": setting.cell,
                                              "tuning_candidate": setting.candidate, "tuning_params": setting.params}
    assert fields["epsilon_certified_tuned"] <= trial.epsilon
    assert fields["epsilon_certified_tuned"] == pytest.approx(trial.epsilon, rel=2e-3)
    # the executed run: its own event at the plan's sigma, certified by PLD, well under the target
    assert plan.epsilon_certified == pytest.approx(certified_epsilon(plan.parts(plan.sigma), plan.delta, "pld"))
    assert plan.epsilon_certified == pytest.approx(fields["epsilon_certified_run"])
    assert plan.epsilon_certified < trial.epsilon / 1.5
    # an independent recomputation of the selection from the plan that trains
    runs = RunCount("poisson", 8)
    assert tuned_epsilon([plan.parts(plan.sigma)], runs, plan.delta) == pytest.approx(
        fields["epsilon_certified_tuned"], rel=1e-9)


def test_budget_per_run_trains_the_ordinary_plan_and_reports_the_selection_on_top():
    trial = next(t for t in candidates(budget="per-run") if t.mechanism == "dpsgd")
    planned = plan_phase(trial)
    ordinary = mechanisms.get("dpsgd").plan(dataclasses.replace(planned.spec))
    assert planned.plan.sigma == ordinary.sigma
    assert planned.plan.epsilon_certified == pytest.approx(trial.epsilon, rel=2e-3)
    assert planned.tuning["epsilon_certified_tuned"] > 1.5 * trial.epsilon


def test_every_batch_size_the_space_can_draw_is_accounted():
    """Varying the batch size changes the event: the account covers each size, and each candidate trains at
    its own size's sigma from the same account."""
    trials = candidates(seeds=(1,), space={"batch_size": [32, 128], "lr": [0.5]})  # K = 9
    by_batch = {t.train.batch_size: t for t in trials if t.mechanism == "dpsgd"}
    assert set(by_batch) == {32, 128}
    plans = {b: plan_phase(t) for b, t in by_batch.items()}
    families = tuple(plans[b].plan.parts for b in (32, 128))
    acct = account(families, RunCount("poisson", 8), 2.0, plans[32].plan.delta, "total",
                   base_sigmas=tuple(mechanisms.get("dpsgd").plan(plans[b].spec).sigma for b in (32, 128)))
    assert (plans[32].plan.sigma, plans[128].plan.sigma) == pytest.approx(acct.sigmas)
    assert {p.tuning["epsilon_certified_tuned"] for p in plans.values()} == {acct.epsilon_tuned}
    assert acct.epsilon_tuned <= 2.0
    # the account is the worst case over both: more than either size alone would give
    alone = tuned_epsilon([plans[32].plan.parts(plans[32].plan.sigma)], RunCount("poisson", 8), acct.delta)
    assert alone <= acct.epsilon_tuned


def test_the_account_is_deterministic():
    trial = candidates()[0]
    assert plan_phase(trial).tuning == plan_phase(trial).tuning


def test_a_selection_of_one_run_is_the_run():
    trial = candidates(runs={"distribution": "geometric", "mean": 1})[0]
    planned = plan_phase(trial)
    assert planned.tuning["epsilon_certified_tuned"] == pytest.approx(planned.plan.epsilon_certified, rel=1e-9)
    assert isinstance(planned.plan.parts(planned.plan.sigma), dp_accounting.DpEvent)
