"""A trial in three phases, each a plain function of a `TrialConfig`, testable without Ray.

- `plan_phase` (CPU): the privacy plan (calibration, accounting), and a private trial's neighbouring-data checks
  of everything that runs before training (`workers.neighbours`). It depends only on the settings that make the
  plan (`TrialConfig.plan_key`), so a sweep's trials that share them share one.
- `accelerator_phase` (the trial's `resources`): training, evaluation and the forward passes the audits
  need (the canaries' observations during training, per-example losses for membership inference). Its
  output (`AcceleratorOutput`) is JSON-ready: the driver stores it, so a lost analysis reruns without
  retraining.
- `step_phase` (CPU): the one-step audit of the mechanism, which needs no trained model and runs beside
  training; `analysis_phase` (CPU): the one-run, f-DP, family and ceiling bounds and the MIA scores,
  computed from the accelerator's output, and the trial's record.

`run_trial` runs all of them in one process (tests, notebooks). No phase writes to the store: the
driver records what they return. `run_trial` never raises: a failure is a `failed` record.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib.metadata
import os
import platform
import random
import socket
import time
import traceback
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

import mechanisms
from mechanisms.framework import integrity
from mechanisms.framework.claims import claim_status
from mechanisms.framework.integrity import Finding, model_checks
from mechanisms.framework.integrity.verdict import contract_findings, plan_for, runs_own_step, verify
from mechanisms.framework.mechanism import uncertified
from mechanisms.parts.plan import PrivacyPlan, PrivacySpec
from workers import cache, datasets, models, neighbours, plugins
from workers.audit import (
    InputCanaryResult,
    InputCanaryRun,
    MiaLosses,
    OneRun,
    OneRunResult,
    audit_cost,
    audit_integrity_findings,
    loss_threshold_mia,
    mia_losses,
    one_run_fields,
    step_audit,
    with_input_canaries,
)
from workers.config import AuditConfig, TrialConfig
from workers.environment import configure
from workers.measure import freeze_long_lived
from workers.overhead import overhead_budget, paired_overhead
from workers.replay import replay_apart
from workers.result import TrialResult
from workers.timing import Stopwatch
from workers.train import Diverged, Progress, release_statistics, train
from workers.tuning_candidates import candidate_fields, tuned_plan

VERSIONED = ("torch", "opacus", "dp-accounting", "transformers", "numpy", "ray", "mlflow")


@functools.cache
def library_versions() -> dict[str, str]:
    """The versions of the libraries a result depends on, read once per process (each lookup scans the
    installed distributions: 0.1-0.4 s in all on a loaded machine, paid by every trial of a reused worker)."""
    out = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def seed_everything(seed: int) -> torch.Generator:
    """Seed the global generators (model initialisation, dropout) and return the batch-selection one."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def noise_generator(seed: int, device: torch.device, secure: bool = False) -> torch.Generator:
    """The generator of the privacy noise: derived from the trial seed (a rerun reproduces the trial) on
    the training device, or, with `secure_rng: true`, Opacus' secure generator (torchcsprng, reading the
    OS's entropy), which cannot be reproduced by design."""
    if secure:
        try:
            import torchcsprng  # lazy: optional dependency
        except ImportError:
            raise ValueError("secure_rng: true needs torchcsprng (Opacus' secure generator), which is not "
                             "installed") from None
        return torchcsprng.create_random_device_generator("/dev/urandom")
    (state,) = np.random.SeedSequence([seed, 1]).generate_state(1, dtype=np.uint64)
    return torch.Generator(device=device).manual_seed(int(state) >> 1)


def pick_device(gpus: float | str) -> torch.device:
    """CUDA when a GPU was granted (or, unresolved outside a sweep, `auto`) and is usable; otherwise CPU
    (a granted but absent GPU is not fatal)."""
    wanted = gpus == "auto" or float(gpus) > 0
    return torch.device("cuda") if wanted and torch.cuda.is_available() else torch.device("cpu")


