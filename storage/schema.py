"""The result record's fields, declared once: every name a number has anywhere in privbench.

A trial's record (`workers.result.TrialResult.to_record()`) has three sections of named values:
`config` (what was asked), `metrics` (what the run measured) and `privacy` (what was claimed,
certified and audited). Each field here says where it lives, its type, whether it is logged as an
MLflow metric, and, when the leaderboard shows it, the leaderboard column (the name in CSV / JSON
exports), its short table header, how seeds are combined (the largest for lower bounds such as the
audited epsilons, never averaging a bound away; the mean otherwise), whether it applies to private
trials only, and the column group `--columns` selects it by (core / privacy / audit / overhead).

One name per number: the record key is also the MLflow metric name and, for a per-trial number, the
leaderboard column (MLflow takes letters, digits and `_-./: ` only, so no key has a `%`). Columns
the leaderboard derives (utility mean and std, ratios against non-private, counts) are declared here
too, in the `derived` section. `legacy` names what older stores wrote, so their records still read.

This module is a leaf: no torch, pandas or other privbench import, so anything may import it
(workers do not: they write the record, and a test checks each key they write is declared here).
"""

from __future__ import annotations

import dataclasses
import decimal
import math
from collections.abc import Mapping
from typing import Any

SECTIONS = ("record", "config", "metrics", "curves", "privacy", "environment", "timing", "derived")
GROUPS = ("core", "privacy", "audit", "overhead")
AGGREGATES = ("mean", "max", "min", "first", "worst", "none")
ROUNDINGS = ("nearest", "up", "down")
UTILITY_PLACES = 4  # a utility metric the schema gives no decimals (a loss: 0.4123)


@dataclasses.dataclass(frozen=True)
class Field:
    key: str  # the record key, and the MLflow metric name when `mlflow`
    section: str  # config | metrics | privacy | derived (leaderboard only)
    type: type | tuple[type, ...]
    doc: str
    column: str | None = None  # leaderboard column (CSV / JSON export name); None: not on the leaderboard
    header: str | None = None  # short header in the text tables; None: exported, not displayed
    group: str | None = None  # which `--columns` group displays it
    aggregate: str = "mean"  # over seeds: mean, max (lower bounds), first, worst (claim status), none
    private_only: bool = False  # None for non-private trials
    mlflow: bool = False  # logged as an MLflow metric named `key`
    unit: str = ""
    legacy: tuple[str, ...] = ()  # names older stores wrote for this number (read, never written)
    sparse: bool = False  # displayed only when some row has a value (fields newer than most stores)
    # How every output writes it (terminal, markdown, HTML, LaTeX, the report's sentences, figure labels and
    # ticks, MLflow params and descriptions: one format per quantity): `label` in words ("eps" and "sigma"
    # become Greek letters in LaTeX; default: the header), `abbr` where a table is narrow (explained under
    # the table), `places` decimals (the same in every output and every row, so a column aligns on the
    # decimal point; None: `digits` significant digits, for values as the grid gives them, such as the
    # target epsilon), rounded `up` for upper bounds and `down` for lower bounds so that a shown epsilon
    # never under-reports, and `percent` for a fraction written as a percentage in every output (accuracy:
    # 83.6, never 0.8357 in one place and 83.6 in another; CSV and JSON keep the record's fraction).
    label: str | None = None
    abbr: str | None = None
    places: int | None = None
    digits: int = 3
    rounding: str = "nearest"
    percent: bool = False

    def __post_init__(self) -> None:
        if self.section not in SECTIONS or self.aggregate not in AGGREGATES or (
                self.group is not None and self.group not in GROUPS) or self.rounding not in ROUNDINGS:
            raise ValueError(f"bad schema field {self.key!r}")


F = Field
NUM = (int, float)
OPT = (type(None),)

