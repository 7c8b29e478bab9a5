"""Grid files: read, check everything up front, then expand the axes into `TrialConfig` objects.

Validation collects every problem before anything runs or is written (exit code 2 in the CLI). Each
setting's bounds live on its dataclass field (workers/config.py); this module reads the file, checks
what only a grid has (its axes, per-name tables, the trial count) and builds the typed trials once.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import itertools
import json
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

import mechanisms
from mechanisms.framework.registry import UnknownName
from orchestrator import grid_yaml
from workers import datasets, models
from workers import plugins as plugins_lib
from workers.config import AuditConfig, ConfigError, Resources, TrainConfig, TrialConfig, parse_delta, section, shown

TOP_LEVEL = {"name", "seeds", "delta", "grid", "train", "accountant", "calibration", "sampler", "audit",
             "resources", "mechanism_options", "model_options", "dataset_options", "description", "sigma",
             "mechanism_train", "model_train", "dataset_train", "secure_rng", "max_trials", "plugins", "tune"}
GRID_AXES = ("dataset", "model", "mechanism", "epsilon")
GRID_KEYS = (*GRID_AXES, "pairs")  # `pairs` lists (dataset, model) pairs instead of crossing the two axes
PAIR_KEYS = ("dataset", "model", "train", "model_options")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
MAX_AXIS_VALUES = 10_000
MAX_TRIALS = 100_000  # a grid's trial count above this needs `max_trials:` (docs/grid.md)
MAX_GRID_BYTES = 1_000_000  # a grid file is small; a larger one is refused before YAML reads it
MAX_PROBLEM_CHARS = 600


class GridError(ValueError):
    """Every problem found in a grid file, one per line."""

    def __init__(self, problems: list[str]) -> None:
        problems = [p if len(p) <= MAX_PROBLEM_CHARS else p[: MAX_PROBLEM_CHARS - 1] + "…" for p in problems]
        super().__init__("\n".join(problems))
        self.problems = problems


class TrialSet(Protocol):
    """What a grid's trials are to whoever reads them: counted, and read in order as often as needed. A large grid's
    are made anew at each pass (`Trials`, `Selected`), a small grid's are kept (a tuple, or a `Trials` that holds
    one); `samples` and `of_mechanisms` read either kind the same way."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[TrialConfig]: ...


@dataclasses.dataclass(frozen=True)
class GridSpec:
    name: str
    raw: dict[str, Any]
    text: str
    trials: TrialSet  # `parse`: a tuple; `parse_lazy`: a `Trials`; a run's `--only` part: a tuple or a `Selected`
    plugins: tuple[str, ...] = ()  # modules the driver imported and ships to the cluster (workers.plugins)


ONLY_AXES = ("dataset", "model", "mechanism", "epsilon", "seed")  # what `sweep run --only AXIS=VALUE` selects by


def select(spec: GridSpec, only: Sequence[str]) -> TrialSet:
    """The trials of `spec` that `--only AXIS=VALUE` selects: values of one axis are alternatives, different
    axes must all match. A grid too long for one sitting runs in parts this way, under its own grid (so no part
    supersedes another). Raises GridError (one problem per bad item) when an item is malformed or selects
    nothing. Of a large grid (`Trials.lazy`) the selection is a `Selected` view, made anew at each pass: one pass
    here finds the values and the count, nothing holds the trials."""
    problems = []
    items = []
    for item in only:
        axis, sep, value = item.partition("=")
        if not sep or axis not in ONLY_AXES or not value:
            problems.append(f"--only {shown(item)}: must be AXIS=VALUE with AXIS one of {', '.join(ONLY_AXES)}")
            continue
        if axis == "epsilon":  # 3, 3.0 and 3e0 name the same target
            try:
                value = str(float(value))
            except ValueError:
                pass
        items.append((axis, value))
    wanted: dict[str, set[str]] = {}
    for axis, value in items:
        wanted.setdefault(axis, set()).add(value)
    values: dict[str, set[str]] = {axis: set() for axis in wanted}
    count = 0
    for trial in spec.trials:  # one pass, whatever the number of items: the values, and the count if all exist
        for axis in wanted:
            values[axis].add(str(getattr(trial, axis)))
        count += Selected.matches(trial, wanted)
    problems += [f"--only {axis}={shown(value)}: no trial of the grid has it (it has "
                 f"{', '.join(sorted(values[axis]))})" for axis, value in items if value not in values[axis]]
    if problems:
        raise GridError(problems)
    if not count:
        raise GridError([f"--only {' '.join(only)}: no trial of the grid has all of these"])
    if isinstance(spec.trials, Trials) and spec.trials.lazy:
        return Selected(spec.trials, wanted, count)
    return tuple(t for t in spec.trials if Selected.matches(t, wanted))