def privacy_spec(config: TrialConfig, dataset_size: int, trainable: list[torch.nn.Parameter] | None = None,
                 bundle: Any = None) -> PrivacySpec:
    """The privacy side of the trial: its target and batch geometry, the trainable tensors' sizes, and the
    statistics the model (`bundle`) has released about the training set before training."""
    cfg = config.train
    return PrivacySpec(  # delta resolved here, where N (the training set actually used) is known
        epsilon=config.epsilon, delta=config.delta_for(dataset_size), dataset_size=dataset_size,
        batch_size=cfg.batch_size, epochs=cfg.epochs, clip=cfg.clip,
        calibration=config.calibration, accountant=config.accountant,
        sampler=config.sampler, sigma=config.sigma, options=dict(config.mechanism_options),
        model_dim=sum(p.numel() for p in trainable) if trainable else None,
        n_tensors=len(trainable) if trainable else None,
        tensor_sizes=tuple(p.numel() for p in trainable) if trainable else None,
        dataset_statistics=tuple(s.release for s in bundle.statistics) if bundle is not None else (),
    )


def as_config(config: TrialConfig | Mapping[str, Any]) -> TrialConfig:
    """A `TrialConfig` as is; a mapping (a notebook's, a stored one) checked into one (ConfigError)."""
    return config if isinstance(config, TrialConfig) else TrialConfig.from_dict(config)


def _workload(config: TrialConfig, watch: Stopwatch | None = None, seed: int | None = None) -> tuple[Any, Any, Any]:
    """The trial's data splits (the test split at most `max_test_examples`), its training split (at most
    `max_train_examples`), each the same subset in every phase, and its model (built under `seed` when given).
    The splits come from the worker's cache (`workers.cache`) when an earlier trial in this process loaded them."""
    watch = watch or Stopwatch()
    with watch.part("data_s"):
        options = dict(config.dataset_options)
        splits, _ = cache.cached_dataset(config.dataset, options, lambda: datasets.load(config.dataset, options))
        train_split = _at_most(splits.train, config.train.max_train_examples)
        splits = dataclasses.replace(splits, test=_at_most(splits.test, config.train.max_test_examples))
    with watch.part("model_s"), (_rng_kept() if seed is not None else contextlib.nullcontext()):
        if seed is not None:
            seed_everything(seed)
        bundle = models.build(config.model, splits, dict(config.model_options))
    return splits, train_split, bundle


def _kept(n: int, most: int | None) -> np.ndarray:
    """The indices of the examples `_at_most` keeps of `n`."""
    if not most or most >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(0).permutation(n)[:most])


def _at_most(split: Any, most: int | None) -> Any:
    """`split`, or a fixed random subset of `most` of its examples (in their order); of `most` of its privacy units,
    with all their rows, when it declares units (the batch size counts units too)."""
    units = getattr(split, "units", None)
    if units is not None:
        ids = np.unique(units)
        if not most or most >= len(ids):
            return split
        kept = ids[np.random.default_rng(0).permutation(len(ids))[:most]]
        return split.subset(np.flatnonzero(np.isin(units, kept)))
    if not most or most >= len(split):
        return split
    return split.subset(_kept(len(split), most))


def _trainable(bundle: Any) -> list[torch.nn.Parameter]:
    return [p for p in bundle.module.parameters() if p.requires_grad]


def _prepare(config: TrialConfig) -> None:
    """What every phase does first, in whichever process runs it: the process-wide settings, and the
    grid's `plugins:` modules (shipped by the driver), so their names resolve here too; and the plugin code
    here must be the code the driver keyed the trial by (`TrialConfig.code`, when a grid gave it), or the record
    would name other code than what ran."""
    configure()
    plugins.load(config.plugins)
    here = plugins.code_of(config.mechanism, config.model, config.dataset, config.accountant) if config.code else {}
    if here != dict(config.code):
        changed = sorted(set(here.items()) ^ set(dict(config.code).items()))
        raise RuntimeError(f"the plugin code on this worker is not the driver's: {'; '.join(map(': '.join, changed))} "
                           "(install the same version on every node, or ship it with plugins:)")


# phases -----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Planned:
    """The plan phase's output: the plan, the spec it answers (the accelerator phase checks that it runs
    exactly that process), and its seconds (`calibration_s` for the mechanism's own planning).
    `timing`: its parts (`Stopwatch.to_dict`); `finished_at`: when it was ready (seconds since the epoch), from
    which the driver tells the accelerator phase's wait for it; `cached`: read from the store's calibration cache
    (`orchestrator.plan_cache`) instead of made."""

    plan: PrivacyPlan
    spec: PrivacySpec
    seconds: float
    calibration_s: float
    tuning: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # a tuned candidate's record fields
    timing: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    finished_at: float | None = None
    cached: bool = False
    findings: tuple[Finding, ...] = ()  # the neighbouring-data checks of the plan-time code (`workers.neighbours`)


