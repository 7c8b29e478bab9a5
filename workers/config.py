"""A trial's configuration as typed, frozen objects, checked once with one set of bounds.

The grid (orchestrator/grid.py) expands its axes into `TrialConfig` objects; the driver sends them to
the workers as they are, and the ledger and MLflow store `to_dict()`. Every bound a setting has is
declared once, on its dataclass field (`bounded`), and checked when the object is made, so the grid,
a notebook and a worker cannot disagree about what is valid.

This module imports no torch, Ray or MLflow: validating a grid must be quick.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from mechanisms.accounting.validation import SIGMA_FLOOR, require_delta
from mechanisms.framework.claims import AUDIT_SIGNIFICANCE, CALIBRATIONS
from mechanisms.framework.options import OptionsError, parse
from mechanisms.parts.clipping import GRAD_SAMPLE_MODES

T = TypeVar("T")

ECHO_CHARS = 80  # how much of a bad value an error message repeats
SEED_MAX = 2**32 - 1  # numpy's seeds
INT_MAX = 2**63 - 1  # the largest integer a setting holds (orchestrator/grid_yaml.py refuses larger ones)
OPTIMIZERS = ("sgd", "adam", "adamw")  # workers/train.py builds each
PRECISIONS = ("fp32", "bf16", "fp16")  # workers/acceleration.py runs each
COMPILABLE_MODES = ("bk",)  # private grad-sample modes the compiled step supports (non-private always)
AUDIT_MODES = ("step", "one-run", "both", "off")
MIAS = ("loss", "off")
STATISTICS = ("lr", "sum")


class ConfigError(ValueError):
    """Every problem with a configuration, one per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def shown(value: Any, limit: int = ECHO_CHARS) -> str:
    """`repr(value)` cut to about `limit` characters: an error line echoes what was given, not 10 KB of it."""
    if isinstance(value, int) and value.bit_length() > 256:  # repr of a 5,000-digit int raises, and says nothing
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text)} characters)"


def number_text(value: float) -> str:
    """A bound as a person writes it: integers as integers (4294967295, not 4.29497e+09)."""
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e16):
        return str(int(value))
    return f"{value:g}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeltaRule:
    """A delta stated as a rule of the training set's size N rather than a number: `1/(2N)`, N the training
    examples the trial actually uses. A grid writes it as text; it is parsed once, when the trial's config is
    made (`parse_delta`), and resolved to a number where N is known (`TrialConfig.delta_for`, in the worker).
    Records and keys hold its text, as the grid wrote it."""

    TEXT: ClassVar[str] = "1/(2N)"

    def resolve(self, dataset_size: int) -> float:
        return 1 / (2 * dataset_size)

    def __str__(self) -> str:
        return self.TEXT


DELTA_PER_N = DeltaRule()


def parse_delta(value: Any) -> Any:
    """A delta as written into its type: the rule's text (`1 / (2N)`, spaces aside) is `DELTA_PER_N`, a quoted
    number (`"1e-5"`) is the number a person meant; anything else is returned as it is, for `delta_problem`."""
    if isinstance(value, str) and value.replace(" ", "") == DeltaRule.TEXT:
        return DELTA_PER_N
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def delta_problem(name: str, value: Any) -> str | None:
    """What is wrong with a parsed delta (None: nothing): the rule, or a number whose range `require_delta`,
    the one range check of delta, accepts."""
    if isinstance(value, DeltaRule):
        return None
    if not _is_number(value) or (isinstance(value, int) and abs(value) > INT_MAX):
        return f"{name} must be {DeltaRule.TEXT!r} or a number, got {shown(value)}"
    try:
        require_delta(value, name=name)
    except ValueError as e:
        return str(e)
    return None


