"""`privbench privacy epsilon|sigma|agm`: accounting and noise calibration from the command line.

Exit codes: 0 ok; 2 invalid input (sigma <= 0, q outside (0, 1], steps < 1, delta outside (0, 1), an
unknown accountant, an epsilon no sigma reaches), reported as one line on stderr. `--json` prints one
JSON object on stdout (non-finite numbers as null); otherwise a rich table.
Numbers are parsed here rather than by Click so that every bad value gives the same one-line error.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

import typer
from rich.table import Table

from orchestrator.console import err, out, styled
from orchestrator.lazy import lazy

analytic_gaussian = lazy("mechanisms.accounting.analytic_gaussian")
compare = lazy("mechanisms.accounting.compare")

app = typer.Typer(help="Privacy accounting and noise calibration.", no_args_is_help=True)

ACCOUNTANT_HELP = "An accountant (`privbench list accountants`: sound ones, the papers' claims, plugins), or all."


# The PLD of 10^8 Poisson steps takes about 20 s and 0.5 GB; 10^9, two minutes and 3 GB; 10^11 asks for 45 GB.
STEPS_MAX = 100_000_000


class _Invalid(ValueError):
    """Bad user input: printed as one line, exit 2."""


def _number(name: str, text: str | None, kind: type = float, required: bool = False) -> Any:
    if text is None:
        if required:
            raise _Invalid(f"--{name} is required")
        return None
    if len(text) > 100:  # a 5,000-digit integer would stop int() itself
        raise _Invalid(f"--{name}: a number of {len(text)} characters is out of range")
    try:
        value = kind(text)
    except ValueError:
        raise _Invalid(f"--{name} must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and math.isnan(value):
        raise _Invalid(f"--{name} must be a number, got {text!r}")
    return value


def _finite(value: Any) -> Any:
    """JSON has no inf/nan: report them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _emit_json(obj: dict[str, Any]) -> None:
    typer.echo(json.dumps(_finite(obj)))


def _fail(message: str) -> typer.Exit:
    err.print(styled("[bold red]error:[/] {message}", message=message), soft_wrap=True)
    return typer.Exit(code=2)


def _said(e: BaseException) -> str:
    """A bad value's error in one line; an arithmetic failure says the numbers are out of range."""
    if isinstance(e, ValueError):
        return str(e)
    return f"the numbers given are out of the range this accountant computes ({type(e).__name__}: {e})"


def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if math.isinf(value):
        return "inf"
    return f"{value:.{digits}f}" if abs(value) < 1e5 else f"{value:.4g}"


def _setting(sample_rate: str | None, steps: str | None, delta: str | None, sampler: str,
             dataset_size: str | None, dim: str | None, batch_clip_ratio: str | None,
             batch_size: str | None, delta_split: str, epochs: str | None = None) -> compare.DpsgdSetting:
    """The run's geometry as a trial states it (--dataset-size N --batch-size B --epochs E, any sampler),
    or Poisson sampling by rate and steps (--sample-rate q --steps T): the same sampler objects and parts
    a trial's plan uses, so both give the trial's certified epsilon."""
    claims = {"dim": _number("dim", dim), "batch_clip_ratio": _number("batch-clip-ratio", batch_clip_ratio),
              "delta_split": _number("delta-split", delta_split)}
    delta_value = _number("delta", delta, required=True)
    if epochs is not None:
        if sample_rate is not None or steps is not None:
            raise _Invalid("give either --dataset-size/--batch-size/--epochs or --sample-rate/--steps, not both")
        n, b, e = (_number("dataset-size", dataset_size, int, required=True),
                   _number("batch-size", batch_size, int, required=True), _number("epochs", epochs, int))
        if n > 0 and b > 0 and e > 0:
            _steps_bound("--epochs x --dataset-size / --batch-size", e * max(1, round(n / b)))
        return compare.DpsgdSetting.of(sampler, n, b, e, delta_value, **claims)
    if sampler != "poisson":
        raise _Invalid(f"the {sampler} sampler needs the trial's geometry: --dataset-size, --batch-size and "
                       "--epochs")
    steps_value = _number("steps", steps, int, required=True)
    _steps_bound("--steps", steps_value)
    return compare.DpsgdSetting.poisson(_number("sample-rate", sample_rate, required=True), steps_value,
                                        delta_value, batch_size=_number("batch-size", batch_size, int), **claims)


def _steps_bound(what: str, steps: int) -> None:
    if steps > STEPS_MAX:
        raise _Invalid(f"{what} gives {steps:,} steps; at most {STEPS_MAX:,} are accounted here")


def _sigma(text: str | None) -> float:
    """The noise multiplier, at least `SIGMA_FLOOR` as in a grid (below it the accountants overflow)."""
    from mechanisms.accounting.validation import SIGMA_FLOOR  # lazy: keeps privbench --help light

    value = _number("sigma", text, required=True)
    if value < SIGMA_FLOOR:
        raise _Invalid(f"--sigma must be at least {SIGMA_FLOOR:g}, got {value:g}")
    return value