def stored_key(config: Mapping[str, Any]) -> str:
    """The key a stored config has under today's formula (the ledger renames rows keyed by an older
    one); a stored config that no longer parses keeps the key it has."""
    try:
        return TrialConfig.from_dict(config).trial_key
    except ConfigError:
        return str(config.get("trial_key", ""))


# reading ----------------------------------------------------------------------------------------------
def _read_yaml(text: str, source: str) -> dict[str, Any]:
    try:
        raw = grid_yaml.load(text)
    except grid_yaml.GridYamlError as e:
        raise GridError([f"{source}: {e}"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        said = " ".join(str(getattr(e, "problem", None) or e).split())  # a reader error spans two lines
        said = said.replace(' in "<unicode string>",', " at")
        raise GridError([f"{source}: YAML syntax error{where}: {said}"]) from None
    except RecursionError:
        raise GridError([f"{source}: the YAML is nested too deeply"]) from None
    if not isinstance(raw, dict):
        raise GridError([f"{source}: a grid file must be a YAML mapping"])
    return raw


def _mapping(where: str, value: Any, problems: list[str]) -> dict[str, Any]:
    """A mapping with string keys (else a problem and {})."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{where}: must be a mapping, got {type(value).__name__} {shown(value)}")
        return {}
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        problems.append(f"{where}: keys must be text, got {', '.join(shown(k) for k in bad)}")
        return {k: v for k, v in value.items() if isinstance(k, str)}
    return value


def _unknown_keys(where: str, value: dict[str, Any], known: Any, problems: list[str]) -> None:
    unknown = sorted(set(value) - set(known))
    if unknown:
        prefix = "unknown top-level keys" if where == "top level" else f"{where}: unknown keys"
        problems.append(f"{prefix} [{', '.join(shown(k, 40) for k in unknown[:10])}]"
                        f"{' and more' if len(unknown) > 10 else ''}; known: {sorted(known)}")


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _duplicates(where: str, values: list[Any], problems: list[str]) -> None:
    seen: set[str] = set()
    dup: list[str] = []
    for v in values:
        ident = json.dumps(float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v,
                           sort_keys=True, default=str)
        if ident in seen and shown(v) not in dup:
            dup.append(shown(v))
        seen.add(ident)
    if dup:
        problems.append(f"{where}: duplicated values {', '.join(dup[:10])} (each trial must be distinct)")


def _field_problem(cls: type, field: str, where: str, value: Any) -> str | None:
    """`value` checked against the bounds `cls.field` declares (workers/config.py)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == field)
    return f.metadata["bounds"].problem(where, value, "int" in str(f.type).split(" | "))


# the axes ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Axes:
    datasets: list[str]  # every dataset the grid uses, in order of first use
    models: list[str]
    mechanisms: list[str]
    epsilons: list[float]
    seeds: list[int]
    private: frozenset[str]  # the mechanisms that add noise (they take an epsilon or a sigma)
    # the (dataset, model) pairs trained: `grid.pairs` as listed, else the cross product of the two axes
    pairs: list[tuple[str, str]]
    # a pair's own `train` settings, with where they were given (`grid.pairs[3].train`)
    pair_train: dict[tuple[str, str], tuple[str, dict[str, Any]]]
    # a pair's own model options (over `model_options[model]`), with where they were given
    pair_model_options: dict[tuple[str, str], tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)

    def count(self) -> int:
        """Trials the grid expands to, counted without expanding it."""
        per_seed = sum(len(self.epsilons) if m in self.private and self.epsilons else 1 for m in self.mechanisms)
        return len(self.pairs) * per_seed * len(self.seeds)


def _names(kind: str, values: list[Any], lookup: Callable[[str], Any], problems: list[str],
           where: str | None = None) -> list[str]:
    where = f"{where}.{kind}" if where else f"grid.{kind}"
    good = []
    for v in values:
        if not isinstance(v, str) or not v or len(v) > 200:
            problems.append(f"{where}: names are text of 1-200 characters, got {shown(v)}")
            continue
        try:
            lookup(v)
            good.append(v)
        except UnknownName as e:
            problems.append(f"{where}: {e}")
    return good


def _numbers(where: str, field: str, values: list[Any], problems: list[str]) -> list[Any]:
    out = []
    for v in values:
        if isinstance(v, float) and v.is_integer() and field == "seed":
            v = int(v)
        if problem := _field_problem(TrialConfig, field, where, v):
            problems.append(problem)
        else:
            out.append(v)
    return out


def mechanism_private(name: str) -> bool:
    """Whether a mechanism claims privacy (`Mechanism.private`, read, never decided here); unknown names are
    reported with the axis."""
    try:
        return bool(mechanisms.get(name).private)
    except (UnknownName, mechanisms.PluginError):
        return True


def _plugins(raw: dict[str, Any], source: str, problems: list[str]) -> tuple[str, ...]:
    """`plugins:` modules, imported and registered now (so the grid validates their names like built-ins);
    a module not installed is looked for beside the grid file."""
    value = raw.get("plugins")
    names = _as_list(value) if value is not None else []
    folder = [Path(source).parent] if Path(source).is_file() else []
    for name in names:
        try:
            plugins_lib.load([name], search=folder)
        except (mechanisms.PluginError, ImportError) as e:
            problems.append(str(e))
    return tuple(str(n) for n in names)


PairSettings = dict[tuple[str, str], tuple[str, dict[str, Any]]]


def _pairs(value: Any, problems: list[str]) -> tuple[list[tuple[str, str]], PairSettings, PairSettings]:
    """`grid.pairs`: a list of {dataset, model} mappings (each with an optional `train` and `model_options` of
    its own), both names known and each pair listed once."""
    if not isinstance(value, list) or not value:
        problems.append(f"grid.pairs: must be a non-empty list of {{dataset: NAME, model: NAME}} mappings, "
                        f"got {shown(value)}")
        return [], {}, {}
    if len(value) > MAX_AXIS_VALUES:
        problems.append(f"grid.pairs: at most {MAX_AXIS_VALUES} pairs, got {len(value)}")
        value = value[:MAX_AXIS_VALUES]
    pairs: list[tuple[str, str]] = []
    train: PairSettings = {}
    model_options: PairSettings = {}
    for i, entry in enumerate(value):
        where = f"grid.pairs[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: must be a mapping {{dataset: NAME, model: NAME}}, got {shown(entry)}")
            continue
        entry = _mapping(where, entry, problems)
        _unknown_keys(where, entry, PAIR_KEYS, problems)
        missing = [k for k in ("dataset", "model") if k not in entry]
        if missing:
            problems.append(f"{where}: needs {' and '.join(missing)}")
            continue
        d = _names("dataset", [entry["dataset"]], datasets.get_loader, problems, where)
        m = _names("model", [entry["model"]], models.get_entry, problems, where)
        if not (d and m):
            continue
        if (d[0], m[0]) in pairs:
            problems.append(f"{where}: the pair ({d[0]}, {m[0]}) is listed twice (each trial must be distinct)")
            continue
        pairs.append((d[0], m[0]))
        for key, table in (("train", train), ("model_options", model_options)):
            if entry.get(key) is not None:
                table[d[0], m[0]] = (f"{where}.{key}", _mapping(f"{where}.{key}", entry[key], problems))
    return pairs, train, model_options