def needs_plan_task(config: TrialConfig) -> bool:
    """Whether the trial's plan is made by a plan task before training: a private trial's calibration and
    accounting (or a tuned candidate's selection). A reference run has nothing to calibrate: its accelerator phase
    plans it in place (the batch geometry only) with the data and model it loads anyway."""
    return config.private or bool(config.tuning)


def _plan(config: TrialConfig, spec: PrivacySpec) -> tuple[PrivacyPlan, Mapping[str, Any]]:
    mechanism = mechanisms.get(config.mechanism)
    return tuned_plan(config.tuning, spec, mechanism) if config.tuning else (plan_for(mechanism, spec), {})


def plan_phase(config: TrialConfig, check: bool = True) -> Planned:
    """Calibrate and account the trial's mechanism on CPU. The data and the model are read only for the
    training set's size and the trainable tensors' sizes. A private trial's plan-time code is then run again on
    a neighbouring training set (`workers.neighbours`; not `check`: a probe whose record is never kept): its
    findings travel with the plan."""
    t0 = time.perf_counter()
    watch = Stopwatch()
    with watch.part("prepare_s"):
        _prepare(config)
    made = _plan_time(config, watch)
    findings: tuple[Finding, ...] = ()
    if config.private and check:
        with watch.part("neighbours_s"):
            most = config.train.max_train_examples
            findings = neighbours.check(config.dataset, made, lambda: _plan_time(config, Stopwatch()),
                                        lambda n: int(_kept(n, most)[0]),
                                        datasets.get_loader(config.dataset)[0].transform is not None)
    return Planned(made.planned, made.spec, time.perf_counter() - t0, watch.wall["calibration_s"], made.tuning,
                   watch.to_dict(), time.time(), findings=findings)


def _plan_time(config: TrialConfig, watch: Stopwatch) -> neighbours.Pretraining:
    """What the trial's plan-time code makes, under its seed: the data, the model, the spec and the plan (a
    neighbouring-data check runs it again inside `workers.datasets.neighbouring`)."""
    splits, train_split, bundle = _workload(config, watch, seed=config.seed)
    if config.private:  # a model that mixes rows is refused here, the first code a trial runs, before any device
        model_checks.refuse(bundle.module)
    spec = privacy_spec(config, datasets.unit_count(train_split), _trainable(bundle), bundle)
    with watch.part("calibration_s"), _rng_kept():
        seed_everything(config.seed)
        plan, tuning = _plan(config, spec)
    return neighbours.Pretraining.of(plan, tuning, spec, bundle.module, bundle.info, splits.train)


