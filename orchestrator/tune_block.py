"""The `tune:` block of a grid file: parsed into a `TuneSpec`, or one line per problem.

    tune:
      space: {lr: [0.05, 0.1, 0.2], clip: {log: [0.1, 2]}}   # lists, or {log: [low, high]} log-uniform
      runs: {distribution: poisson, mean: 8}                  # geometric | logarithmic | negative-binomial (+ shape)
      select: val_accuracy                                    # a validation split, never the test set
      budget: total                                           # or per-run
      val_noise: 5                                            # optional: noise on the validation count

`parse_tune` is pure: the caller says which options each mechanism of the grid takes
(`mechanism_options`), so it needs neither the registry nor the grid's own parser. Every problem is
reported, not the first. `grid_problems` checks the block against its grid, and `expand` turns each cell
into its candidate trials.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

import mechanisms
from mechanisms.accounting.tuning_cost import (
    BUDGETS,
    DISTRIBUTIONS,
    INTEGER_SETTINGS,
    TUNABLE,
    Choice,
    LogRange,
    Param,
    RunCount,
    TuneSpec,
    candidate_seed,
)
from workers import datasets
from workers.config import TrialConfig
from workers.tuning_candidates import PRIVACY_SETTINGS, TuningSetting

KEYS = ("space", "runs", "select", "budget", "val_noise")
RUN_KEYS = ("distribution", "mean", "shape")
SELECTABLE = ("val_accuracy",)  # metrics of the validation split that the trial records
TEST_METRICS = ("accuracy", "test", "test_accuracy", "test_loss")  # the test set: reported, never selected on

MechanismOptions = Mapping[str, Collection[str]] | Callable[[], Mapping[str, Collection[str]]]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _unknown(where: str, value: Mapping[str, Any], known: Collection[str], problems: list[str]) -> None:
    unknown = sorted(str(k) for k in value if k not in known)
    if unknown:
        problems.append(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                        f"known: {', '.join(known)}")


def _runs(value: Any, problems: list[str]) -> RunCount | None:
    if not isinstance(value, Mapping):
        problems.append(f"tune.runs: must be a mapping like {{distribution: poisson, mean: 8}}, got {value!r}"[:300])
        return None
    _unknown("tune.runs", value, RUN_KEYS, problems)
    distribution, mean, shape = value.get("distribution"), value.get("mean"), value.get("shape")
    ok = True
    if distribution not in DISTRIBUTIONS:
        problems.append(f"tune.runs.distribution: unknown {distribution!r}; known: {', '.join(DISTRIBUTIONS)}")
        ok = False
    if not _is_number(mean):
        problems.append(f"tune.runs.mean: must be a number (the mean number of candidate runs), got {mean!r}")
        ok = False
    elif mean < 1:
        problems.append(f"tune.runs.mean: must be >= 1 (the mean number of candidate runs), got {mean!r}")
        ok = False
    if distribution == "negative-binomial":
        if not _is_number(shape) or shape <= 0:
            problems.append(f"tune.runs.shape: negative-binomial needs a shape > 0 (1 is geometric), got {shape!r}")
            ok = False
    elif shape is not None and distribution in DISTRIBUTIONS:
        problems.append(f"tune.runs.shape: only negative-binomial takes a shape ({distribution} fixes it)")
        ok = False
    return RunCount(distribution, mean, shape) if ok else None


def _param(name: str, value: Any, problems: list[str]) -> Param | None:
    where = f"tune.space.{name}"
    integer = name in INTEGER_SETTINGS
    numeric = name in TUNABLE
    if isinstance(value, Mapping):
        _unknown(where, value, ("log",), problems)
        bounds = value.get("log")
        if not (isinstance(bounds, (list, tuple)) and len(bounds) == 2 and all(_is_number(b) for b in bounds)
                and 0 < bounds[0] <= bounds[1]):
            problems.append(f"{where}: a log-range is {{log: [low, high]}} with 0 < low <= high, got {value!r}"[:300])
            return None
        if integer and math.ceil(bounds[0]) > math.floor(bounds[1]):
            problems.append(f"{where}: the log-range {list(bounds)} holds no integer")
            return None
        return LogRange(name, float(bounds[0]), float(bounds[1]), integer)
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values:
        problems.append(f"{where}: empty list: give at least one value")
        return None
    bad = [v for v in values if numeric and (not _is_number(v) or v <= 0 or (integer and v != int(v)))]
    if bad:
        kind = "integers >= 1" if integer else "numbers > 0"
        problems.append(f"{where}: values must be {kind}, got {', '.join(repr(b) for b in bad)}"[:300])
        return None
    if len({repr(v) for v in values}) < len(values):
        problems.append(f"{where}: duplicated values in {values!r} (each is drawn with equal probability)"[:300])
        return None
    return Choice(name, tuple(int(v) if integer else v for v in values))


def _space(value: Any, options: Mapping[str, Collection[str]], problems: list[str]) -> tuple[Param, ...]:
    if not isinstance(value, Mapping):
        problems.append(f"tune.space: must map parameters to lists or log-ranges, got {value!r}"[:300])
        return ()
    if not value:
        problems.append("tune.space: empty: give at least one parameter to tune (e.g. lr: [0.05, 0.1])")
        return ()
    params = []
    for name, spec in value.items():
        refusing = sorted(m for m, taken in options.items() if name not in TUNABLE and name not in taken)
        if refusing:
            who = f"mechanism {refusing[0]} does" if len(refusing) == 1 else f"mechanisms {', '.join(refusing)} do"
            problems.append(f"tune.space.{name}: {who} not take {name!r}; "
                            f"tunable: {', '.join(TUNABLE)} and each mechanism's own options")
            continue
        param = _param(str(name), spec, problems)
        if param is not None:
            params.append(param)
    return tuple(params)


def _select(value: Any, problems: list[str]) -> str | None:
    if value in SELECTABLE:
        return value
    if isinstance(value, str) and (value in TEST_METRICS or value.startswith("test")):
        problems.append(f"tune.select: {value!r} is a test-set metric; selection must use a validation split "
                        f"carved from the training data ({', '.join(SELECTABLE)}), the test score is only reported")
    else:
        problems.append(f"tune.select: unknown metric {value!r}; known: {', '.join(SELECTABLE)}")
    return None


def parse_tune(value: Any, mechanism_options: MechanismOptions) -> tuple[TuneSpec | None, list[str]]:
    """(the spec, []) for a valid `tune:` block, else (None, problems), each problem one line.

    `mechanism_options`: for each mechanism of the grid, the option names it takes (or a callable giving
    that mapping); a space parameter must be a training setting in `TUNABLE` or taken by every mechanism.
    """
    problems: list[str] = []
    if not isinstance(value, Mapping):
        return None, [f"tune: must be a mapping with keys {', '.join(KEYS)}, got {value!r}"[:300]]
    options = mechanism_options() if callable(mechanism_options) else mechanism_options
    _unknown("tune", value, KEYS, problems)
    space = _space(value.get("space"), options, problems) if "space" in value else ()
    if "space" not in value:
        problems.append("tune.space: missing: give the parameters to tune (e.g. {lr: [0.05, 0.1]})")
    runs = None
    if "runs" in value:
        runs = _runs(value["runs"], problems)
    else:
        problems.append("tune.runs: missing: e.g. {distribution: poisson, mean: 8}")
    select = _select(value.get("select", "val_accuracy"), problems)
    budget = value.get("budget", "total")
    if budget not in BUDGETS:
        problems.append(f"tune.budget: unknown {budget!r}; known: {', '.join(BUDGETS)}")
    val_noise = value.get("val_noise")
    if val_noise is not None and (not _is_number(val_noise) or val_noise <= 0):
        problems.append(f"tune.val_noise: must be a number > 0 (noise on the count of correct validation "
                        f"predictions), got {val_noise!r}")
    if problems:
        return None, problems
    return TuneSpec(space, runs, select, budget, None if val_noise is None else float(val_noise)), []


# --- the grid's side: checks that need the grid, and the expansion into candidate trials ------------------

def _validation_problems(datasets_: Collection[str], dataset_options: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Each tuned dataset must carve a validation split from its training data (`val_fraction` > 0)."""
    problems = []
    for name in datasets_:
        entry, rest = datasets.get_loader(name)
        if rest is not None:  # `hf:` datasets may bring their own validation split; checked when loaded
            continue
        param = inspect.signature(entry.loader).parameters.get("val_fraction")
        value = (dataset_options.get(name) or {}).get("val_fraction", None if param is None else param.default)
        if not (_is_number(value) and value > 0):
            problems.append(f"tune: dataset {name!r} has no validation split to select on; set "
                            f"dataset_options: {{{name}: {{val_fraction: 0.1}}}} (carved from its training data)")
    return problems