def _axes(raw: dict[str, Any], problems: list[str]) -> Axes:
    grid = raw.get("grid")
    if not isinstance(grid, dict):
        raise GridError(problems + ["grid: missing or not a mapping of dataset/model/mechanism/epsilon lists "
                                    "(or pairs)"])
    grid = _mapping("grid", grid, problems)
    _unknown_keys("grid", grid, GRID_KEYS, problems)
    paired = "pairs" in grid
    if paired and ("dataset" in grid or "model" in grid):
        problems.append("grid.pairs replaces grid.dataset and grid.model: list each (dataset, model) pair, "
                        "or the two axes to cross, not both")
    axes = ("mechanism", "epsilon") if paired else GRID_AXES
    values = {a: _as_list(grid.get(a, [])) for a in axes} | {"seeds": _as_list(raw.get("seeds", [0]))}
    for a, vs in values.items():
        where = "seeds" if a == "seeds" else f"grid.{a}"
        if len(vs) > MAX_AXIS_VALUES:
            problems.append(f"{where}: at most {MAX_AXIS_VALUES} values, got {len(vs)}")
            values[a] = vs[:MAX_AXIS_VALUES]
        _duplicates(where, values[a], problems)
        if not values[a] and a != "epsilon":
            problems.append(f"{where}: at least one value is needed")
    if paired:
        pairs, pair_train, pair_options = _pairs(grid["pairs"], problems)
        names = [list(dict.fromkeys(d for d, _ in pairs)), list(dict.fromkeys(m for _, m in pairs))]
    else:
        names = [_names("dataset", values["dataset"], datasets.get_loader, problems),
                 _names("model", values["model"], models.get_entry, problems)]
        pairs, pair_train, pair_options = list(itertools.product(*names)), {}, {}
    names.append(_names("mechanism", values["mechanism"], mechanisms.get, problems))
    epsilons = [float(e) for e in _numbers("grid.epsilon", "epsilon", values["epsilon"], problems)]
    seeds = _numbers("seeds", "seed", values["seeds"], problems)
    return Axes(*names, epsilons, seeds, frozenset(m for m in names[2] if mechanism_private(m)), pairs, pair_train,
                pair_options)