@dataclasses.dataclass(frozen=True)
class Bounds:
    """What one field accepts: a range for numbers, a list of names (or a function giving it, for lists
    that live in other modules), and words allowed beside numbers (`auto`)."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    most: float | None = None
    choices: tuple[str, ...] | Callable[[], Any] | None = None
    words: tuple[str, ...] = ()
    rule: Callable[[str, Any], str | None] | None = None  # a field with its own check (delta: `delta_problem`)

    def problem(self, name: str, value: Any, integer: bool = False) -> str | None:
        if self.rule is not None:
            return self.rule(name, value)
        if value is None or (isinstance(value, str) and value in self.words):
            return None
        if self.choices is not None:
            known = tuple(self.choices() if callable(self.choices) else self.choices)
            return None if value in known else f"{name} must be one of {list(known)}, got {shown(value)}"
        if not _is_number(value):
            allowed = " or ".join([*(repr(w) for w in self.words), "a number"])
            return f"{name} must be {allowed}, got {shown(value)}"
        if isinstance(value, float) and not math.isfinite(value):  # (an int is finite, and too large for isfinite)
            return f"{name} must be finite, got {shown(value)}"
        if integer and not isinstance(value, int):
            return f"{name} must be an integer, got {shown(value)}"
        for bound, ok, text in ((self.gt, value > (self.gt or 0), ">"), (self.ge, value >= (self.ge or 0), ">="),
                                (self.lt, value < (self.lt or 0), "<"),
                                (self.most, value <= (self.most or 0), "at most")):
            if bound is not None and not ok:
                return f"{name} must be {text} {number_text(bound)}, got {shown(value)}"
        if isinstance(value, int) and abs(value) > INT_MAX:
            return f"{name} must be a 64-bit number, got {shown(value)}"
        return None


def bounded(default: Any, **bounds: Any) -> Any:
    """A dataclass field with its bounds (checked by `check`, from `__post_init__`)."""
    return dataclasses.field(default=default, metadata={"bounds": Bounds(**bounds)})


def field_problems(obj: Any) -> list[str]:
    """Every field outside its bounds; a field annotated `int` must hold an integer."""
    return [p for f in dataclasses.fields(obj) if (b := f.metadata.get("bounds"))
            and (p := b.problem(f.name, getattr(obj, f.name), "int" in str(f.type).split(" | ")))]


def check(obj: Any) -> None:
    """Give a float field's integer its type (`lr=1` is `lr=1.0`: one setting, one trial key), then raise
    ValueError naming every field of `obj` outside its bounds."""
    for key, value in _typed_numbers(type(obj), {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
                                     ).items():
        if type(value) is not type(getattr(obj, key)):
            object.__setattr__(obj, key, value)
    if problems := field_problems(obj):
        raise ValueError("; ".join(problems))


def _samplers() -> Any:
    # lazy: keeps import workers.config light
    from mechanisms.parts.batch_selection import SAMPLERS  # imported when checked, not with this module

    return SAMPLERS


def _grad_sample_modes() -> Any:
    return GRAD_SAMPLE_MODES


def _accountants() -> list[str]:
    """The accountants that can calibrate (built-ins and plugins), from their registry."""
    from mechanisms.framework.registry import ACCOUNTANTS  # lazy: heavy (numpy)

    return [name for name, accountant in ACCOUNTANTS.items() if accountant.calibrates]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Grid key `train` (and its `model_train` / `mechanism_train` overrides)."""

    epochs: int = bounded(2, ge=1, most=100_000)
    batch_size: int = bounded(256, ge=1, most=1_000_000)
    lr: float = bounded(0.1, gt=0, most=1_000)  # larger only overflows the arithmetic of a step
    optimizer: str = bounded("sgd", choices=OPTIMIZERS)
    momentum: float = bounded(0.0, ge=0, lt=1)
    weight_decay: float = bounded(0.0, ge=0, most=1_000)
    clip: float = bounded(1.0, gt=0, most=1e6)
    max_train_examples: int | None = bounded(None, ge=1, most=1_000_000_000)
    max_test_examples: int | None = bounded(None, ge=1, most=1_000_000_000)  # a smoke run's evaluation
    eval_batch_size: int = bounded(1024, ge=1, most=1_000_000)
    # bk (mechanisms/clipping_engine) or an Opacus mode; None: the model's default
    grad_sample_mode: str | None = bounded(None, choices=_grad_sample_modes)
    precision: str = bounded("fp32", choices=PRECISIONS)  # autocast dtype of the forward and backward passes
    compile: bool = False  # torch.compile the module (bk and non-private only; workers/acceleration.py)
    # augmentation with multiplicity (De et al. 2022): each drawn image cropped and flipped K times, the K
    # gradients averaged before clipping (mechanisms/parts/grouping.py); 1: the records as they are
    augmult: int = bounded(1, ge=1, most=256)

    def __post_init__(self) -> None:
        check(self)
        problems = step_problems(self.precision, self.compile, self.grad_sample_mode)
        if self.augmult > 1 and (self.grad_sample_mode == "ghost" or self.compile or self.precision != "fp32"):
            problems.append(f"augmult {self.augmult} clips each record's copies together (grad_sample_mode bk, hooks, "
                            "functorch or ew; fp32; no compile)")
        if problems:
            raise ValueError("; ".join(problems))