FIELDS: tuple[Field, ...] = (
    # record: the top level of a result record
    F("sweep", "record", str, "the sweep's name"),
    F("trial_key", "record", str, "the trial's identity in its sweep"),
    F("status", "record", str, "finished or failed"),
    F("config", "record", dict, "what the grid asked for"),
    F("metrics", "record", dict, "what the run measured"),
    F("curves", "record", dict, "per-epoch values"),
    F("privacy", "record", dict, "claimed, certified and audited privacy"),
    F("environment", "record", dict, "where and when the trial ran"),
    F("error", "record", (str, type(None)), "one line: why the trial failed"),
    F("traceback", "record", (str, type(None)), "the failed trial's traceback"),
    F("timing", "record", dict, "where the trial's time went, wall seconds per part (workers/timing.py)"),

    # timing: each part's wall seconds (workers/timing.py says what each covers); `cpu` the same parts' CPU seconds
    *(F(part, "timing", NUM, doc, unit="s") for part, doc in (
        ("plan_wait_s", "the accelerator task's wait for its plan"),
        ("scheduling_s", "Ray scheduling and task start, imports aside"),
        ("imports_s", "module imports of a fresh worker"),
        ("prepare_s", "process settings and plugins"),
        ("data_s", "the dataset's splits (0 from the worker's cache)"),
        ("model_s", "the model's construction"),
        ("planning_s", "the plan made in the accelerator phase (no plan task)"),
        ("calibration_s", "the plan task's calibration and accounting"),
        ("setup_s", "statistics, model copies and the mechanism's private objects"),
        ("training_s", "the training steps"),
        ("evaluation_s", "the evaluation after each epoch"),
        ("memory_probe_s", "the trial's share of the memory probe"),
        ("canaries_s", "the one-run audit's simulations before the first step and its result after the last"),
        ("forward_s", "the forward passes of the membership-inference audit"),
        ("overhead_s", "the paired overhead measurement"),
        ("transfer_s", "the accelerator output's way to the driver"),
        ("save_s", "the driver's write of the accelerator output"),
        ("plan_s", "the plan task (beside the accelerator slot; 0 from the calibration cache)"),
        ("analysis_wait_s", "the analysis task's wait for a CPU slot"),
        ("audits_s", "the audits and the record, in the analysis phase"),
        ("span_s", "the accelerator task's submission to the driver's receipt of its output"),
    )),
    F("cpu", "timing", dict, "each part's CPU seconds in the process that ran it"),

    # environment: where and when the trial ran (MLflow tags)
    F("hostname", "environment", str, "host that ran the trial"),
    F("pid", "environment", int, "worker process"),
    F("versions", "environment", dict, "library versions"),
    F("started_at", "environment", NUM, "start, seconds since the epoch"),
    F("finished_at", "environment", NUM, "end, seconds since the epoch"),
    F("accelerator_finished_at", "environment", NUM, "end of the accelerator phase, seconds since the epoch"),
    F("device", "environment", str, "cpu or cuda"),
    F("gpus_granted", "environment", NUM, "GPUs Ray granted"),
    F("cpus", "environment", int, "CPUs Ray granted"),
    F("node_id", "environment", str, "Ray node"),
    F("node_ip", "environment", str, "Ray node's address"),

    # config: what the grid asked for (nested dicts are the grid's own sections)
    F("sweep", "config", str, "the sweep's name", column="sweep", aggregate="first"),
    F("trial_key", "config", str, "the trial's identity in its sweep (hash of its config)"),
    F("dataset", "config", str, "dataset registry name", column="dataset", header="dataset", group="core",
      aggregate="first"),
    F("model", "config", str, "model registry name", column="model", header="model", group="core", aggregate="first"),
    F("mechanism", "config", str, "mechanism registry name", column="mechanism", header="mechanism", group="core",
      aggregate="first", abbr="mech."),
    F("epsilon", "config", NUM + OPT, "target epsilon the noise is calibrated to (None: non-private or sigma given)",
      column="epsilon_target", header="eps target", group="core", aggregate="first", abbr="eps tgt."),
    F("delta", "config", NUM + (str,), "target delta, or '1/(2N)'"),
    F("seed", "config", int, "the trial's seed"),
    F("sigma", "config", NUM + OPT, "noise multiplier given instead of an epsilon"),
    F("calibration", "config", str, "which analysis the noise is calibrated with (claimed or certified)"),
    F("accountant", "config", str, "accountant of the certified epsilon"),
    F("sampler", "config", str, "batch sampler (poisson, shuffle, ...)"),
    F("secure_rng", "config", bool, "cryptographically secure noise"),
    F("resources", "config", dict, "Ray resources per trial"),
    F("train", "config", dict, "training options (epochs, batch_size, lr, ...)"),
    F("audit", "config", dict, "audit options"),
    F("mechanism_options", "config", dict, "the mechanism's options"),
    F("model_options", "config", dict, "the model's options"),
    F("dataset_options", "config", dict, "the dataset's options"),
    F("plugins", "config", list, "modules the grid imports to register plugins"),
    F("tuning", "config", dict, "a tuned candidate's cell, place among its K candidates, draw and tune: block "
      "(workers/tuning_candidates.py); absent for an ordinary trial"),

    # metrics: what the run measured
    F("accuracy", "metrics", NUM + OPT, "test accuracy (the default utility)", mlflow=True, abbr="acc.",
      places=1, percent=True, unit="%"),
    F("test_loss", "metrics", NUM + OPT, "test loss", mlflow=True),
    F("val_accuracy", "metrics", NUM + OPT, "validation accuracy", mlflow=True, abbr="val. acc.",
      places=1, percent=True, unit="%"),
    F("train_loss", "metrics", NUM + OPT, "last epoch's mean training loss", mlflow=True),
    F("step_time_s", "metrics", NUM + OPT, "median training step time", mlflow=True, unit="s"),
    F("step_time_ratio", "metrics", NUM + OPT, "a private step's time over a non-private step's of the same model, "
      "batch and precision, taken in turns in the trial (workers/overhead.py); a private trial without it has no "
      "step x (never the ratio of two trials' median steps); 1 for the non-private reference",
      column="step_time_ratio",
      header="step x", group="core", unit="x", label="step time", abbr="step", mlflow=True, places=2),
    F("peak_memory_ratio", "metrics", NUM + OPT, "a private step's peak extra memory over the non-private step's, "
      "measured the same way (null when non-private's is under 50 MB)", column="peak_memory_ratio",
      header="mem x", group="overhead", unit="x", label="memory", abbr="mem.", mlflow=True, places=2),
    F("paired_private_step_s", "metrics", NUM + OPT, "median private step in the trial's paired overhead window "
      "(workers/overhead.py)", mlflow=True, unit="s"),
    F("paired_nonprivate_step_s", "metrics", NUM + OPT, "median non-private step of the same model and batch in "
      "that window", mlflow=True, unit="s"),
    F("step_time_ratio_low", "metrics", NUM + OPT, "lower end of the 95% interval of step_time_ratio (the paired "
      "rounds' order statistics; the lowest over seeds)", column="step_time_ratio_low", aggregate="min", mlflow=True,
      unit="x", places=2, rounding="down"),
    F("step_time_ratio_high", "metrics", NUM + OPT, "upper end of that interval (the highest over seeds)",
      column="step_time_ratio_high", aggregate="max", mlflow=True, unit="x", places=2, rounding="up"),
    F("paired_rounds", "metrics", NUM + OPT, "rounds the paired overhead measurement took", mlflow=True),
    F("examples_per_s", "metrics", NUM + OPT, "training throughput", column="examples_per_s", header="ex/s",
      group="overhead", mlflow=True, unit="ex/s", label="throughput", abbr="thr.", places=0),
    F("train_s", "metrics", NUM + OPT, "training time (audit canaries left out)", mlflow=True, unit="s"),
    F("peak_memory_mb", "metrics", NUM + OPT, "extra peak memory of the training loop", column="peak_memory_mb",
      header="peak MB", group="overhead", mlflow=True, unit="MB", label="peak memory", abbr="peak", places=1),
    F("steps_run", "metrics", NUM, "optimizer steps the run took", mlflow=True),
    F("wall_s", "metrics", NUM, "the trial's wall time: its accelerator phase's start to its analysis' end",
      column="wall_s", mlflow=True, unit="s"),
    F("calibration_s", "metrics", NUM, "time to plan and calibrate the noise", mlflow=True, unit="s"),
    F("plan_s", "metrics", NUM, "time to plan the trial (calibration and accounting)", column="plan_s",
      header="plan s", group="overhead", mlflow=True, unit="s", sparse=True, label="plan",
      places=2),
    F("accelerator_s", "metrics", NUM, "time on the accelerator (training and evaluation)", column="accelerator_s",
      header="accel s", group="overhead", mlflow=True, unit="s", sparse=True, label="accelerator", abbr="accel.",
      places=2),
    F("analysis_s", "metrics", NUM, "time of the analyses after training (audits, MIA)", column="analysis_s",
      header="analysis s", group="overhead", mlflow=True, unit="s", sparse=True,
      label="post-training analysis", abbr="post", places=2),
    F("n_train", "metrics", NUM, "training examples used", mlflow=True),

    # curves: one value per epoch (MLflow: the metric's history, step = epoch)
    F("train_loss", "curves", list, "mean training loss per epoch", mlflow=True),
    F("test_accuracy", "curves", list, "test accuracy after each epoch", mlflow=True),
    F("val_accuracy", "curves", list, "validation accuracy after each epoch", mlflow=True),

    # privacy: the plan (claimed and certified), the audits and the verdict
    F("sigma", "privacy", NUM + OPT, "noise multiplier the run used", column="sigma", header="sigma",
      group="privacy", private_only=True, label="sigma", places=3),
    F("sample_rate", "privacy", NUM + OPT, "sampling rate q of a step"),
    F("steps", "privacy", int, "accounted steps"),
    F("delta", "privacy", NUM, "delta of every epsilon", column="delta"),
    F("sampler", "privacy", (str, type(None)), "batch sampler accounted",
      column="sampler", aggregate="first"),
    F("accountant", "privacy", (str, type(None)), "accountant of the certified epsilon", column="accountant",
      aggregate="first"),
    F("mechanism", "privacy", str, "mechanism planned (as config.mechanism)"),
    F("claimed_by", "privacy", (str, type(None)), "the analysis the mechanism's claim comes from", private_only=True),
    F("epsilon_claimed", "privacy", NUM + OPT, "the mechanism's own published analysis", column="epsilon_claimed",
      header="eps claimed", group="privacy", private_only=True, mlflow=True, abbr="eps cl.", places=2,
      rounding="up"),
    F("epsilon_certified", "privacy", NUM + OPT, "sound upper bound (PLD) on the noise the code adds; max over "
      "seeds: never under-reported", column="epsilon_certified", header="eps certified", group="core",
      aggregate="max", private_only=True, mlflow=True, abbr="eps cert.", places=2,
      rounding="up"),
    F("effective_event", "privacy", str, "the dp_accounting event of what runs"),
    F("notes", "privacy", str, "the plan's notes"),
    F("extra", "privacy", dict, "the plan's extra facts"),
    F("neighboring_relation", "privacy", str, "add-or-remove-one or replace-one"),
    F("epsilons", "privacy", dict, "certified epsilon per accountant"),
    F("uncertified_reason", "privacy", (str, type(None)), "why no sound analysis of what ran is known (certified "
      "is then null): a part or step privbench did not write, or a known gap", column="uncertified_reason",
      aggregate="first", private_only=True),
    F("integrity_checks", "privacy", (dict, type(None)), "each integrity check the trial ran (what ran is what "
      "was planned: mechanisms/framework/integrity/) and whether it passed", private_only=True),
    F("integrity_failed", "privacy", (list, type(None)), "every failed integrity check with its reason, in words: "
      "any makes the trial uncertified (its reasons join uncertified_reason)", private_only=True),
    F("release_multipliers", "privacy", dict, "each release's own noise multiplier (std over sensitivity); the "
      "step's is their combination"),
    F("parts", "privacy", (dict, type(None)), "the mechanism's parts"),
    F("batch_selection", "privacy", (dict, str, type(None)), "how batches are drawn"),
    F("epsilon_target", "privacy", NUM + OPT, "config.epsilon, kept beside the epsilons it is compared with"),
    F("grad_sample_mode", "privacy", (str, type(None)), "per-sample gradient engine"),
    F("bk_fallback", "privacy", (str, type(None)), "why the book-keeping engine could not clip the model"),
    F("grad_sample_mode_source", "privacy", (str, type(None)), "where the engine came from: grid, model (its "
      "info), or default (the model names none: privbench's book-keeping engine)"),
    F("row_grouping", "privacy", (dict, type(None)), "rows clipped together: declared privacy units (units, rows, "
      "largest unit) and augmult, and the engine that clipped them; None: one row per record"),
    F("claim_status", "privacy", (str, type(None)), "ok, overclaimed, violated or uncertified (worst over seeds)",
      column="claim_status", header="status", group="core", aggregate="worst", private_only=True),
    # the one-run audit: lower bounds (the largest over seeds), ceiling, cost
    F("epsilon_audited", "privacy", NUM + OPT, "empirical lower bound from the one-run canary audit",
      column="epsilon_audited", header="eps audited", group="core", aggregate="max", private_only=True, mlflow=True,
      abbr="eps aud.", places=2, rounding="down"),
    F("epsilon_audited_steinke", "privacy", NUM + OPT, "Steinke et al.'s one-run bound",
      column="epsilon_audited_steinke", aggregate="max", private_only=True, mlflow=True,
      legacy=("audit_epsilon_steinke",)),
    F("epsilon_audited_fdp", "privacy", NUM + OPT, "the f-DP one-run bound", column="epsilon_audited_fdp",
      aggregate="max", private_only=True, mlflow=True, legacy=("audit_epsilon_fdp",)),
    F("epsilon_audited_fdp_gdp", "privacy", NUM + OPT, "the f-DP estimate under the Gaussian assumption",
      private_only=True, mlflow=True, legacy=("audit_epsilon_fdp_gdp",)),
    F("epsilon_audited_legacy", "privacy", NUM + OPT, "the earlier estimator on the same canaries",
      private_only=True, legacy=("audit_epsilon_legacy",)),
    F("epsilon_audited_curve", "privacy", NUM + OPT, "lower bound within the certified event's family",
      column="epsilon_audited_curve", header="eps curve", group="audit", aggregate="max", private_only=True,
      mlflow=True, legacy=("audit_epsilon_curve",), places=2, rounding="down"),
    F("epsilon_audited_noise", "privacy", NUM + OPT, "lower bound read off the noise the run added",
      column="epsilon_audited_noise", header="eps noise", group="audit", aggregate="max", private_only=True,
      mlflow=True, legacy=("audit_epsilon_noise",), places=2, rounding="down"),
    F("audit_ceiling", "privacy", NUM + OPT, "what the same analysis reaches on the certified mechanism",
      column="audit_ceiling", header="ceiling", group="audit", private_only=True, mlflow=True, abbr="ceil.",
      places=2),
    F("audit_ceiling_steinke", "privacy", NUM + OPT, "the ceiling of Steinke's bound", private_only=True),
    F("audit_ceiling_fdp", "privacy", NUM + OPT, "the ceiling of the f-DP bound", private_only=True),
    F("audit_ceiling_guess_counts", "privacy", list, "guess counts planned on the simulation", private_only=True),
    F("audit_ceiling_noise", "privacy", NUM + OPT, "how far one run's bound lies above the ceiling by chance (one "
      "standard deviation of its right guesses)", private_only=True),
    F("audit_above_ceiling", "privacy", (bool, type(None)), "the audited epsilon exceeds the ceiling by more than "
      "its noise: the run leaks more than certified, or the audit is not valid", column="audit_above_ceiling",
      header="> ceiling", group="audit", aggregate="max", private_only=True, sparse=True),
    F("audit_noise_skipped", "privacy", (str, type(None)), "why no epsilon was read off the measured noise",
      private_only=True),
    F("audit_noise_discarded", "privacy", (str, type(None)), "a noise reading the Gaussian-model guard set aside, "
      "what it read and why", private_only=True, sparse=True),
    F("audit_noise_checks", "privacy", list, "the noise checks that ran on the excluded canaries' residuals (scale, "
      "step scale, scale across steps, lag k, partial sums L)", private_only=True),
    F("audit_noise_checks_skipped", "privacy", (str, type(None)), "why the noise checks did not run",
      private_only=True),
    F("audit_step_probe_push", "privacy", NUM + OPT, "the step audit's canary layer: how far a canary moved the "
      "release through the mechanism's own make_private, engine and hooks, in the plan's bound", private_only=True),
    F("audit_step_probe_p_value", "privacy", NUM + OPT, "the canary layer's p-value (push and noise checks, "
      "Bonferroni); the step audit's p-value is Bonferroni over it and the curve test", private_only=True),
    F("audit_step_probe_findings", "privacy", list, "what the canary layer found, in words", private_only=True),
    F("audit_step_probe_skipped", "privacy", (str, type(None)), "why the canary layer did not run",
      private_only=True),
    F("audit_step_probe_steps", "privacy", int, "the canary layer's steps", private_only=True),
    F("audit_step_probe_s", "privacy", NUM + OPT, "the canary layer's seconds (in audit_step_s)", private_only=True),
    F("audit_canary_push", "privacy", NUM + OPT, "how far a joining canary moved the release, in the plan's bound "
      "(at most 1 when the step clips as planned)", private_only=True, mlflow=True),
    F("audit_canary_push_se", "privacy", NUM + OPT, "the standard error of audit_canary_push", private_only=True),
    F("audit_findings", "privacy", list, "what the run's audits found that refutes the claim, in words (the audited "
      "epsilon above the ceiling beyond its noise, a failed noise check, a family bound or the input canaries' bound "
      "above the claim)",
      private_only=True),
    F("audit_violations", "privacy", list, "the same findings in a few words each (above ceiling, canaries pushed "
      "beyond the bound, noise below declared, noise repeats across steps, noise correlated across steps, family "
      "bound above claim, input canaries above claim)", private_only=True),
    F("audit_ceiling_tightness", "privacy", NUM + OPT, "ceiling / certified epsilon", private_only=True, mlflow=True),
    F("audit_tightness", "privacy", NUM + OPT, "audited / certified epsilon", private_only=True, mlflow=True),
    F("audit_canaries", "privacy", int, "canaries inserted", private_only=True, mlflow=True),
    F("audit_guesses", "privacy", int, "guesses of the bound", private_only=True),
    F("audit_statistic", "privacy", str, "canary score statistic", private_only=True),
    F("audit_steps", "privacy", int, "steps the canaries saw", private_only=True),
    F("audit_sigma_curve", "privacy", NUM + OPT, "noise multiplier of the family curve bound", private_only=True),
    F("audit_sigma_measured", "privacy", NUM + OPT, "noise multiplier measured on the run", private_only=True,
      mlflow=True),
    F("audit_sigma_measured_upper", "privacy", NUM + OPT, "its upper confidence limit", private_only=True),
    F("audit_noise_kurtosis", "privacy", NUM + OPT, "kurtosis of the measured noise", private_only=True),
    F("audit_run_violated", "privacy", bool, "an audit of the run refutes the claim (audit_findings says how)",
      private_only=True),
    F("audit_one_run_skipped", "privacy", str, "why the one-run audit did not run", private_only=True),
    F("audit_plan_s", "privacy", NUM, "seconds planning the audit", private_only=True, mlflow=True, unit="s"),
    F("audit_one_run_s", "privacy", NUM, "seconds the canaries spent in steps", private_only=True, mlflow=True,
      unit="s"),
    F("audit_estimate_s", "privacy", NUM, "seconds estimating the bounds", private_only=True, mlflow=True, unit="s"),
    F("audit_family_s", "privacy", NUM, "seconds of the family bounds", private_only=True, mlflow=True, unit="s"),
    # the input-canary audit: canaries that are examples, through the data, the model and the loss
    F("epsilon_audited_input", "privacy", NUM + OPT, "lower bound from the one-run audit with input canaries (real "
      "examples scored on the final model)", aggregate="max", private_only=True, mlflow=True, digits=2,
      rounding="down"),
    F("epsilon_audited_input_steinke", "privacy", NUM + OPT, "Steinke et al.'s bound on the input canaries",
      aggregate="max", private_only=True),
    F("epsilon_audited_input_fdp", "privacy", NUM + OPT, "the f-DP bound on the input canaries", aggregate="max",
      private_only=True),
    F("audit_input_canaries", "privacy", int, "input canaries drawn (each included with probability 1/2)",
      private_only=True, mlflow=True),
    F("audit_input_included", "privacy", int, "input canaries included in the run", private_only=True),
    F("audit_input_guesses", "privacy", int, "guesses of the input-canary bound", private_only=True),
    F("audit_input_rows", "privacy", int, "canary rows the run trained on (over all its steps)", private_only=True),
    F("audit_input_skipped", "privacy", str, "why the input-canary audit did not run", private_only=True),
    F("audit_input_s", "privacy", NUM, "seconds drawing, encoding and scoring the input canaries (their rows' "
      "training is in the steps)", private_only=True, mlflow=True, unit="s"),
    # black-box membership inference (every trial, non-private included)
    F("mia_auc", "privacy", NUM + OPT, "loss-threshold membership-inference AUC", column="mia_auc",
      header="MIA AUC", group="audit", mlflow=True, places=2),
    F("mia_tpr_at_0_1pct_fpr", "privacy", NUM + OPT, "its true-positive rate at 0.1% false positives",
      column="mia_tpr_at_0_1pct_fpr", mlflow=True, legacy=("mia_tpr_at_0.1%_fpr", "mia_tpr_at_0.1pct_fpr")),
    F("mia_tpr_at_1pct_fpr", "privacy", NUM + OPT, "its true-positive rate at 1% false positives", mlflow=True,
      legacy=("mia_tpr_at_1%_fpr",)),
    F("mia_examples", "privacy", int, "members (and non-members) attacked"),
    F("mia_attack", "privacy", str, "the attack"),
    F("mia_s", "privacy", NUM, "seconds of the attack", mlflow=True, unit="s"),
    F("audit_s", "privacy", NUM, "seconds of the run-level audits", column="audit_s", mlflow=True, unit="s"),
    F("audit_time_ratio", "privacy", NUM + OPT, "run time with the audits over without", column="audit_time_ratio",
      header="audit x", group="audit", mlflow=True, unit="x", label="audit time", abbr="audit", places=2),
    # the one-step (mechanism-level) audit
    F("epsilon_audited_step", "privacy", NUM + OPT, "one un-subsampled step's audited epsilon; not comparable "
      "to run epsilons", column="epsilon_audited_step", aggregate="max", private_only=True, mlflow=True),
    F("mu_audited", "privacy", NUM + OPT, "one step's audited GDP mu (lower bound)", column="mu_audited",
      aggregate="max", private_only=True, mlflow=True, places=2, rounding="down"),
    F("mu_claimed", "privacy", NUM + OPT, "one step's claimed GDP mu", column="mu_claimed", private_only=True,
      mlflow=True, places=2, rounding="up"),
    F("audit_step_violated", "privacy", bool, "the step audit refutes the claimed trade-off", private_only=True),
    F("audit_step_curve", "privacy", str, "the claimed trade-off curve", private_only=True),
    F("audit_step_s", "privacy", NUM, "seconds of the step audit", private_only=True, mlflow=True, unit="s"),
    F("audit_step_p_value", "privacy", NUM + OPT, "p-value of the step audit's verdict (Holm-corrected over a sweep)",
      private_only=True, mlflow=True),
    F("audit_step_significance", "privacy", NUM + OPT, "the significance the step verdict was taken at",
      private_only=True),
    F("claim_status_without_step", "privacy", (str, type(None)), "the verdict without the step audit (a sweep "
      "applies Holm to the step audits' p-values on top of it)", private_only=True),
    F("private", "privacy", bool, "whether the trial claims any privacy (TrialConfig.private; see is_private)",
      column="private", aggregate="first"),
    # a tuned candidate's (workers/tuning_candidates.py; docs/accountants.md "Hyperparameter tuning")
    F("epsilon_certified_run", "privacy", NUM + OPT, "one candidate's certified (PLD) epsilon, worst over the "
      "space's privacy settings", private_only=True, mlflow=True),
    F("epsilon_certified_tuned", "privacy", NUM + OPT, "the whole selection's epsilon (RDP, Papernot & Steinke)",
      private_only=True, mlflow=True),
    F("tuning_epsilon_run_rdp", "privacy", NUM + OPT, "one candidate's epsilon by RDP (tells the tuning overhead "
      "from RDP's looseness)", private_only=True),
    F("tuning_runs", "privacy", int, "K: the candidates the cell drew"),
    F("tuning_mean", "privacy", NUM, "the mean of the run-count distribution"),
    F("tuning_distribution", "privacy", str, "the run-count distribution, e.g. poisson(mean 8)"),
    F("tuning_budget", "privacy", str, "total or per-run"),
    F("tuning_cell", "privacy", str, "the cell's trial key"),
    F("tuning_candidate", "privacy", int, "the candidate's index among the cell's K"),
    F("tuning_params", "privacy", dict, "the drawn settings"),

    # derived: leaderboard columns computed over a row's seeds, not stored in a record
    F("metric", "derived", str, "the utility metric's name", column="metric"),
    F("utility_mean", "derived", NUM + OPT, "utility, mean over seeds", column="utility_mean", header="utility",
      group="core"),
    F("utility_std", "derived", NUM + OPT, "utility, std over seeds", column="utility_std"),
    F("mu_claimed_audited", "derived", str, "mu claimed / audited of one step", header="mu claimed/audited",
      group="audit", abbr="mu cl./aud."),

    F("audit_violation", "derived", (str, type(None)), "what refutes the claim in a few words, over the seeds (the "
      "records' audit_violations; 'above ceiling' for records older than them): why a row is violated",
      column="audit_violation", header="violation", group="core", aggregate="none", sparse=True),
    F("n_finished", "derived", int, "finished trials", column="n_finished", header="runs", group="core", abbr="n"),
    F("n_failed", "derived", int, "failed trials", column="n_failed"),
    F("batch_size", "derived", (int, type(None)), "config.train.batch_size", column="batch_size"),
    F("pareto", "derived", bool, "an ok row no other ok row beats on both utility and epsilon", column="pareto",
      header="pareto", group="privacy"),
    F("tuning", "derived", (str, type(None)), "a tuned cell's epsilon including tuning, or 'best of N, tuning "
      "unaccounted' for a cell compared at several training settings (dashboards/tuned_cells.py)", column="tuning",
      aggregate="none"),
)