@dataclasses.dataclass(frozen=True)
class AcceleratorOutput:
    """What the accelerator phase hands the analysis phase, JSON-ready (`to_dict`): the training metrics
    and curves, the engine used, the one-run canaries' observations, the MIA losses, where it ran."""

    metrics: dict[str, float | None]
    curves: dict[str, list[float]]
    info: dict[str, Any]
    one_run: OneRunResult | None
    mia: MiaLosses | None
    environment: dict[str, Any]
    seconds: float
    timing: dict[str, Any] = dataclasses.field(default_factory=dict)  # its parts (`Stopwatch.to_dict`)
    # the plan it made itself (a trial with no plan task, `needs_plan_task`); not stored with the output: a
    # resumed analysis has its plan made again by a plan task
    planned: Planned | None = None
    input_canaries: InputCanaryResult | None = None  # the input canaries' scores on the final model

    def to_dict(self) -> dict[str, Any]:
        return {"metrics": self.metrics, "curves": self.curves, "info": self.info,
                "one_run": self.one_run.to_dict() if self.one_run is not None else None,
                "mia": self.mia.to_dict() if self.mia is not None else None, "environment": self.environment,
                "seconds": self.seconds, "timing": self.timing,
                "input_canaries": self.input_canaries.to_dict() if self.input_canaries is not None else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AcceleratorOutput:
        return cls(dict(data["metrics"]), dict(data["curves"]), dict(data["info"]),
                   OneRunResult.from_dict(data["one_run"]) if data.get("one_run") else None,
                   MiaLosses.from_dict(data["mia"]) if data.get("mia") else None, dict(data["environment"]),
                   float(data["seconds"]), dict(data.get("timing") or {}),
                   input_canaries=InputCanaryResult.from_dict(data["input_canaries"])
                   if data.get("input_canaries") else None)


def accelerator_phase(config: TrialConfig, planned: Planned | None,
                      on_progress: Progress | None = None) -> AcceleratorOutput:
    """Train and evaluate under the plan on the trial's device, and make the forward passes the audits need.
    `planned` None: the trial has no plan task (`needs_plan_task`), and is planned here (`output.planned`)."""
    t0, started = time.perf_counter(), time.time()
    watch = Stopwatch()
    with watch.part("prepare_s"):  # the settings and the record of where it runs (a Ray call, the versions)
        freeze_long_lived()  # before the trial makes anything: later full collections skip the imports
        _prepare(config)
        gpus, cpus = config.resources.gpus, max(1, int(config.resources.cpus))
        torch.set_num_threads(cpus)
        device = pick_device(gpus)
        env = {"hostname": socket.gethostname(), "pid": os.getpid(), "versions": dict(library_versions()),
               "started_at": started, "device": device.type,
               "gpus_granted": 0.0 if gpus == "auto" else float(gpus), "cpus": cpus} | _ray_node()
        generator = seed_everything(config.seed)
    splits, train_split, bundle = _workload(config, watch)
    with watch.part("setup_s"):  # every line of the phase is in a part: the parts explain its span
        spec = privacy_spec(config, datasets.unit_count(train_split), _trainable(bundle), bundle)
        mechanism = mechanisms.get(config.mechanism)
    made_here = None
    if planned is None:
        if needs_plan_task(config):
            raise RuntimeError(f"the {config.mechanism} trial needs its plan from a plan task")
        with watch.part("planning_s"), _rng_kept():
            plan, tuning = _plan(config, spec)
        planned = made_here = Planned(plan, spec, watch.wall["planning_s"], watch.wall["planning_s"], tuning,
                                      {}, time.time())
    elif spec != planned.spec:
        raise RuntimeError("the plan was made for another training set or model than the one that would run; "
                           "the accounted process must be the executed one" + (
                               " (the plan came from the store's calibration cache: the data or model on this "
                               "worker differ from those it was made for; rerun with PRIVBENCH_PLAN_CACHE=0)"
                               if planned.cached else ""))
    plan, audit = planned.plan, config.audit
    with watch.part("canaries_s"):
        one_run = OneRun(audit, plan, config.seed) if audit.one_run and config.private else None
    with watch.part("setup_s"):
        noise = noise_generator(config.seed, device, config.secure_rng)
        release_statistics(bundle, train_split, plan, noise, secure=config.secure_rng)  # before the model is copied
        pristine = copy.deepcopy(bundle.module) if config.private and plan.parts is not None else None
    with watch.part("canaries_s"):  # the input canaries' initial scores are the model's as training starts
        m = audit.input_canaries_for(len(train_split)) if config.private else 0
        inputs = InputCanaryRun(m, plan, splits, bundle, config.seed) if m else None
    outcome = train(bundle, train_split, {"val": splits.val, "test": splits.test}, mechanism,
                    plan, config.train, device=device, generator=generator, on_progress=on_progress,
                    noise_generator=noise, secure_mode=config.secure_rng,
                    attach=one_run.attach if one_run else None, private=config.private, watch=watch,
                    batches=inputs.batches if inputs else None)
    with watch.part("forward_s"):
        losses = mia_losses(bundle, train_split, splits.test, audit, device=device, seed=config.seed)
        scored = inputs.result(bundle.module, device) if inputs is not None else None
    budget = overhead_budget(outcome.metrics.get("train_s"))
    if pristine is not None and runs_own_step(mechanism):  # the trainer's DP step: at least its fewest rounds
        with watch.part("overhead_s"):
            outcome.metrics |= paired_overhead(pristine, bundle, train_split, mechanism, plan, config.train,
                                               device=device, seed=config.seed, budget_s=budget).metrics()
    with watch.part("canaries_s"):
        canaries = one_run.result() if one_run is not None else None
    return AcceleratorOutput(outcome.metrics | {"n_train": float(len(train_split))}, outcome.curves, outcome.info,
                             canaries, losses,
                             env | {"accelerator_finished_at": time.time()}, time.perf_counter() - t0,
                             watch.to_dict(), made_here, scored)


@contextlib.contextmanager
def _rng_kept() -> Any:
    """The global generators as they were, after the block: planning in the accelerator phase must not change the
    trial's model initialisation, dropout or batches against a trial planned by a plan task."""
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])