def step_problems(precision: str, compile_step: Any, grad_sample_mode: str | None) -> list[str]:
    """Settings of the training step that cannot go together, whatever the device: a narrow precision needs
    the book-keeping engine (per-sample norms in fp32; Opacus' modes would clip with narrow norms), and the
    compiled step supports only it among the private modes (workers/acceleration.py says why)."""
    problems = []
    if not isinstance(compile_step, bool):
        problems.append(f"compile must be true or false, got {shown(compile_step)}")
    if precision != "fp32" and grad_sample_mode not in (None, "bk"):
        problems.append(f"precision {precision} needs grad_sample_mode bk (per-sample norms in fp32); "
                        f"Opacus' {grad_sample_mode} would clip with {precision} norms")
    if compile_step and grad_sample_mode not in (None, *COMPILABLE_MODES):
        problems.append(f"compile: true supports grad_sample_mode bk only, got {grad_sample_mode}")
    return problems


@dataclasses.dataclass(frozen=True, kw_only=True)
class AuditConfig:
    """Grid key `audit`. `canaries: auto` (see `canaries_for`) takes up to 25 canaries per trainable
    coordinate, as many as a simulation says help (docs/auditing.md)."""

    mode: str = bounded("step", choices=AUDIT_MODES)
    samples: int = bounded(20_000, ge=4, most=100_000_000)  # the one-step audit needs a few per world
    dim: int = bounded(1_000, ge=1, most=100_000_000)
    canaries: int | str = bounded("auto", ge=1, most=100_000_000, words=("auto",))
    enabled: bool = True
    # white-box score of a gradient canary: likelihood ratio across steps, or sum
    statistic: str = bounded("lr", choices=STATISTICS)
    max_canaries: int = bounded(50_000, ge=1, most=100_000_000)
    # Input canaries of the one-run audit (examples through the data, the model and the loss; `input_canaries_for`):
    # `auto`, a count, or 0 (off). They run with the one-run audit.
    input_canaries: int | str = bounded("auto", ge=0, most=1_000_000, words=("auto",))
    ceiling: bool = True  # simulate the certified mechanism under the same analysis
    family_bounds: bool = True  # the curve-family and noise-measurement bounds (white_box.curve_bound, noise_bound)
    # The curve-family search refines its bound for at most this share of the run's training time (at least
    # 1 s): each step is a PLD of the whole run, and the audits should cost a few percent of training.
    family_budget: float = bounded(0.02, ge=0)
    mia: str = bounded("loss", choices=MIAS)  # black-box loss-threshold membership inference
    mia_examples: int = bounded(5_000, ge=10, most=100_000_000)
    # A trial's one-step verdict, at privbench's one audit significance (also `privbench audit`'s); the record
    # keeps the p-value, so a sweep's verdicts are corrected together (Holm, storage/verdicts.py).
    step_significance: float = bounded(AUDIT_SIGNIFICANCE, gt=0, lt=0.5)

    def __post_init__(self) -> None:
        check(self)

    @property
    def step(self) -> bool:
        return self.enabled and self.mode in ("step", "both")

    @property
    def one_run(self) -> bool:
        return self.enabled and self.mode in ("one-run", "both")

    def input_canaries_for(self, n_train: int) -> int:
        """How many input canaries a run of `n_train` training examples gets (0: none): with the one-run audit,
        `auto` takes 1,000, at most half the training set (`input_canaries.auto_count`), or the count given."""
        if not self.one_run or self.input_canaries == 0:
            return 0
        if self.input_canaries == "auto":
            from mechanisms.auditing.input_canaries import auto_count  # lazy: keeps grid validation light

            return auto_count(n_train)
        return int(self.input_canaries)

    def canaries_for(self, n_params: int, shape: tuple[float, float, int] | None, delta: float, seed: int) -> int:
        """`auto`: 1, 3, 10 or 25 canaries per trainable coordinate (at most `max_canaries`), whichever
        a simulation of the certified mechanism predicts to give the largest bound
        (`white_box.choose_canaries`); one per coordinate when the mechanism is not DP-SGD-shaped."""
        if self.canaries != "auto":
            return int(self.canaries)
        if shape is None:
            return max(1, min(self.max_canaries, n_params))
        from mechanisms.auditing import white_box  # lazy: keeps grid validation light

        sigma, rate, steps = shape
        return white_box.choose_canaries(n_params, steps, rate, sigma, delta, score=self.statistic, seed=seed,
                                         max_canaries=self.max_canaries)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Resources:
    """Grid key `resources`: what one trial's accelerator phase asks Ray for. `gpus: auto` is resolved
    by the driver (orchestrator/cluster.py `gpus_for`): a share of a GPU when the cluster has one."""

    cpus: float = bounded(1, gt=0, most=1024)
    gpus: float | str = bounded("auto", ge=0, most=64, words=("auto",))

    def __post_init__(self) -> None:
        check(self)