def _trial_count(raw: dict[str, Any], axes: Axes, problems: list[str]) -> None:
    """Refuse a grid larger than `max_trials` (default MAX_TRIALS) before building any trial."""
    limit = raw.get("max_trials", MAX_TRIALS)
    if problem := _field_problem(TrialConfig, "seed", "max_trials", limit):  # a non-negative integer
        problems.append(problem)
        limit = MAX_TRIALS
    count = axes.count()
    if count > limit:
        problems.append(f"grid: {count:,} trials is more than the limit of {limit:,}; raise it with "
                        f"`max_trials: {count}` if you mean it, or shrink the axes")


# settings shared by every trial ------------------------------------------------------------------------
def _section(cls: type, value: Any, owner: str, problems: list[str]) -> Any:
    try:
        return section(cls, value, owner)
    except ConfigError as e:
        problems.extend(e.problems)
        return None


def _shared(raw: dict[str, Any], axes: Axes, problems: list[str]) -> dict[str, Any]:
    """The grid's top-level settings as the `TrialConfig` fields every trial shares (sigma: every private trial
    without a target), each checked once against its field's bounds. No type of their own: a trial's privacy
    setting is its `TrialConfig`'s."""
    scalars = {"delta": parse_delta(raw.get("delta", 1e-5)), "sigma": raw.get("sigma"),
               "accountant": raw.get("accountant", "pld"), "calibration": raw.get("calibration", "claimed"),
               "sampler": raw.get("sampler", "poisson")}
    for key, value in scalars.items():
        if problem := _field_problem(TrialConfig, key, key, value):
            problems.append(problem)
    if scalars["sigma"] is not None and axes.epsilons:
        problems.append("sigma and grid.epsilon are exclusive: list target epsilons (sigma is calibrated to each) "
                        "or give one noise multiplier sigma, not both")
    if axes.private and not axes.epsilons and scalars["sigma"] is None:
        problems.append("grid.epsilon: private mechanisms need at least one epsilon (or a top-level sigma)")
    secure_rng = raw.get("secure_rng", False)
    if not isinstance(secure_rng, bool):
        problems.append(f"secure_rng: must be true or false, got {shown(secure_rng)}")
    elif secure_rng and importlib.util.find_spec("torchcsprng") is None:
        problems.append("secure_rng: true needs torchcsprng (Opacus' secure generator), which is not installed")
    description = raw.get("description")
    if description is not None and not isinstance(description, str):
        problems.append(f"description: must be text, got {shown(description)}")
    return scalars | {"secure_rng": secure_rng is True,
                      "audit": _section(AuditConfig, raw.get("audit"), "audit", problems),
                      "resources": _section(Resources, raw.get("resources"), "resources", problems)}