DISPLAY_ORDER = (  # the text tables' column order (by header); `--columns all` shows every one
    "dataset", "model", "mechanism", "eps target", "utility", "eps claimed", "eps certified", "eps audited",
    "eps curve", "eps noise", "ceiling", "> ceiling", "MIA AUC", "audit x", "mu claimed/audited", "status",
    "violation", "sigma", "step x", "peak MB", "mem x", "ex/s", "plan s", "accel s", "analysis s", "runs", "pareto",
)


def fields(section: str | None = None) -> tuple[Field, ...]:
    return tuple(f for f in FIELDS if section is None or f.section == section)


def field(section: str, key: str) -> Field:
    for f in FIELDS:
        if f.section == section and f.key == key:
            return f
    raise KeyError(f"{section}.{key} is not a declared record field")


def keys(section: str) -> frozenset[str]:
    return frozenset(f.key for f in FIELDS if f.section == section)


def columns() -> tuple[Field, ...]:
    """The leaderboard's fields (CSV / JSON export), in declaration order."""
    return tuple(f for f in FIELDS if f.column)


def displayed() -> tuple[Field, ...]:
    """The text tables' columns, in display order."""
    by_header = {f.header: f for f in FIELDS if f.header}
    return tuple(by_header[h] for h in DISPLAY_ORDER)