def _typed_numbers(cls: type, mapping: Mapping[str, Any]) -> dict[str, Any]:
    """Numbers as their field's type: `epochs: 1.0` and `batch_size: 1e3` mean integers, `lr: 1` means the
    float 1.0 (so that `lr: 1` and `lr: 1.0` are one setting, and one trial key)."""
    hints = typing.get_type_hints(cls)
    out = dict(mapping)
    for key, value in mapping.items():
        kinds = (hints.get(key), *typing.get_args(hints.get(key)))
        if int in kinds and isinstance(value, float) and value.is_integer() and abs(value) <= INT_MAX:
            out[key] = int(value)
        elif float in kinds and int not in kinds and isinstance(value, int) and not isinstance(value, bool) \
                and abs(value) <= INT_MAX:
            out[key] = float(value)
    return out


def section(cls: type[T], mapping: Any, owner: str) -> T:
    """One settings mapping (a grid's `train`, `audit`, `resources`) made into `cls` by the strict
    option parser (unknown keys, types), then `cls`' own bounds. Raises ConfigError."""
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, Mapping):
        raise ConfigError([f"{owner}: must be a mapping, got {type(mapping).__name__} {shown(mapping)}"])
    bad = [k for k in mapping if not isinstance(k, str)]
    if bad:
        raise ConfigError([f"{owner}: keys must be text, got {', '.join(shown(k) for k in bad)}"])
    mapping = _typed_numbers(cls, mapping)
    if cls is AuditConfig and mapping.get("mode") is False:  # `mode: false`, or YAML 1.1's `off`
        mapping["mode"] = "off"
    try:
        return parse(cls, mapping, owner)
    except OptionsError as e:
        raise ConfigError(e.problems) from None