def step_phase(config: TrialConfig, planned: Planned) -> dict[str, Any]:
    """The one-step audit of the mechanism at the plan's sigma (no trained model needed; CPU)."""
    if not (config.audit.step and config.private):
        return {}
    _prepare(config)
    return step_audit(mechanisms.get(config.mechanism), planned.plan, config.train.clip, config.audit,
                      dict(config.mechanism_options), config.seed, max(1, int(config.resources.cpus)),
                      list(planned.spec.tensor_sizes or ()))


def analysis_phase(config: TrialConfig, planned: Planned, output: AcceleratorOutput,
                   step: Mapping[str, Any]) -> dict[str, Any]:
    """The run's audit bounds and MIA scores from the accelerator's output, and the trial's record."""
    t0, c0 = time.perf_counter(), time.process_time()
    _prepare(config)
    plan, train_s = planned.plan, output.metrics.get("train_s")
    findings = integrity_findings(config, planned, output)
    # what planning found is in the plan's own reason already (`plan_for`): only later findings join it
    known = set(contract_findings(mechanisms.get(config.mechanism), plan)) if config.private else set()
    if (reason := integrity.certify(f for f in findings if f not in known)) and config.private:
        plan = uncertified(plan, "; ".join(r for r in (plan.uncertified_reason, reason) if r))  # not what was accounted
    audits: dict[str, Any] = {"epsilon_audited": None}
    if output.one_run is not None:
        audits |= one_run_fields(output.one_run, config.audit, plan, plan.delta, train_s)
    if output.input_canaries is not None:
        audits = with_input_canaries(audits, output.input_canaries, plan, plan.delta)
    if output.mia is not None:
        audits |= loss_threshold_mia(output.mia)
    audits |= audit_cost(audits, train_s) | dict(step)
    private, info = config.private, output.info
    privacy = plan.as_record() | audits | {
        "epsilon_target": config.epsilon,
        "private": private,  # whether the trial claims any privacy (dashboards read this, not a name)
        "grad_sample_mode": info.get("grad_sample_mode") if private else None,
        "bk_fallback": info.get("bk_fallback") if private else None,  # why bk could not clip it
        "row_grouping": info.get("row_grouping") if private else None,  # declared units, augmult (else None)
        # where the engine came from: the grid, the model's info, or privbench's default (a model naming none)
        "grad_sample_mode_source": info.get("grad_sample_mode_source") if private else None,
        "claim_status": claim_status(plan.epsilon_claimed, plan.epsilon_certified, audits["epsilon_audited"],
                                     audit_violated=bool(audits.get("audit_step_violated")
                                                          or audits.get("audit_run_violated")),
                                     private=private, epsilon_audited_input=audits.get("epsilon_audited_input")),
    } | dict(planned.tuning) | candidate_fields(config.tuning) | (
        integrity.record_fields(findings + audit_integrity_findings(audits)) if private else {})
    if "audit_step_p_value" in audits:  # the verdict without the step audit: a sweep applies Holm to it
        privacy["claim_status_without_step"] = claim_status(
            plan.epsilon_claimed, plan.epsilon_certified, audits["epsilon_audited"],
            audit_violated=bool(audits.get("audit_run_violated")), private=private,
            epsilon_audited_input=audits.get("epsilon_audited_input"))
    analysis_s = time.perf_counter() - t0 + float(step.get("audit_step_s") or 0.0)
    phases = {"plan_s": planned.seconds, "accelerator_s": output.seconds, "analysis_s": analysis_s}
    timing = Stopwatch.from_dict(output.timing)
    timing.add("audits_s", analysis_s, time.process_time() - c0)
    plan_parts = Stopwatch.from_dict(dict(planned.timing))
    timing.add("plan_s", planned.seconds, sum(plan_parts.cpu.values()) if plan_parts.cpu else None)
    # wall_s is the trial's own span, from its accelerator phase's start to its analysis' end (what the MLflow
    # run's duration shows), waits between phases included; the phases' seconds say where the time went.
    finished = time.time()
    wall = finished - float(output.environment.get("started_at", finished - sum(phases.values())))
    metrics = output.metrics | phases | {"wall_s": wall, "calibration_s": planned.calibration_s}
    return TrialResult(config.sweep, config.trial_key, "finished", config.to_dict(), metrics, output.curves,
                       privacy, output.environment | {"finished_at": finished}, timing=timing.to_dict()).to_record()


