"""Grid files: parse and validate everything up front, then expand into trials with stable keys.

Validation collects every problem before anything runs or is written (exit code 2 in the CLI).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import itertools
import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

import mechanisms
from mechanisms.clipping import GRAD_SAMPLE_MODES
from mechanisms.registry import UnknownName
from orchestrator import grid_yaml
from workers import datasets, models
from workers.audit import AuditConfig
from workers.train import TrainConfig

TOP_LEVEL = {"name", "seeds", "delta", "grid", "train", "accountant", "calibration", "sampler", "audit",
             "resources", "mechanism_options", "model_options", "dataset_options", "description", "sigma",
             "mechanism_train", "model_train", "secure_rng", "plugins"}
GRID_AXES = ("dataset", "model", "mechanism", "epsilon")
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
    plugins: tuple[str, ...] = ()  # modules the driver imported and ships to the cluster (workers.plugins)

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


SEED_MAX = 2**32 - 1  # numpy's seeds
MAX_AXIS_VALUES = 10_000
RESOURCE_KEYS = ("cpus", "gpus")


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(where: str, value: Any, problems: list[str], *, gt: float | None = None, ge: float | None = None,
            lt: float | None = None, integer: bool = False, maximum: float | None = None) -> Any:
    """Check one number: a number (not a boolean, not a string), finite, integral when asked, in range.
    Returns the value (an integral float becomes an int) or None after adding a problem."""
    if not _is_number(value):
        kind = "an integer" if integer else "a number"
        problems.append(f"{where}: must be {kind}, got {value!r}")
        return None
    if not math.isfinite(value):
        problems.append(f"{where}: must be finite, got {value!r}")
        return None
    if integer:
        if value != int(value):
            problems.append(f"{where}: must be an integer, got {value!r}")
            return None
        value = int(value)
    bounds = [(gt, lambda v, b: v > b, "> {b:g}"), (ge, lambda v, b: v >= b, ">= {b:g}"),
              (lt, lambda v, b: v < b, "< {b:g}"), (maximum, lambda v, b: v <= b, "at most {b:g}")]
    for bound, ok, text in bounds:
        if bound is not None and not ok(value, bound):
            problems.append(f"{where}: must be {text.format(b=bound)}, got {value!r}")
            return None
    return value


def _mapping(where: str, value: Any, problems: list[str]) -> dict[str, Any]:
    """A mapping with string keys (else a problem and {})."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{where}: must be a mapping, got {type(value).__name__} {value!r}"[:300])
        return {}
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        problems.append(f"{where}: keys must be text, got {', '.join(repr(k) for k in bad)}")
        return {k: v for k, v in value.items() if isinstance(k, str)}
    return value


def _unknown_keys(where: str, value: dict[str, Any], known: Any, problems: list[str]) -> None:
    unknown = sorted(set(value) - set(known))
    if unknown:
        prefix = "unknown top-level keys" if where == "top level" else f"{where}: unknown keys"
        problems.append(f"{prefix} {unknown}; known: {sorted(known)}")


def _duplicates(where: str, values: list[Any], problems: list[str]) -> None:
    seen: set[str] = set()
    dup: list[str] = []
    for v in values:
        ident = json.dumps(float(v) if _is_number(v) else v, sort_keys=True, default=str)
        if ident in seen and repr(v) not in dup:
            dup.append(repr(v))
        seen.add(ident)
    if dup:
        problems.append(f"{where}: duplicated values {', '.join(dup)} (each trial must be distinct)")


def _delta(value: Any, problems: list[str]) -> float | str | None:
    if isinstance(value, str) and value.replace(" ", "") == "1/(2N)":
        return "1/(2N)"
    if isinstance(value, str):  # "1e-5" quoted: still a number a person meant
        try:
            value = float(value)
        except ValueError:
            problems.append(f"delta: must be a number in (0, 1) or \"1/(2N)\", got {value!r}")
            return None
    delta = _number("delta", value, problems)
    if delta is not None and not 0 < delta < 1:
        problems.append(f"delta: must lie in (0, 1), got {delta:g}")
        return None
    return delta


def _plugins(value: Any, source: str, problems: list[str]) -> list[str]:
    """`plugins:` modules, imported and registered now (so the grid validates their names like built-ins);
    a module not installed is looked for beside the grid file."""
    from workers import plugins as plugins_lib

    names = _as_list(value) if value is not None else []
    folder = [Path(source).parent] if Path(source).is_file() else []
    for name in names:
        try:
            plugins_lib.load([name], search=folder)
        except (mechanisms.PluginError, ImportError) as e:
            problems.append(str(e))
    return [str(n) for n in names]