def _names(setting: compare.DpsgdSetting, accountant: str) -> tuple[str, ...]:
    if accountant == "all":
        return compare.applicable(setting)
    if accountant not in compare.accountants():
        raise _Invalid(f"unknown accountant {accountant!r}; known: {', '.join(compare.accountants())}, all")
    return (accountant,)


def _setting_fields(setting: compare.DpsgdSetting) -> dict[str, Any]:
    fields = {"delta": setting.delta, "sample_rate": setting.sample_rate, "steps": setting.steps,
              "sampler": setting.sampler, "adjacency": setting.adjacency}
    for name in ("dataset_size", "epochs", "dim", "batch_clip_ratio", "batch_size"):
        if getattr(setting, name) is not None:
            fields[name] = getattr(setting, name)
    if "fenton_wilkinson" in compare.applicable(setting):
        fields["delta_split"] = setting.delta_split
    return fields


def _caption(setting: compare.DpsgdSetting, extra: str) -> str:
    return (f"{extra}, q={setting.sample_rate:g}, T={setting.steps}, delta={setting.delta:g}, "
            f"sampler={setting.sampler} ({setting.adjacency})")


SampleRate = Annotated[str | None, typer.Option("--sample-rate", help="Poisson sampling rate q in (0, 1] "
                                                                   "(with --steps).")]
Steps = Annotated[str | None, typer.Option("--steps", help="Number of Poisson steps T >= 1 (with --sample-rate).")]
Epochs = Annotated[str | None, typer.Option("--epochs", help="Epochs E, with --dataset-size N and --batch-size B: "
                                                             "the steps a trial runs, E * round(N / B), for any "
                                                             "sampler.")]
Delta = Annotated[str | None, typer.Option("--delta", help="Target delta in (0, 1).")]
Accountant = Annotated[str, typer.Option("--accountant", help=ACCOUNTANT_HELP)]
Sampler = Annotated[str, typer.Option("--sampler", help="poisson, fixed, shuffle or fixed-order (the last three "
                                                         "need --dataset-size, --batch-size and --epochs; "
                                                         "replace-one adjacency).")]
DatasetSize = Annotated[str | None, typer.Option("--dataset-size", help="N, the training examples.")]
Dim = Annotated[str | None, typer.Option("--dim", help="Model dimension d (Fenton-Wilkinson claim).")]
BatchClip = Annotated[str | None, typer.Option("--batch-clip-ratio", help="c'/c of shuffled DP-SGD.")]
BatchSize = Annotated[str | None, typer.Option("--batch-size", help="Batch size B (also c'/c without batch "
                                                                   "clipping, for Fenton-Wilkinson).")]
