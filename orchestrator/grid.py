"""Grid files: parse and validate everything up front, then expand into trials with stable keys.

Validation collects every problem before anything runs or is written (exit code 2 in the CLI).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

import mechanisms
from mechanisms.registry import UnknownName
from workers import datasets, models
from workers.audit import AuditConfig
from workers.train import TrainConfig

TOP_LEVEL = {"name", "seeds", "delta", "grid", "train", "accountant", "calibration", "sampler", "audit",
             "resources", "mechanism_options", "model_options", "dataset_options", "description", "sigma",
             "mechanism_train", "model_train"}
GRID_AXES = ("dataset", "model", "mechanism", "epsilon")
ACCOUNTANTS = ("pld", "rdp")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class GridError(ValueError):
    """Every problem found in a grid file, one per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclasses.dataclass(frozen=True)
class GridSpec:
    name: str
    raw: dict[str, Any]
    text: str
    trials: tuple[dict[str, Any], ...]

    @property
    def gpus_requested(self) -> float:
        return max((float(t["resources"]["gpus"]) for t in self.trials if t["resources"]["gpus"] != "auto"),
                   default=0.0)


NOT_IN_KEY = ("sweep", "trial_key", "resources")  # where and how a trial runs is not what it computes


def trial_key(config: dict[str, Any]) -> str:
    """sha256 of the resolved config, without the sweep name and the resources it runs on: the same
    trial always has the same key, and moving a sweep to more CPUs or a GPU does not rerun it."""
    blob = json.dumps({k: v for k, v in config.items() if k not in NOT_IN_KEY},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _delta(value: Any, problems: list[str]) -> float | str | None:
    if isinstance(value, str) and value.replace(" ", "") == "1/(2N)":
        return "1/(2N)"
    try:
        delta = float(value)
    except (TypeError, ValueError):
        problems.append(f"delta: must be a number in (0, 1) or \"1/(2N)\", got {value!r}")
        return None
    if not 0 < delta < 1:
        problems.append(f"delta: must lie in (0, 1), got {delta:g}")
        return None
    return delta


def _check_names(kind: str, values: list[Any], lookup: Any, problems: list[str]) -> None:
    for v in values:
        try:
            lookup(str(v))
        except UnknownName as e:
            problems.append(f"grid.{kind}: {e}")


def parse(text: str, *, source: str = "grid") -> GridSpec:
    """Parse and validate a grid's YAML text; raise GridError listing every problem."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise GridError([f"{source}: YAML syntax error{where}: {getattr(e, 'problem', e)}"]) from None
    if not isinstance(raw, dict):
        raise GridError([f"{source}: a grid file must be a YAML mapping"])
    problems: list[str] = []
    unknown = sorted(set(raw) - TOP_LEVEL)
    if unknown:
        problems.append(f"unknown top-level keys {unknown}; known: {sorted(TOP_LEVEL)}")
    name = str(raw.get("name", Path(source).stem))
    if not NAME_RE.match(name):
        problems.append(f"name: {name!r} must be letters, digits, '_', '-' or '.'")
    grid = raw.get("grid")
    if not isinstance(grid, dict):
        raise GridError(problems + ["grid: missing or not a mapping of dataset/model/mechanism/epsilon lists"])
    extra_axes = sorted(set(grid) - set(GRID_AXES))
    if extra_axes:
        problems.append(f"grid: unknown axes {extra_axes}; known: {list(GRID_AXES)}")
    axes = {a: _as_list(grid.get(a, [])) for a in GRID_AXES}
    for a in ("dataset", "model", "mechanism"):
        if not axes[a]:
            problems.append(f"grid.{a}: at least one value is needed")
    _check_names("dataset", axes["dataset"], datasets.get_loader, problems)
    _check_names("model", axes["model"], models.get_entry, problems)
    _check_names("mechanism", axes["mechanism"], mechanisms.get, problems)
    private = [m for m in axes["mechanism"] if m != "nonprivate"]
    epsilons: list[float] = []
    for e in axes["epsilon"]:
        try:
            value = float(e)
        except (TypeError, ValueError):
            problems.append(f"grid.epsilon: {e!r} is not a number")
            continue
        if not (value > 0 and math.isfinite(value)):
            problems.append(f"grid.epsilon: must be > 0 and finite, got {e!r}")
        epsilons.append(value)
    sigma = raw.get("sigma")
    if private and not epsilons and sigma is None:
        problems.append("grid.epsilon: private mechanisms need at least one epsilon (or a top-level sigma)")
    if sigma is not None and not (isinstance(sigma, int | float) and sigma > 0):
        problems.append(f"sigma: must be a number > 0, got {sigma!r}")
    delta = _delta(raw.get("delta", 1e-5), problems)
    seeds = _as_list(raw.get("seeds", [0]))
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        problems.append(f"seeds: must be a list of integers, got {raw.get('seeds')!r}")
    train = raw.get("train") or {}
    # Overrides: a model's (a from-scratch model wants a larger lr than a pretrained one), then a
    # mechanism's (DP-SGD wants larger batches), each on top of `train`.
    overrides: dict[str, dict[str, dict[str, Any]]] = {}
    for key, what in (("model_train", "model"), ("mechanism_train", "mechanism")):
        value = raw.get(key) or {}
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            problems.append(f"{key}: must map a {what} to a mapping of train settings")
            value = {}
        overrides[key] = value
    model_train, mechanism_train = overrides["model_train"], overrides["mechanism_train"]
    for where, settings in [("train", train)] + [(f"{key}.{name}", train | v) for key, table in overrides.items()
                                                 for name, v in table.items()]:
        try:
            TrainConfig(**settings)
        except TypeError as e:
            fields = [f.name for f in dataclasses.fields(TrainConfig)]
            problems.append(f"{where}: {e}; known keys: {fields}")
        except ValueError as e:
            problems.append(f"{where}: {e}")
    accountant = raw.get("accountant", "pld")
    if accountant not in ACCOUNTANTS:
        problems.append(f"accountant: unknown {accountant!r}; known: {list(ACCOUNTANTS)}")
    calibration = raw.get("calibration", "claimed")
    if calibration not in mechanisms.plan.CALIBRATIONS:
        problems.append(f"calibration: must be one of {list(mechanisms.plan.CALIBRATIONS)}, got {calibration!r}")
    sampler = raw.get("sampler", "poisson")
    if sampler not in mechanisms.plan.SAMPLERS:
        problems.append(f"sampler: must be one of {list(mechanisms.plan.SAMPLERS)}, got {sampler!r}")
    resources = dict(raw.get("resources") or {})
    cpus, gpus = resources.get("cpus", 1), resources.get("gpus", "auto")
    if not (isinstance(cpus, int | float) and cpus > 0):
        problems.append(f"resources.cpus: must be a number > 0, got {cpus!r}")
    if not (gpus == "auto" or (isinstance(gpus, int | float) and gpus >= 0)):
        problems.append(f"resources.gpus: must be 'auto' or a number >= 0, got {gpus!r}")
    options = {k: raw.get(k) or {} for k in ("mechanism_options", "model_options", "dataset_options")}
    for k, v in options.items():
        if not isinstance(v, dict) or not all(isinstance(x, dict) for x in v.values()):
            problems.append(f"{k}: must map a name to a mapping of options")
    audit = raw.get("audit") or {}
    try:
        AuditConfig(**audit)
    except (TypeError, ValueError) as e:
        problems.append(f"audit: {e}")
    for d, m in itertools.product(axes["dataset"], axes["model"]):
        try:
            kind = datasets.get_loader(str(d))[0].kind
            if not models.supports(str(m), kind):
                problems.append(f"grid: model {m!r} does not take {kind} data (dataset {d!r})")
        except UnknownName:
            pass
    if problems:
        raise GridError(problems)

    base = {"delta": delta, "accountant": accountant, "calibration": calibration, "sampler": sampler,
            "resources": {"cpus": cpus, "gpus": gpus}, "audit": audit}
    configs: list[dict[str, Any]] = []
    for d, m, mech, seed in itertools.product(axes["dataset"], axes["model"], axes["mechanism"], seeds):
        targets: list[float | None] = [None] if mech == "nonprivate" or not epsilons else list(epsilons)
        for eps in targets:
            cfg = base | {"train": train | model_train.get(m, {}) | mechanism_train.get(mech, {}),
                          "dataset": str(d), "model": str(m), "mechanism": str(mech), "epsilon": eps,
                          "seed": seed, "sigma": sigma if mech != "nonprivate" and eps is None else None,
                          "mechanism_options": options["mechanism_options"].get(mech, {}),
                          "model_options": options["model_options"].get(m, {}),
                          "dataset_options": options["dataset_options"].get(d, {})}
            cfg = {"sweep": name} | cfg
            cfg["trial_key"] = trial_key(cfg)
            configs.append(cfg)
    return GridSpec(name, raw, text, tuple(configs))


def load(path: str | Path) -> GridSpec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise GridError([f"{path}: cannot read grid file ({e.strerror})"]) from None
    return parse(text, source=str(path))