def _per_name(key: str, what: str, value: Any, known: Callable[[str], Any],
              problems: list[str]) -> dict[str, dict[str, Any]]:
    """`mechanism_options`-like tables: a known name -> a mapping (the inner keys are the owner's)."""
    if value is not None and not isinstance(value, dict):
        problems.append(f"{key}: must map a {what} to a mapping of settings, got {shown(value)}")
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name, inner in _mapping(key, value, problems).items():
        try:
            known(name)
        except UnknownName as e:
            problems.append(f"{key}: {e}")
        if inner is not None and not isinstance(inner, dict):
            problems.append(f"{key}.{name}: must map a {what} to a mapping of settings, got {shown(inner)}")
            continue
        out[name] = _mapping(f"{key}.{name}", inner, problems)
    return out


def _train(raw: dict[str, Any], axes: Axes,
           problems: list[str]) -> dict[tuple[str, str, str], TrainConfig]:
    """The train settings of each (dataset, model, mechanism), each table overriding the ones before it:
    `train`; the dataset's (`dataset_train`: its size sets the batch and the epochs); the model's
    (`model_train`: a from-scratch model wants a larger lr than a pretrained one); the pair's own
    (`grid.pairs[i].train`: a published setting names its dataset and model); the mechanism's
    (`mechanism_train`: DP-SGD wants larger batches)."""
    base = raw.get("train")
    tables = {"dataset_train": _per_name("dataset_train", "dataset", raw.get("dataset_train"), datasets.get_loader,
                                         problems),
              "model_train": _per_name("model_train", "model", raw.get("model_train"), models.get_entry, problems),
              "mechanism_train": _per_name("mechanism_train", "mechanism", raw.get("mechanism_train"),
                                           mechanisms.get, problems)}
    _section(TrainConfig, base, "train", problems)
    base = _mapping("train", base, [])
    for key, table in tables.items():
        for name, settings in table.items():
            _section(TrainConfig, base | settings, f"{key}.{name}", problems)
    for where, settings in axes.pair_train.values():
        _section(TrainConfig, base | settings, where, problems)
    if problems:
        return {}  # each combination would only repeat what is already said
    out = {}
    for (d, m), mech in itertools.product(axes.pairs, axes.mechanisms):
        settings = (base | tables["dataset_train"].get(d, {}) | tables["model_train"].get(m, {})
                    | axes.pair_train.get((d, m), ("", {}))[1] | tables["mechanism_train"].get(mech, {}))
        out[d, m, mech] = cfg = _section(TrainConfig, settings, f"train of {m} on {d} with {mech}", problems)
        if cfg is not None and cfg.augmult > 1 and (kind := datasets.get_loader(d)[0].kind) != "image":
            problems.append(f"train of {m} on {d}: augmult crops and flips images, dataset {d!r} is {kind}")
    return out