def by_header(header: str) -> Field:
    """The displayed field of that text-table header."""
    return next(f for f in displayed() if f.header == header)


def utility_field(metric: str) -> Field:
    """How a utility metric (a `metrics` field, e.g. accuracy) is labelled and shown: with UTILITY_PLACES
    decimals unless the schema says otherwise; a metric the schema does not declare under its own name."""
    known = {f.key: f for f in FIELDS if f.section == "metrics"}
    f = known.get(metric) or Field(metric, "metrics", NUM + OPT, "a utility metric of the records")
    return f if f.places is not None else dataclasses.replace(f, places=UTILITY_PLACES)


_ROUND = {"nearest": decimal.ROUND_HALF_EVEN, "up": decimal.ROUND_CEILING, "down": decimal.ROUND_FLOOR}


def shown(x: float, f: Field) -> str:
    """`x` as every output writes quantity `f`: with `f.places` decimals (else `f.digits` significant digits,
    trailing zeros dropped), rounded the field's way (up for upper bounds, down for lower bounds: a shown
    epsilon never under-reports). Percent fields are scaled by 100 (the caller adds the unit). Large numbers
    stay whole (15900, not 1.59e+04)."""
    if math.isinf(x) or math.isnan(x):
        return str(x)
    x = x * 100 if f.percent else x
    places = f.places
    if places is None:
        places = max(0, f.digits - 1 - math.floor(math.log10(abs(x)))) if x else 0
    rounded = decimal.Decimal(repr(float(x))).quantize(decimal.Decimal(1).scaleb(-places), rounding=_ROUND[f.rounding])
    text = str(abs(rounded) if rounded == 0 else rounded)  # no "-0.00"
    return text.rstrip("0").rstrip(".") if f.places is None and "." in text else text


