"""A tuned cell's candidate as a trial: what it carries (`TuningSetting`) and how its noise is planned.

The grid (orchestrator/tune_block.py) turns each (dataset, model, mechanism, epsilon, seed) cell with a
`tune:` block into K candidate trials; each carries its `TuningSetting` in `TrialConfig.tuning`. The plan
phase (`tuned_plan`) accounts the whole selection with `mechanisms.accounting.tuning_cost.account`, from the
mechanism's own plan parts at the actual training-set size, for every privacy setting the space can
produce (not only the drawn ones): under `budget: total` the candidate trains with the account's sigma,
under `per-run` with the mechanism's own, and both record what one run and the selection certify.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mechanisms.accounting.tuning_cost import (
    TUNABLE,
    Choice,
    LogRange,
    Param,
    RunCount,
    TuneSpec,
    account,
)
from mechanisms.framework.integrity.verdict import plan_for
from mechanisms.parts.plan import PrivacyPlan, PrivacySpec

PRIVACY_SETTINGS = ("batch_size", "epochs")  # training settings that change the run's privacy event
# The fields a tuned candidate's privacy record carries beside the plan's own (storage/schema.py lists them
# for the store once it exists; the leaderboard reads them by these names).
RECORD_FIELDS = ("epsilon_certified_run", "epsilon_certified_tuned", "tuning_runs", "tuning_distribution",
                 "tuning_budget", "tuning_cell", "tuning_candidate", "tuning_params", "tuning_mean",
                 "tuning_epsilon_run_rdp")


def spec_to_dict(spec: TuneSpec) -> dict[str, Any]:
    """A JSON-ready `tune:` block that `spec_from_dict` reads back into an equal spec."""
    space = {p.name: list(p.values) if isinstance(p, Choice) else {"log": [p.low, p.high]} for p in spec.space}
    runs = {"distribution": spec.runs.distribution, "mean": spec.runs.mean}
    if spec.runs.shape is not None:
        runs["shape"] = spec.runs.shape
    out: dict[str, Any] = {"space": space, "runs": runs, "select": spec.select, "budget": spec.budget}
    if spec.val_noise is not None:
        out["val_noise"] = spec.val_noise
    return out


def spec_from_dict(data: Mapping[str, Any]) -> TuneSpec:
    """The spec `spec_to_dict` wrote (already checked by the grid: no second set of rules here)."""
    params: list[Param] = []
    for name, value in data["space"].items():
        integer = name in ("batch_size", "epochs")
        if isinstance(value, Mapping):
            params.append(LogRange(name, float(value["log"][0]), float(value["log"][1]), integer))
        else:
            params.append(Choice(name, tuple(value)))
    runs = data["runs"]
    return TuneSpec(tuple(params), RunCount(runs["distribution"], runs["mean"], runs.get("shape")),
                    data.get("select", "val_accuracy"), data.get("budget", "total"), data.get("val_noise"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuningSetting:
    """What a candidate trial knows of its cell: the spec, the cell (its key and seed), its place among the
    cell's `runs` candidates and the parameters it drew."""

    spec: TuneSpec
    cell: str
    cell_seed: int
    candidate: int
    runs: int
    params: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"spec": spec_to_dict(self.spec), "cell": self.cell, "cell_seed": self.cell_seed,
                "candidate": self.candidate, "runs": self.runs, "params": dict(self.params)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TuningSetting:
        return cls(spec=spec_from_dict(data["spec"]), cell=str(data["cell"]), cell_seed=int(data["cell_seed"]),
                   candidate=int(data["candidate"]), runs=int(data["runs"]), params=dict(data["params"]))

    def privacy_names(self) -> tuple[str, ...]:
        """The space's parameters that change the run's event: batch size, epochs, mechanism options."""
        return (*PRIVACY_SETTINGS, *(p.name for p in self.spec.space if p.name not in TUNABLE))


def _spec_at(spec: PrivacySpec, setting: Mapping[str, Any]) -> PrivacySpec:
    """`spec` with one privacy setting of the space (batch size, epochs, mechanism options) in place."""
    train = {k: v for k, v in setting.items() if k in PRIVACY_SETTINGS}
    options = {k: v for k, v in setting.items() if k not in PRIVACY_SETTINGS}
    return dataclasses.replace(spec, **train, options=dict(spec.options) | options)


def candidate_fields(tuning: Mapping[str, Any]) -> dict[str, Any]:
    """The record fields of one candidate (its cell, place and draw). Not part of the plan: candidates that
    share the plan's settings (`TrialConfig.plan_key`) share one plan, across cells too."""
    if not tuning:
        return {}
    setting = TuningSetting.from_dict(tuning)
    return {"tuning_runs": setting.runs, "tuning_cell": setting.cell, "tuning_candidate": setting.candidate,
            "tuning_params": dict(setting.params)}


def tuned_plan(tuning: Mapping[str, Any], spec: PrivacySpec, mechanism: Any) -> tuple[PrivacyPlan, dict[str, Any]]:
    """The candidate's plan and the tuning record fields of its plan (`candidate_fields` adds its own).

    Every privacy setting the space can produce is planned by the mechanism at this training set (its parts
    are the event family, its sigma the per-run noise it chooses itself); `account` gives each setting's
    sigma under the budget. The returned plan is the one that trains: under `total` it is the mechanism's
    plan at the account's sigma, so its `epsilon_certified` is the executed run's own PLD value.
    """
    setting = TuningSetting.from_dict(tuning)
    fields: dict[str, Any] = {"tuning_distribution": setting.spec.runs.label(), "tuning_budget": setting.spec.budget,
                              "tuning_mean": setting.spec.runs.mean}
    if spec.epsilon is None:  # nothing private to account (a non-private baseline's candidates)
        plan = plan_for(mechanism, spec)
        return plan, fields | {"epsilon_certified_run": plan.epsilon_certified, "epsilon_certified_tuned": None}
    names = setting.privacy_names()
    support = setting.spec.privacy_support(names)
    mine = {k: v for k, v in (dict(setting.params) | {"batch_size": spec.batch_size, "epochs": spec.epochs}
                              | dict(spec.options)).items() if k in names}
    plans = [plan_for(mechanism, _spec_at(spec, s)) for s in support]
    index = next(i for i, s in enumerate(support) if all(mine.get(k) == v for k, v in s.items()))
    families = tuple(p.parts for p in plans)
    if any(f is None for f in families):
        raise ValueError(f"{mechanism.ID}: tuning needs a mechanism with private parts")
    acct = account(families, setting.spec.runs, float(spec.epsilon), float(plans[index].delta), setting.spec.budget,
                   base_sigmas=tuple(float(p.sigma) for p in plans))
    plan = plans[index]
    if setting.spec.budget == "total":
        plan = plan_for(mechanism, dataclasses.replace(spec, epsilon=None, sigma=acct.sigmas[index]))
    if plan.parts != families[index] or plan.sigma != acct.sigmas[index]:
        raise RuntimeError("the tuned plan is not the accounted one: the accounted process must be the executed one")
    return plan, fields | {"epsilon_certified_run": acct.epsilon_run, "epsilon_certified_tuned": acct.epsilon_tuned,
                           "tuning_epsilon_run_rdp": acct.epsilon_run_rdp}


__all__ = ["RECORD_FIELDS", "TuningSetting", "candidate_fields", "spec_from_dict", "spec_to_dict", "tuned_plan"]