def mechanism_private(mechanism: str) -> bool:
    """Whether a mechanism claims privacy (unknown names are reported with the grid axis)."""
    try:
        return mechanisms.get(str(mechanism)).private
    except (UnknownName, mechanisms.PluginError):
        return True


def _check_names(kind: str, values: list[Any], lookup: Any, problems: list[str]) -> None:
    for v in values:
        if not isinstance(v, str):
            problems.append(f"grid.{kind}: names are text, got {v!r}")
            continue
        try:
            lookup(v)
        except UnknownName as e:
            problems.append(f"grid.{kind}: {e}")


def _option_problems(axes: dict[str, list[Any]], options: dict[str, Any]) -> list[str]:
    """Every mechanism, model and dataset option checked against its frozen schema (unknown keys, types,
    values), for the names the grid uses; options for names outside the grid are an error too."""
    problems: list[str] = []
    lookups = (("mechanism", "mechanism_options", lambda n, o: mechanisms.get(n).option_problems(o)),
               ("model", "model_options", models.option_problems),
               ("dataset", "dataset_options", datasets.option_problems))
    for axis, key, check in lookups:
        table = options.get(key)
        if not isinstance(table, dict):
            continue
        for name in sorted(set(table) - {str(v) for v in axes[axis]}):
            problems.append(f"{key}: {name!r} is not in grid.{axis}")
        for name in axes[axis]:
            given = table.get(str(name), {})
            if not isinstance(given, dict):
                continue
            try:
                problems += [f"{key}.{p}" for p in check(str(name), given)]
            except UnknownName:
                pass  # reported with the grid axis
    return problems