def mlflow_metrics(section: str) -> tuple[Field, ...]:
    return tuple(f for f in FIELDS if f.section == section and f.mlflow)


def value(section_values: Mapping[str, Any], f: Field) -> Any:
    """The field's value in a record section, under its name or (records of older stores) a legacy one."""
    if f.key in section_values:
        return section_values[f.key]
    return next((section_values[k] for k in f.legacy if k in section_values), None)


def undeclared(record: Mapping[str, Any]) -> dict[str, list[str]]:
    """Per section, the record keys the schema does not declare (a test keeps this empty for real trials)."""
    parts = {"record": record} | {s: record.get(s) or {} for s in SECTIONS if s not in ("record", "derived")}
    return {s: sorted(set(values) - keys(s)) for s, values in parts.items() if set(values) - keys(s)}


IDENTITY = ("dataset", "model", "mechanism", "eps target")  # every table's, whatever else is chosen


def select(spec: str) -> tuple[str, ...]:
    """`--columns core,audit` -> the groups it names ('all': every group), core always among them; single
    columns by their header (`eps claimed`) or field name (`epsilon_claimed`) name only themselves, beside
    the identity columns (`--columns utility,eps claimed,eps certified,eps audited`: a paper's table).
    ValueError on an unknown name."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError("--columns needs at least one group or column")
    headers = {f.header: f.header for f in displayed()} | {f.column: f.header for f in displayed() if f.column}
    bad = [n for n in names if n not in (*GROUPS, "all") and n not in headers]
    if bad:
        raise ValueError(f"unknown column group or column {bad[0]!r}; groups: {', '.join((*GROUPS, 'all'))}; "
                         f"columns: {', '.join(h for h in DISPLAY_ORDER if h not in IDENTITY)}")
    if "all" in names:
        return GROUPS
    singles = [headers[n] for n in names if n not in GROUPS]
    return tuple(dict.fromkeys([*([] if singles else ["core"]), *(n for n in names if n in GROUPS), *singles]))


def is_private(record: Mapping[str, Any]) -> bool:
    """Whether a trial claims privacy, as its worker decided (`TrialConfig.private`, written as the record's
    `private`); for a record written before that field or a trial that failed before it was written, the same
    rule on the record's config: the grid gave it a target epsilon or a sigma (tests/storage/test_schema.py
    holds the two to the same answer)."""
    privacy = record.get("privacy") or {}
    if isinstance(privacy.get("private"), bool):
        return privacy["private"]
    config = record.get("config") or {}
    return config.get("epsilon") is not None or config.get("sigma") is not None