def _options(raw: dict[str, Any], axes: Axes, problems: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """Every mechanism, model and dataset option checked against its owner's schema, for the names the
    grid uses; options for names outside the grid are an error too. A model's or dataset's schema is read
    off its builder's signature, which imports the builder (torch): only where the grid gives options, so
    that validating a grid stays light (a required option left out fails the trial, with its message)."""
    tables = (("mechanism", "mechanism_options", mechanisms.get, lambda n, o: mechanisms.get(n).option_problems(o),
               axes.mechanisms),
              ("model", "model_options", models.get_entry, models.option_problems, axes.models),
              ("dataset", "dataset_options", datasets.get_loader, datasets.option_problems, axes.datasets))
    out = {}
    for axis, key, known, check, used in tables:
        table = out[key] = _per_name(key, axis, raw.get(key), known, problems)
        for name in sorted(set(table) - set(used)):
            problems.append(f"{key}: {shown(name)} is not in grid.{axis}")
        for name in used:
            if axis != "mechanism" and name not in table:
                continue
            try:
                problems += [f"{key}.{p}" for p in check(name, table.get(name, {}))]
            except UnknownName:
                pass  # reported with the grid axis
    for (_, m), (where, given) in axes.pair_model_options.items():  # a pair's own, over the model's
        try:
            problems += [f"{where}: {p}" for p in models.option_problems(m, out["model_options"].get(m, {}) | given)]
        except UnknownName:
            pass
    return out


def _compatible(axes: Axes, problems: list[str]) -> None:
    for d, m in axes.pairs:
        kind = datasets.get_loader(d)[0].kind
        if not models.supports(m, kind):
            problems.append(f"grid: model {m!r} does not take {kind} data (dataset {d!r})")


def _name(raw: dict[str, Any], source: str, problems: list[str]) -> str:
    name = raw.get("name", Path(source).stem)
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        problems.append(f"name: {shown(name)} must be 1-100 letters, digits, '_', '-' or '.' (starting with a "
                        "letter or digit)")
        return str(name)[:100]
    return name


# expansion --------------------------------------------------------------------------------------------
def _expand(name: str, axes: Axes, shared: dict[str, Any], train: dict[tuple[str, str, str], TrainConfig],
            options: dict[str, dict[str, dict[str, Any]]], plugins: tuple[str, ...]) -> Iterator[TrialConfig]:
    code = functools.cache(plugins_lib.code_of)  # one provenance per component, not per trial (10^6 trials)
    common = {k: v for k, v in shared.items() if k != "sigma"}
    for (d, m), mech, seed in itertools.product(axes.pairs, axes.mechanisms, axes.seeds):
        private = mech in axes.private
        train_cfg = train[d, m, mech]
        for eps in list(axes.epsilons) if private and axes.epsilons else [None]:
            yield TrialConfig(
                sweep=name, dataset=d, model=m, mechanism=mech, epsilon=eps, seed=seed,
                sigma=shared["sigma"] if private and eps is None else None, **common, train=train_cfg,
                mechanism_options=options["mechanism_options"].get(mech, {}),
                model_options=options["model_options"].get(m, {}) | axes.pair_model_options.get((d, m), ("", {}))[1],
                dataset_options=options["dataset_options"].get(d, {}), plugins=plugins,
                code=code(mech, m, d, shared["accountant"]))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckedGrid:
    """A checked grid whose trials are made one at a time (`trials()`): what `--dry-run` prints, so a grid
    of 10^6 trials shows its first line in seconds and in little memory. `count` is known without
    expanding (None for a `tune:` grid, whose candidates are drawn per cell). `samples()` makes one trial
    per (dataset, model, mechanism): everything but the target and the seed (resources, plugin code, train
    settings) is the same for the others of its combination, so checks of those need not make every trial."""

    name: str
    count: int | None
    make: Callable[[], Iterator[TrialConfig]]
    raw: dict[str, Any]
    plugins: tuple[str, ...] = ()
    make_samples: Callable[[], Iterator[TrialConfig]] | None = None
    make_of: Callable[[Collection[str]], Iterator[TrialConfig]] | None = None

    def trials(self) -> Iterator[TrialConfig]:
        return self.make()

    def trials_of(self, mechanisms: Collection[str]) -> Iterator[TrialConfig]:
        """The trials of these mechanisms only, in the grid's order, the others not made at all."""
        if self.make_of is not None:
            return self.make_of(mechanisms)
        return (t for t in self.make() if t.mechanism in mechanisms)

    def samples(self) -> Iterator[TrialConfig]:
        return (self.make_samples or self.make)()


MATERIALISE = 20_000  # a grid up to this many trials keeps its trials as a tuple once made (`Trials`)


class Trials(Sequence[TrialConfig]):
    """A grid's trials as a sequence that is made, not stored, when the grid is large: `len` is known from the
    axes, each iteration makes the trials again one at a time (about 0.1 ms each), and nothing holds them all (a
    grid of 10^6 trials would take 0.7 GB as a tuple). A grid of at most `MATERIALISE` trials (or a `tune:` grid,
    whose count is known only once drawn) is made once and kept as a tuple: small grids behave as before.
    `lazy`: whether this one is made anew at each pass (the sweep driver then streams them)."""

    def __init__(self, checked: CheckedGrid) -> None:
        self._grid = checked
        self._kept: tuple[TrialConfig, ...] | None = None
        if checked.count is None or checked.count <= MATERIALISE:
            self._kept = tuple(checked.trials())

    @property
    def lazy(self) -> bool:
        return self._kept is None

    def __len__(self) -> int:
        return len(self._kept) if self._kept is not None else int(self._grid.count or 0)

    def __iter__(self) -> Iterator[TrialConfig]:
        return iter(self._kept) if self._kept is not None else self._grid.trials()

    def __getitem__(self, index: Any) -> Any:
        if self._kept is not None:
            return self._kept[index]
        if isinstance(index, slice):
            return tuple(itertools.islice(self, *index.indices(len(self))))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return next(itertools.islice(self, index, None))

    def __eq__(self, other: object) -> bool:  # defining it leaves the class unhashable, as a list is
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    def of(self, mechanisms: Collection[str]) -> Iterator[TrialConfig]:
        """The trials of these mechanisms, in order (of a large grid, the others are not made)."""
        if self._kept is not None:
            return (t for t in self._kept if t.mechanism in mechanisms)
        return self._grid.trials_of(mechanisms)

    def samples(self) -> Sequence[TrialConfig]:
        """One trial per (dataset, model, mechanism) for a large grid (`CheckedGrid.samples`), every trial for a
        small one: what checks of resources and plugin code look at."""
        return self._kept if self._kept is not None else tuple(self._grid.samples())


class Selected:
    """The `--only` part of a large grid's `Trials`, as lazy as they are: each pass makes the grid's trials again
    and keeps those every wanted axis matches; `count` is their number (`select` counts them as it checks). A
    `TrialSet`: counted and read in order, not indexed (the n-th would cost a pass over the grid)."""

    lazy = True

    def __init__(self, trials: Trials, wanted: Mapping[str, set[str]], count: int) -> None:
        self._trials, self._wanted, self._count = trials, dict(wanted), count

    @staticmethod
    def matches(trial: TrialConfig, wanted: Mapping[str, set[str]]) -> bool:
        return all(str(getattr(trial, axis)) in values for axis, values in wanted.items())

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[TrialConfig]:
        return (t for t in self._trials if self.matches(t, self._wanted))

    def of(self, mechanisms: Collection[str]) -> Iterator[TrialConfig]:
        """Its trials of these mechanisms, in order (the grid's other mechanisms are not made)."""
        return (t for t in self._trials.of(mechanisms) if self.matches(t, self._wanted))

    def samples(self) -> Sequence[TrialConfig]:
        return self._trials.samples()


def samples(trials: TrialSet) -> Sequence[TrialConfig]:
    """What checks of resources, memory and plugin code look at: one trial per (dataset, model, mechanism) of a
    large grid (`CheckedGrid.samples`; the others of a combination differ only in target and seed), every trial of a
    kept one."""
    return trials.samples() if isinstance(trials, Trials | Selected) else tuple(trials)


def of_mechanisms(trials: TrialSet, mechanisms: Collection[str]) -> Iterator[TrialConfig]:
    """The trials of these mechanisms, in order (of a large grid, the others are not made)."""
    if isinstance(trials, Trials | Selected):
        return trials.of(mechanisms)
    return (t for t in trials if t.mechanism in mechanisms)


def check(text: str, *, source: str = "grid") -> CheckedGrid:
    """Parse and validate a grid's YAML text (every problem raised as a GridError, as `parse` does) without
    building its trials."""
    problems: list[str] = []
    raw = _mapping("grid file", _read_yaml(text, source), problems)
    _unknown_keys("top level", raw, TOP_LEVEL, problems)
    name = _name(raw, source, problems)
    plugins = _plugins(raw, source, problems)
    axes = _axes(raw, problems)
    _trial_count(raw, axes, problems)
    shared = _shared(raw, axes, problems)
    options = _options(raw, axes, problems)
    _compatible(axes, problems)
    train = _train(raw, axes, problems)
    tune = None
    if "tune" in raw:  # the tuning accountant (dp-accounting) is imported only for a grid that tunes
        from orchestrator import tune_block  # lazy: keeps grid validation light

        tune = tune_block.grid_spec(raw, axes, options, problems)
    if problems:
        raise GridError(problems)

    def make() -> Iterator[TrialConfig]:
        trials = _expand(name, axes, shared, train, options, plugins)
        return tune_block.expand(trials, tune) if tune else trials

    def samples() -> Iterator[TrialConfig]:
        return _expand(name, dataclasses.replace(axes, seeds=axes.seeds[:1], epsilons=axes.epsilons[:1]), shared,
                       train, options, plugins)

    def make_of(mechanisms: Collection[str]) -> Iterator[TrialConfig]:
        chosen = [m for m in axes.mechanisms if m in mechanisms]
        return _expand(name, dataclasses.replace(axes, mechanisms=chosen), shared, train, options, plugins)

    return CheckedGrid(name=name, count=None if tune else axes.count(), make=make, raw=raw, plugins=plugins,
                       make_samples=None if tune else samples, make_of=None if tune else make_of)


def parse(text: str, *, source: str = "grid") -> GridSpec:
    """Parse and validate a grid's YAML text; raise GridError listing every problem."""
    checked = check(text, source=source)
    return GridSpec(checked.name, checked.raw, text, tuple(checked.trials()), checked.plugins)


def parse_lazy(text: str, *, source: str = "grid") -> GridSpec:
    """`parse`, with the trials a `Trials` sequence: a large grid's are made as they are read, never all held
    (what `sweep run` uses: a grid of 10^6 trials is checked in a fraction of a second)."""
    checked = check(text, source=source)
    return GridSpec(checked.name, checked.raw, text, Trials(checked), checked.plugins)


def load_lazy(path: str | Path) -> GridSpec:
    """`load` with `parse_lazy`."""
    return parse_lazy(read(path), source=str(Path(path)))


def read(path: str | Path) -> str:
    """A grid file's text (UTF-8, at most MAX_GRID_BYTES); GridError otherwise."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_GRID_BYTES + 1)
    except OSError as e:
        raise GridError([f"{path}: cannot read grid file ({e.strerror})"]) from None
    if len(data) > MAX_GRID_BYTES:
        raise GridError([f"{path}: a grid file is at most {MAX_GRID_BYTES:,} bytes; this one is larger "
                         "(list the axes' values, not the trials)"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GridError([f"{path}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start}); "
                         "save the grid file as UTF-8"]) from None


def load(path: str | Path) -> GridSpec:
    """Read a grid file (UTF-8, at most MAX_GRID_BYTES) and parse it."""
    return parse(read(path), source=str(Path(path)))


__all__ = ["CheckedGrid", "GridError", "GridSpec", "MAX_TRIALS", "Selected", "TrialSet", "Trials", "load", "load_lazy",
           "check", "of_mechanisms", "parse", "parse_lazy", "read", "samples", "stored_key"]