def integrity_findings(config: TrialConfig, planned: Planned, output: AcceleratorOutput) -> list[Finding]:
    """Every integrity check of the trial (`mechanisms.framework.integrity`): the contract (planning), the
    step's code and every step's guard (training), and the state replayed from the recorded releases in a
    process of its own (analysis)."""
    if not config.private:
        return []
    replayed = None
    if (trace := output.info.get("state_trace")) is not None:
        replayed = replay_apart(config.to_dict(), planned.plan, trace)
    recorded = [*planned.findings, *(Finding.from_dict(f) for f in output.info.get("integrity", ()))]
    return verify(mechanisms.get(config.mechanism), planned.plan, recorded, replayed)


def step_memory(config: TrialConfig) -> tuple[float, float | None]:
    """Peak memory (MB) of one private training step and one evaluation pass at the trial's batch sizes
    on its device, and the device's size in MB (None on CPU): what `gpus: auto` packs trials by.

    The measured run is the trial's own accelerator phase on one batch (`max_train_examples` = the batch
    size, one epoch: one step), at a fixed sigma (the noise level does not change the memory) and without
    audits. On a GPU the figure is the allocator's peak reservation (weights, optimizer state, activations,
    per-sample norms); on CPU, the extra resident memory of the step.
    """
    if torch.cuda.is_available():  # a reused worker's cached blocks and peak are not this trial's
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    private = config.private
    probe = dataclasses.replace(
        config, epsilon=None, sigma=1.0 if private else None, audit=AuditConfig(enabled=False),
        train=dataclasses.replace(config.train, epochs=1, max_train_examples=config.train.batch_size))
    output = accelerator_phase(probe, plan_phase(probe, check=False) if needs_plan_task(probe) else None)
    device = pick_device(config.resources.gpus)
    if device.type == "cuda":
        return (torch.cuda.max_memory_reserved(device) / 2**20,
                torch.cuda.get_device_properties(device).total_memory / 2**20)
    return float(output.metrics.get("peak_memory_mb") or 0.0), None


def failed(config: TrialConfig | Mapping[str, Any], error: BaseException | str, tb: str | None = None,
           metrics: dict[str, Any] | None = None, environment: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record of a trial that did not finish: a result too, recorded like any other."""
    if isinstance(error, BaseException):
        error = str(error) if isinstance(error, Diverged) else f"{type(error).__name__}: {error}"
    plain = config.to_dict() if isinstance(config, TrialConfig) else dict(config)
    return TrialResult(str(plain.get("sweep", "?")), str(plain.get("trial_key", "?")), "failed", plain,
                       metrics=metrics or {}, environment=environment or {}, error=error, traceback=tb).to_record()


def run_trial(config: TrialConfig | Mapping[str, Any], on_progress: Progress | None = None) -> dict[str, Any]:
    """Run one (dataset, model, mechanism, epsilon, seed) trial, every phase in this process, and return
    its result record."""
    started = time.time()
    try:
        config = as_config(config)
        planned = plan_phase(config) if needs_plan_task(config) else None
        output = accelerator_phase(config, planned, on_progress)
        planned = planned or output.planned
        return analysis_phase(config, planned, output, step_phase(config, planned))
    except Exception as exc:  # noqa: BLE001 - a failed trial is a result, not a crash
        return failed(config, exc, traceback.format_exc(), {"wall_s": time.time() - started},
                      {"hostname": socket.gethostname(), "pid": os.getpid(), "started_at": started,
                       "finished_at": time.time()})


def _ray_node() -> dict[str, str | None]:
    """Which Ray node ran the trial (informational; empty outside Ray)."""
    try:
        import ray  # lazy: heavy (ray)

        if not ray.is_initialized():
            return {}
        return {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address()}
    except Exception:  # noqa: BLE001 - informational only
        return {}


__all__ = ["AcceleratorOutput", "Planned", "accelerator_phase", "analysis_phase", "needs_plan_task", "plan_phase",
           "run_trial", "step_memory", "step_phase"]