DeltaSplit = Annotated[str, typer.Option("--delta-split", help="Share of delta for advanced composition's "
                                                               "slack (Fenton-Wilkinson).")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


@app.command("epsilon")
def epsilon_cmd(
    sigma: Annotated[str | None, typer.Option("--sigma", help="Noise multiplier > 0.")] = None,
    sample_rate: SampleRate = None, steps: Steps = None, delta: Delta = None,
    accountant: Accountant = "pld", sampler: Sampler = "poisson", dataset_size: DatasetSize = None,
    epochs: Epochs = None, dim: Dim = None, batch_clip_ratio: BatchClip = None, batch_size: BatchSize = None,
    delta_split: DeltaSplit = "0.5", json_out: JsonOut = False,
) -> None:
    """Epsilon of DP-SGD at noise multiplier SIGMA, per accountant (sound and claimed): the certified (pld)
    value equals a trial plan's epsilon_certified for the same sampler and geometry."""
    try:
        sigma_value = _sigma(sigma)
        setting = _setting(sample_rate, steps, delta, sampler, dataset_size, dim, batch_clip_ratio,
                           batch_size, delta_split, epochs)
        names = _names(setting, accountant)
        reports = {name: compare.epsilon_of(setting, sigma_value, name) for name in names}
    except (ValueError, ArithmeticError, MemoryError) as e:
        raise _fail(_said(e)) from None
    fields = {"sigma": sigma_value, **_setting_fields(setting)}
    if json_out:
        if accountant == "all":
            _emit_json({"accountant": "all", "epsilons": {n: r.epsilon for n, r in reports.items()},
                        "computed_by": {n: r.computed_by for n, r in reports.items()},
                        "notes": {n: r.note for n, r in reports.items() if r.note},
                        "kinds": {n: compare.kinds()[n] for n in reports}, **fields})
        else:
            report = reports[accountant]
            _emit_json({"accountant": accountant, "epsilon": report.epsilon, "computed_by": report.computed_by,
                        "note": report.note, "kind": compare.kinds()[accountant], **fields})
        return
    table = Table(title="Epsilon by accountant", caption=_caption(setting, f"sigma={sigma_value:g}"))
    for column in ("accountant", "epsilon", "kind", "note"):
        table.add_column(column, justify="right" if column == "epsilon" else "left")
    for name, report in reports.items():
        table.add_row(name, _fmt(report.epsilon), compare.kinds()[name].split(":")[0], report.note)
    out.print(table)


@app.command("sigma")
def sigma_cmd(
    epsilon: Annotated[str | None, typer.Option("--epsilon", help="Target epsilon > 0.")] = None,
    sample_rate: SampleRate = None, steps: Steps = None, delta: Delta = None,
    accountant: Accountant = "pld", sampler: Sampler = "poisson", dataset_size: DatasetSize = None,
    epochs: Epochs = None, dim: Dim = None, batch_clip_ratio: BatchClip = None, batch_size: BatchSize = None,
    delta_split: DeltaSplit = "0.5",
    rel_tol: Annotated[str, typer.Option("--rel-tol", help="Relative tolerance of the sigma grid.")] = "1e-3",
    json_out: JsonOut = False,
) -> None:
    """Smallest noise multiplier whose epsilon is <= EPSILON (never above), per accountant."""
    try:
        target = _number("epsilon", epsilon, required=True)
        tol = _number("rel-tol", rel_tol)
        setting = _setting(sample_rate, steps, delta, sampler, dataset_size, dim, batch_clip_ratio,
                           batch_size, delta_split, epochs)
        names = _names(setting, accountant)
        results = {name: compare.sigma_for(setting, target, name, tol) for name in names}
    except (ValueError, ArithmeticError, MemoryError) as e:
        raise _fail(_said(e)) from None
    fields = {"epsilon_target": target, "rel_tol": tol, **_setting_fields(setting)}
    if json_out:
        if accountant == "all":
            _emit_json({"accountant": "all",
                        "sigmas": {n: {"sigma": c.sigma, "epsilon": c.epsilon, "note": c.note}
                                   for n, c in results.items()}, **fields})
        else:
            c = results[accountant]
            _emit_json({"accountant": accountant, "sigma": c.sigma, "epsilon": c.epsilon, "note": c.note,
                        "evaluations": c.evaluations, "kind": compare.kinds()[accountant], **fields})
        return
    table = Table(title="Noise multiplier by accountant", caption=_caption(setting, f"target epsilon={target:g}"))
    for column in ("accountant", "sigma", "achieved epsilon", "kind", "note"):
        table.add_column(column, justify="right" if column in ("sigma", "achieved epsilon") else "left")
    for name, c in results.items():
        table.add_row(name, _fmt(c.sigma, 5), _fmt(c.epsilon), compare.kinds()[name].split(":")[0], c.note)
    out.print(table)


@app.command("agm")
def agm_cmd(
    epsilon: Annotated[str | None, typer.Option("--epsilon", help="Target epsilon > 0 (gives sigma).")] = None,
    delta: Delta = None,
    sensitivity: Annotated[str, typer.Option("--sensitivity", help="L2 sensitivity S > 0.")] = "1.0",
    sigma: Annotated[str | None, typer.Option("--sigma", help="Noise std (gives epsilon instead).")] = None,
    releases: Annotated[str, typer.Option("--releases", help="k identical releases composed (aMGM: "
                                                              "sigma grows by sqrt(k)).")] = "1",
    json_out: JsonOut = False,
) -> None:
    """Analytic Gaussian / aMGM noise: sigma for (EPSILON, DELTA, S), or epsilon for SIGMA."""
    try:
        eps = _number("epsilon", epsilon)
        sig = _number("sigma", sigma)
        d = _number("delta", delta, required=True)
        s = _number("sensitivity", sensitivity)
        k = _number("releases", releases, int)
        if (eps is None) == (sig is None):
            raise _Invalid("give exactly one of --epsilon and --sigma")
        if k < 1:
            raise _Invalid(f"--releases must be >= 1, got {k}")
        if eps is not None:
            sig = analytic_gaussian.amgm_sigma(eps, d, s, k)
        else:
            eps = analytic_gaussian.agm_epsilon(sig / math.sqrt(k), d, s)
        bound = analytic_gaussian.analytic_bound(eps, d)
    except (ValueError, ArithmeticError, MemoryError) as e:
        raise _fail(_said(e)) from None
    result = {"sigma": sig, "epsilon": eps, "delta": d, "sensitivity": s, "releases": k,
              "bound": bound.value, "delta0": bound.delta0, "branch": bound.branch}
    if json_out:
        _emit_json(result)
        return
    table = Table(title="Analytic Gaussian mechanism (aMGM with i.i.d. noise)")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, value if isinstance(value, str) else f"{value:.6g}")
    out.print(table)