def grid_problems(spec: TuneSpec, *, datasets_: Collection[str], dataset_options: Mapping[str, Mapping[str, Any]],
                  mechanism_option_names: Collection[str], epsilons: Collection[float]) -> list[str]:
    """What a valid `tune:` block can still get wrong against its grid: no validation split, no target
    epsilon to spend, a space whose privacy settings cannot be enumerated, validation noise (not yet run)."""
    problems = _validation_problems(datasets_, dataset_options)
    if not epsilons:
        problems.append("tune: needs grid.epsilon targets (the selection is calibrated or accounted against each)")

    try:
        spec.privacy_support((*PRIVACY_SETTINGS, *mechanism_option_names))
    except ValueError as e:
        problems.append(str(e))
    if spec.val_noise is not None:
        problems.append("tune.val_noise: sweeps do not noise the validation score yet; leave it out (the "
                        "validation records are then outside the guarantee, see docs/accountants.md)")
    return problems


def expand(trials: Iterable[TrialConfig], spec: TuneSpec) -> Iterator[TrialConfig]:
    """Each cell's trial becomes its candidates: K = `spec.runs.draw(seed)` draws from the space, each
    the cell's config with the drawn training settings and mechanism options, trained with its own seed
    (`candidate_seed`) and carrying its `TuningSetting`. The draws depend only on the cell's seed, so a
    resumed sweep expands to the same trial keys. A Poisson K of 0 gives no trial (nothing is selected)."""
    for cell in trials:
        candidates = spec.draw(cell.seed)
        for candidate in candidates:
            params = candidate.as_dict()
            train = {k: v for k, v in params.items() if k in TUNABLE}
            options = {k: v for k, v in params.items() if k not in TUNABLE}
            setting = TuningSetting(spec=spec, cell=cell.trial_key, cell_seed=cell.seed, candidate=candidate.index,
                                    runs=len(candidates), params=params)
            yield dataclasses.replace(
                cell, seed=candidate_seed(cell.seed, candidate.index),
                train=dataclasses.replace(cell.train, **train),
                mechanism_options=dict(cell.mechanism_options) | options, tuning=setting.to_dict())


def grid_spec(raw: Mapping[str, Any], axes: Any, options: Mapping[str, Mapping[str, Mapping[str, Any]]],
              problems: list[str]) -> TuneSpec | None:
    """The grid's `tune:` block parsed and checked against the grid's axes (`orchestrator.grid.Axes`); its
    problems are added to `problems` (the grid then exits 2 before anything is written)."""
    names = {m: {f.name for f in dataclasses.fields(mechanisms.get(m).Options)} for m in axes.mechanisms}
    spec, found = parse_tune(raw["tune"], names)
    problems.extend(found)
    if spec is None:
        return None
    tuned_options = {p.name for p in spec.space if p.name not in TUNABLE}
    found = grid_problems(spec, datasets_=axes.datasets, dataset_options=options.get("dataset_options", {}),
                          mechanism_option_names=sorted(tuned_options), epsilons=axes.epsilons)
    problems.extend(found)
    return None if found else spec