def _changed(obj: Any) -> dict[str, Any]:
    """The fields of a typed settings object that differ from their defaults: what a trial's key holds of
    it. A default written out (`lr: 0.1`) is the same trial as one left out; a field added to privbench
    later (with a default that keeps today's behaviour) changes no existing key."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if getattr(obj, f.name) != f.default}


def _canonical(value: Any) -> Any:
    """One JSON form for a value the user typed in an option table: `1.0` and `1` are the same number."""
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) <= INT_MAX:
        return int(value)
    return value


OPTION_TABLES = ("mechanism_options", "model_options", "dataset_options")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrialConfig:
    """One (dataset, model, mechanism, epsilon, seed) trial, resolved: every grid setting that applies to it.

    `trial_key` identifies what the trial computes: the same settings always give the same key, and
    neither the sweep's name nor the resources it runs on are part of it (moving a sweep to a GPU does not
    rerun it). The mechanism, model and dataset options are kept as written; their owners check them
    (`mechanisms.get(name).option_problems`, `workers.models.option_problems`, ...).
    """

    dataset: str
    model: str
    mechanism: str
    epsilon: float | None = bounded(None, gt=0)
    seed: int = bounded(0, ge=0, most=SEED_MAX)
    sigma: float | None = bounded(None, ge=SIGMA_FLOOR, most=1e6)
    delta: float | DeltaRule = bounded(1e-5, rule=delta_problem)  # the text `1/(2N)` is parsed when made
    accountant: str = bounded("pld", choices=_accountants)
    calibration: str = bounded("claimed", choices=CALIBRATIONS)
    sampler: str = bounded("poisson", choices=_samplers)
    secure_rng: bool = False
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    audit: AuditConfig = dataclasses.field(default_factory=AuditConfig)
    resources: Resources = dataclasses.field(default_factory=Resources)
    mechanism_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    model_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dataset_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    sweep: str = "trial"
    # modules the workers import before the trial (a grid's `plugins:`); where code comes from, not what the
    # trial computes, so not part of the key
    plugins: tuple[str, ...] = ()
    # The code of each plugin entry the trial uses (component -> `mechanisms.framework.registry.Provenance` text: its
    # distribution, version and source hash); part of the key, so an edited plugin runs its trials again and
    # the record names the code that produced it. {} when every entry is privbench's own.
    code: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # A candidate of a tuned cell (workers/tuning_candidates.py `TuningSetting.to_dict`); {} for an ordinary trial
    tuning: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    trial_key: str = dataclasses.field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "delta", parse_delta(self.delta))
        for name in ("epsilon", "sigma"):  # eps 1 and 1.0 are one trial
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= INT_MAX:
                object.__setattr__(self, name, float(value))
        problems = field_problems(self)
        for name in ("dataset", "model", "mechanism", "sweep"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                problems.append(f"{name} must be a name, got {shown(getattr(self, name))}")
        if self.epsilon is not None and self.sigma is not None:
            problems.append("epsilon and sigma are exclusive: give a target epsilon (sigma is calibrated to "
                            f"it) or a noise multiplier sigma, not both (got epsilon {self.epsilon:g}, "
                            f"sigma {shown(self.sigma)})")
        if not isinstance(self.secure_rng, bool):
            problems.append(f"secure_rng must be true or false, got {shown(self.secure_rng)}")
        for name, cls in (("train", TrainConfig), ("audit", AuditConfig), ("resources", Resources)):
            if not isinstance(getattr(self, name), cls):
                problems.append(f"{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}")
        for name in (*OPTION_TABLES, "tuning", "code"):
            if not isinstance(getattr(self, name), Mapping):
                problems.append(f"{name} must be a mapping, got {shown(getattr(self, name))}")
        if problems:
            raise ConfigError(problems)
        view = self._key_view()
        for name in (*OPTION_TABLES, "tuning"):
            if name in view:
                view[name] = _canonical(view[name])
        blob = json.dumps(view, sort_keys=True, default=str)
        object.__setattr__(self, "trial_key", hashlib.sha256(blob.encode()).hexdigest()[:16])

    def _key_view(self) -> dict[str, Any]:
        """What the trial computes, typed: the settings of `train` and `audit` that differ from their
        defaults, the option tables as written (their numbers made canonical in the key), and the rest."""
        out: dict[str, Any] = {"secure_rng": True} if self.secure_rng else {}
        out |= {"delta": self.delta_written, "accountant": self.accountant, "calibration": self.calibration,
                "sampler": self.sampler, "audit": _changed(self.audit), "train": _changed(self.train),
                "dataset": self.dataset, "model": self.model, "mechanism": self.mechanism, "epsilon": self.epsilon,
                "seed": self.seed, "sigma": self.sigma}
        if self.tuning:  # only a tuned candidate's key has it (the keys of existing stores stay valid)
            out["tuning"] = dict(self.tuning)
        if self.code:  # likewise only a trial with a plugin entry
            out["code"] = dict(self.code)
        return out | {name: dict(getattr(self, name)) for name in OPTION_TABLES}

    @property
    def delta_written(self) -> float | str:
        """Delta as the grid wrote it (a number, or the rule's text): what the record and the keys hold."""
        return str(self.delta) if isinstance(self.delta, DeltaRule) else self.delta

    def delta_for(self, dataset_size: int) -> float:
        """The trial's delta as a number, for a training set of `dataset_size` examples (the rule resolved)."""
        return self.delta.resolve(dataset_size) if isinstance(self.delta, DeltaRule) else float(self.delta)

    @property
    def private(self) -> bool:
        """Whether the trial claims privacy. Its mechanism declares it (`Mechanism.private`, the one definition);
        the grid gives a private mechanism a target epsilon or a sigma and a reference one neither, so this reads
        it from them, and every phase and the record (`private`, read back by `storage.schema.is_private`) read it
        from here (tests/orchestrator/test_grid.py checks the chain)."""
        return self.epsilon is not None or self.sigma is not None

    @property
    def plan_key(self) -> str:
        """What the trial's privacy plan depends on: the mechanism and its options, the target or sigma, delta,
        the accountant and calibration, the sampler's geometry (the training set: dataset, its options and
        `max_train_examples`; batch size, epochs) and clip, and the model (its trainable tensors' sizes).
        Not the seed: trials that differ only in it (or in other settings) share one plan."""
        t = self.train
        view = {"mechanism": self.mechanism, "mechanism_options": dict(self.mechanism_options),
                "epsilon": self.epsilon, "sigma": self.sigma, "delta": self.delta_written,
                "accountant": self.accountant, "calibration": self.calibration, "sampler": self.sampler,
                "dataset": self.dataset, "dataset_options": dict(self.dataset_options),
                "max_train_examples": t.max_train_examples, "batch_size": t.batch_size, "epochs": t.epochs,
                "clip": t.clip, "model": self.model, "model_options": dict(self.model_options)}
        if self.tuning:  # a tuned candidate's noise comes from its cell's whole selection
            view["tuning"] = dict(self.tuning.get("spec") or {})
        return hashlib.sha256(json.dumps(view, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @property
    def memory_key(self) -> str:
        """What a trial's accelerator memory depends on (its workload, engine and batch sizes; not the seed,
        the target or the audit): trials sharing it are measured once for packing (`gpus: auto`)."""
        t = self.train
        view = {"dataset": self.dataset, "dataset_options": dict(self.dataset_options), "model": self.model,
                "model_options": dict(self.model_options), "mechanism": self.mechanism,
                "mechanism_options": dict(self.mechanism_options), "batch_size": t.batch_size,
                "eval_batch_size": t.eval_batch_size, "optimizer": t.optimizer,
                "grad_sample_mode": t.grad_sample_mode, "precision": t.precision}
        return hashlib.sha256(json.dumps(view, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        eps = f" eps={self.epsilon:g}" if self.epsilon is not None else ""
        return f"{self.mechanism} {self.dataset}/{self.model}{eps} seed={self.seed}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping for the ledger and MLflow (`from_dict` reads it back): the settings as
        the grid wrote them, plus the sweep, the resources and the key."""
        plugins = {"plugins": list(self.plugins)} if self.plugins else {}
        return {"sweep": self.sweep, "resources": dataclasses.asdict(self.resources)} | plugins | self._key_view() | {
            "trial_key": self.trial_key}

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> TrialConfig:
        """The config a ledger stored, or a notebook wrote as a mapping; checked like a grid's. A stored
        `trial_key` is not trusted: the key is always derived again."""
        if not isinstance(config, Mapping):
            raise ConfigError([f"a trial config must be a mapping, got {type(config).__name__}"])
        known = {f.name for f in dataclasses.fields(cls)}
        problems = [f"unknown trial settings {sorted(map(shown, set(config) - known))}; known: {sorted(known)}"] \
            if set(config) - known else []
        parts: dict[str, Any] = {}
        for name, kind in (("train", TrainConfig), ("audit", AuditConfig), ("resources", Resources)):
            try:
                parts[name] = section(kind, config.get(name), name)
            except ConfigError as e:
                problems += e.problems
        if problems:
            raise ConfigError(problems)
        plain = {k: v for k, v in config.items() if k in known and k not in parts and k != "trial_key"}
        for name in OPTION_TABLES:
            plain[name] = dict(plain.get(name) or {}) if isinstance(plain.get(name) or {}, Mapping) else plain[name]
        if "plugins" in plain:
            plain["plugins"] = tuple(plain["plugins"] or ())
        missing = [n for n in ("dataset", "model", "mechanism") if n not in plain]
        if missing:
            raise ConfigError([f"a trial config needs {', '.join(missing)}"])
        try:
            return cls(**plain, **parts)
        except TypeError as e:
            raise ConfigError([str(e)]) from None


__all__ = ["DELTA_PER_N", "AuditConfig", "ConfigError", "DeltaRule", "Resources", "TrainConfig", "TrialConfig",
           "delta_problem", "parse_delta", "section", "shown"]