def _train_checks(where: str, settings: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """Type and range of every train setting (TrainConfig then checks what it knows itself)."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    _unknown_keys(where, settings, fields, problems)
    out = dict(settings)
    ints = {"epochs": 100_000, "batch_size": 1_000_000, "eval_batch_size": 1_000_000,
            "max_train_examples": 1_000_000_000}
    for key, most in ints.items():
        if key in out and not (key == "max_train_examples" and out[key] is None):
            out[key] = _number(f"{where}.{key}", out[key], problems, integer=True, ge=1, maximum=most)
    for key, kw in (("lr", {"gt": 0}), ("clip", {"gt": 0}), ("momentum", {"ge": 0, "lt": 1}),
                    ("weight_decay", {"ge": 0})):
        if key in out:
            out[key] = _number(f"{where}.{key}", out[key], problems, **kw)
    mode = out.get("grad_sample_mode")
    if mode is not None and mode not in GRAD_SAMPLE_MODES:
        problems.append(f"{where}.grad_sample_mode: must be one of {list(GRAD_SAMPLE_MODES)}, got {mode!r}")
    optimizer = out.get("optimizer", "sgd")
    if not isinstance(optimizer, str):
        problems.append(f"{where}.optimizer: must be a name, got {optimizer!r}")
    return out


def _audit_checks(value: Any, problems: list[str]) -> dict[str, Any]:
    audit = _mapping("audit", value, problems)
    _unknown_keys("audit", audit, [f.name for f in dataclasses.fields(AuditConfig)], problems)
    out = dict(audit)
    if "mode" in out and out["mode"] is False:  # `mode: no` or an old YAML 1.1 `off` read as false
        out["mode"] = "off"
    if "enabled" in out and not isinstance(out["enabled"], bool):
        problems.append(f"audit.enabled: must be true or false, got {out['enabled']!r}")
    for key in ("samples", "dim", "canaries"):
        if key in out:
            out[key] = _number(f"audit.{key}", out[key], problems, integer=True, ge=1, maximum=100_000_000)
    return out


def _resources(value: Any, problems: list[str]) -> tuple[Any, Any]:
    resources = _mapping("resources", value, problems)
    _unknown_keys("resources", resources, RESOURCE_KEYS, problems)
    cpus = _number("resources.cpus", resources.get("cpus", 1), problems, gt=0, maximum=1024)
    gpus = resources.get("gpus", "auto")
    if gpus != "auto":
        if _is_number(gpus) or not isinstance(gpus, str):
            gpus = _number("resources.gpus", gpus, problems, ge=0, maximum=64)
        else:
            problems.append(f"resources.gpus: must be 'auto' or a number >= 0, got {gpus!r}")
    return cpus, gpus


def _per_name(key: str, what: str, value: Any, known: Any, problems: list[str]) -> dict[str, dict[str, Any]]:
    """`mechanism_options`-like tables: a known name -> a mapping (the inner keys are the owner's)."""
    if value is not None and not isinstance(value, dict):
        problems.append(f"{key}: must map a {what} to a mapping of settings, got {value!r}"[:300])
        return {}
    table = _mapping(key, value, problems)
    out: dict[str, dict[str, Any]] = {}
    for name, inner in table.items():
        try:
            known(name)
        except UnknownName as e:
            problems.append(f"{key}: {e}")
        if inner is not None and not isinstance(inner, dict):
            problems.append(f"{key}.{name}: must map a {what} to a mapping of settings, got {inner!r}"[:300])
            continue
        out[name] = _mapping(f"{key}.{name}", inner, problems)
    return out


def parse(text: str, *, source: str = "grid") -> GridSpec:
    """Parse and validate a grid's YAML text; raise GridError listing every problem."""
    try:
        raw = grid_yaml.load(text)
    except grid_yaml.GridYamlError as e:
        raise GridError([f"{source}: {e}"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise GridError([f"{source}: YAML syntax error{where}: {getattr(e, 'problem', e)}"]) from None
    except RecursionError:
        raise GridError([f"{source}: the YAML is nested too deeply"]) from None
    if not isinstance(raw, dict):
        raise GridError([f"{source}: a grid file must be a YAML mapping"])
    problems: list[str] = []
    raw = _mapping("grid file", raw, problems)
    _unknown_keys("top level", raw, TOP_LEVEL, problems)
    name = raw.get("name", Path(source).stem)
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        problems.append(f"name: {name!r} must be 1-100 letters, digits, '_', '-' or '.' (starting with a letter "
                        "or digit)")
        name = str(name)
    plugins = _plugins(raw.get("plugins"), source, problems)
    grid = raw.get("grid")
    if not isinstance(grid, dict):
        raise GridError(problems + ["grid: missing or not a mapping of dataset/model/mechanism/epsilon lists"])
    grid = _mapping("grid", grid, problems)
    _unknown_keys("grid", grid, GRID_AXES, problems)
    axes = {a: _as_list(grid.get(a, [])) for a in GRID_AXES}
    for a in GRID_AXES:
        if len(axes[a]) > MAX_AXIS_VALUES:
            problems.append(f"grid.{a}: at most {MAX_AXIS_VALUES} values")
            axes[a] = axes[a][:MAX_AXIS_VALUES]
        _duplicates(f"grid.{a}", axes[a], problems)
    for a in ("dataset", "model", "mechanism"):
        if not axes[a]:
            problems.append(f"grid.{a}: at least one value is needed")
    _check_names("dataset", axes["dataset"], datasets.get_loader, problems)
    _check_names("model", axes["model"], models.get_entry, problems)
    _check_names("mechanism", axes["mechanism"], mechanisms.get, problems)
    private = [m for m in axes["mechanism"] if mechanism_private(m)]
    epsilons: list[float] = []
    for e in axes["epsilon"]:
        value = _number("grid.epsilon", e, problems, gt=0)
        if value is not None:
            epsilons.append(float(value))
    sigma = raw.get("sigma")
    if private and not axes["epsilon"] and sigma is None:
        problems.append("grid.epsilon: private mechanisms need at least one epsilon (or a top-level sigma)")
    if sigma is not None:
        sigma = _number("sigma", sigma, problems, gt=0)
    delta = _delta(raw.get("delta", 1e-5), problems)
    seeds = _as_list(raw.get("seeds", [0]))
    if not seeds:
        problems.append("seeds: at least one seed is needed")
    seeds = [_number("seeds", s, problems, integer=True, ge=0, maximum=SEED_MAX) for s in seeds]
    _duplicates("seeds", [s for s in seeds if s is not None], problems)
    train = _train_checks("train", _mapping("train", raw.get("train"), problems), problems)
    # Overrides: a model's (a from-scratch model wants a larger lr than a pretrained one), then a
    # mechanism's (DP-SGD wants larger batches), each on top of `train`.
    model_train = _per_name("model_train", "model", raw.get("model_train"), models.get_entry, problems)
    mechanism_train = _per_name("mechanism_train", "mechanism", raw.get("mechanism_train"), mechanisms.get, problems)
    model_train = {k: _train_checks(f"model_train.{k}", v, problems) for k, v in model_train.items()}
    mechanism_train = {k: _train_checks(f"mechanism_train.{k}", v, problems) for k, v in mechanism_train.items()}
    for where, settings in [("train", train)] + [(f"{key}.{name}", train | v) for key, table in
                                                 (("model_train", model_train), ("mechanism_train", mechanism_train))
                                                 for name, v in table.items()]:
        if problems:
            break  # TrainConfig would only repeat (less clearly) what is already said
        try:
            TrainConfig(**settings)
        except TypeError as e:
            fields = [f.name for f in dataclasses.fields(TrainConfig)]
            problems.append(f"{where}: {e}; known keys: {fields}")
        except ValueError as e:
            problems.append(f"{where}: {e}")
    accountant = raw.get("accountant", "pld")
    calibrating = [n for n, a in mechanisms.registry.ACCOUNTANTS.items() if a.calibrates]  # incl. plugins
    if accountant not in calibrating:
        problems.append(f"accountant: unknown {accountant!r}; known: {calibrating}")
    calibration = raw.get("calibration", "claimed")
    if not isinstance(calibration, str) or calibration not in mechanisms.plan.CALIBRATIONS:
        problems.append(f"calibration: must be one of {list(mechanisms.plan.CALIBRATIONS)}, got {calibration!r}")
    sampler = raw.get("sampler", "poisson")
    if not isinstance(sampler, str) or sampler not in mechanisms.plan.SAMPLERS:
        problems.append(f"sampler: must be one of {list(mechanisms.plan.SAMPLERS)}, got {sampler!r}")
    cpus, gpus = _resources(raw.get("resources"), problems)
    options = {
        "mechanism_options": _per_name("mechanism_options", "mechanism", raw.get("mechanism_options"),
                                       mechanisms.get, problems),
        "model_options": _per_name("model_options", "model", raw.get("model_options"), models.get_entry, problems),
        "dataset_options": _per_name("dataset_options", "dataset", raw.get("dataset_options"),
                                     datasets.get_loader, problems),
    }
    problems += _option_problems(axes, options)
    secure_rng = raw.get("secure_rng", False)
    if not isinstance(secure_rng, bool):
        problems.append(f"secure_rng: must be true or false, got {secure_rng!r}")
    elif secure_rng and importlib.util.find_spec("torchcsprng") is None:
        problems.append("secure_rng: true needs torchcsprng (Opacus' secure generator), which is not installed")
    audit = _audit_checks(raw.get("audit"), problems)
    try:
        AuditConfig(**audit)
    except (TypeError, ValueError) as e:
        problems.append(f"audit: {e}")
    description = raw.get("description")
    if description is not None and not isinstance(description, str):
        problems.append(f"description: must be text, got {description!r}")
    for d, m in itertools.product(axes["dataset"], axes["model"]):
        try:
            kind = datasets.get_loader(str(d))[0].kind
            if not models.supports(str(m), kind):
                problems.append(f"grid: model {m!r} does not take {kind} data (dataset {d!r})")
        except UnknownName:
            pass
    if problems:
        raise GridError(problems)

    base = {"secure_rng": True} if secure_rng is True else {}
    base |= {"plugins": list(plugins)} if plugins else {}  # the workers import them before the trial
    base |= {"delta": delta, "accountant": accountant, "calibration": calibration, "sampler": sampler,
            "resources": {"cpus": cpus, "gpus": gpus}, "audit": audit}
    configs: list[dict[str, Any]] = []
    for d, m, mech, seed in itertools.product(axes["dataset"], axes["model"], axes["mechanism"], seeds):
        targets: list[float | None] = [None] if not mechanism_private(mech) or not epsilons else list(epsilons)
        for eps in targets:
            cfg = base | {"train": train | model_train.get(m, {}) | mechanism_train.get(mech, {}),
                          "dataset": str(d), "model": str(m), "mechanism": str(mech), "epsilon": eps,
                          "seed": seed, "sigma": sigma if mechanism_private(mech) and eps is None else None,
                          "mechanism_options": options["mechanism_options"].get(mech, {}),
                          "model_options": options["model_options"].get(m, {}),
                          "dataset_options": options["dataset_options"].get(d, {})}
            cfg = {"sweep": name} | cfg
            cfg["trial_key"] = trial_key(cfg)
            configs.append(cfg)
    return GridSpec(name, raw, text, tuple(configs), tuple(plugins))


def load(path: str | Path) -> GridSpec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise GridError([f"{path}: cannot read grid file ({e.strerror})"]) from None
    return parse(text, source=str(path))
