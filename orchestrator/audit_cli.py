"""`privbench audit MECHANISM`: audit one privatisation step of a mechanism empirically.

Exit codes: 0 audit ran (whatever the verdict), 1 the mechanism failed while being audited,
2 invalid input (unknown mechanism, bad numbers), one line on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from orchestrator.console import err, out, styled
from orchestrator.lazy import lazy

if TYPE_CHECKING:
    from mechanisms.auditing.step_audit import StepAudit
    from mechanisms.parts.plan import PrivacySpec

mechanisms = lazy("mechanisms")
hooks = lazy("mechanisms.auditing.hooks")
_sampling = lazy("mechanisms.auditing.sampling")
_step_audit = lazy("mechanisms.auditing.step_audit")

class _Invalid(ValueError):
    """Bad user input: printed as one line, exit 2."""


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(styled("[bold red]error:[/] {message}", message=message), soft_wrap=True)
    return typer.Exit(code=code)


def _number(name: str, text: str | None, kind: type) -> Any:
    """Parse one numeric option ourselves, so that a bad number is one line and exit 2."""
    if text is None:
        return None
    try:
        return kind(text)
    except ValueError:
        raise _Invalid(f"--{name} must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None


def _parse_options(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs; VALUE is read as JSON when it parses (numbers, true/false), else as a string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise _Invalid(f"--option expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _bound(cls: type, field: str, option: str, value: Any) -> None:
    """`value` checked against the bounds a grid's setting of the same meaning has (workers/config.py)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == field)
    if problem := f.metadata["bounds"].problem(f"--{option}", value, integer=True):
        raise _Invalid(problem)


def _step_setting(sigma: float | None, epsilon: float | None, delta: float, clip: float) -> PrivacySpec:
    """The audited step's privacy setting (`profile.step_spec`), checked where it is made (sigma or a target
    epsilon, delta, clip), with a grid's floor on sigma."""
    from mechanisms.accounting.validation import SIGMA_FLOOR  # lazy: keeps privbench --help light
    from mechanisms.auditing.profile import step_spec  # lazy: keeps privbench --help light

    if sigma is not None and epsilon is not None:
        raise _Invalid("give --sigma or --epsilon, not both")
    try:
        setting = step_spec(sigma, delta, epsilon=epsilon, clip=clip)
    except ValueError as e:
        raise _Invalid(f"--{e}") from None
    if sigma is not None and sigma < SIGMA_FLOOR:
        raise _Invalid(f"--sigma must be at least {SIGMA_FLOOR:g}, got {sigma:g}")
    return setting


def _validate(samples: int, dim: int, seed: int, path: str) -> None:
    from workers.config import AuditConfig, TrialConfig  # lazy: keeps privbench --help light

    _bound(AuditConfig, "samples", "samples", samples)  # a grid's audit caps them alike (memory grows with them)
    _bound(AuditConfig, "dim", "dim", dim)
    _bound(TrialConfig, "seed", "seed", seed)
    if path not in _sampling.PATHS:
        raise _Invalid(f"--path must be one of {', '.join(_sampling.PATHS)}, got {path!r}")


def _fmt(value: float | None, digits: int = 4) -> str:
    return "null" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def _p(value: float) -> str:
    return "<1e-300" if value <= 1e-300 else f"{value:.3g}"


def _table(result: StepAudit) -> Table:
    level = f"{1 - result.significance:.1%}".replace(".0%", "%")
    table = Table(title=f"audit of {result.mechanism}: one step, sigma={_fmt(result.sigma)}, "
                        f"delta={result.delta:g}, dim={result.dim}, {result.samples} samples/side")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        ("claimed curve", result.claimed_curve or "none"),
        ("epsilon_claimed (one step)", _fmt(result.epsilon_claimed)),
        ("epsilon_certified (one step)", _fmt(result.epsilon_certified)),
        (f"epsilon_audited ({level} lower bound)", _fmt(result.epsilon_audited)),
        ("mu_claimed", _fmt(result.mu_claimed)),
        (f"mu_audited ({level} lower bound)", _fmt(result.mu_audited)),
        (f"measured point below claimed curve (p <= {result.significance:g})", "yes" if result.violated else "no"),
        ("p_value (H0: the claim holds)", _p(result.p_value)),
        ("claim_status", result.claim_status or "null (not private)"),
    ]
    rows += [(f"case {c.case} ({c.path})", f"eps {_fmt(c.epsilon_audited)}, mu {_fmt(c.mu_audited)}"
              + (", violated" if c.violated else "")) for c in result.cases]
    rows.append(("wall time", f"{result.wall_s:.2f} s"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def audit(
    mechanism: str = typer.Argument(..., help="Mechanism id (see `privbench list mechanisms`)."),
    sigma: str | None = typer.Option(None, "--sigma", metavar="S", help="Noise multiplier (default 1.0)."),
    epsilon: str | None = typer.Option(
        None, "--epsilon", metavar="E",
        help="Pick sigma so that the mechanism's claimed ONE-step epsilon at --delta is E."),
    samples: str = typer.Option("20000", "--samples", metavar="N",
                                help="Independent releases per side (and per case)."),
    delta: str = typer.Option("1e-5", "--delta", metavar="D", help="Delta at which epsilons are reported."),
    dim: str = typer.Option("1000", "--dim", metavar="D", help="Dimension of the audited step."),
    clip: str = typer.Option("1.0", "--clip", metavar="C", help="Clipping norm C (the canary's norm)."),
    seed: str = typer.Option("0", "--seed", metavar="SEED", help="Seed of the canaries and of every sample."),
    path: str = typer.Option("auto", "--path", help="auto | full | support (see docs/auditing.md)."),
    option: list[str] = typer.Option([], "--option", help="Mechanism option KEY=VALUE (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    plugins: list[str] = typer.Option([], "--plugins", metavar="MODULE",
                                      help="A plugin module to load first, as a grid's `plugins:` key does "
                                           "(repeatable)."),
) -> None:
    """Audit one privatisation step of MECHANISM: claimed vs certified vs audited epsilon.

    Releases with and without a worst-case canary of norm C, thresholds chosen on half, bounds on the rest at
    significance 0.001 (all together), privbench's one audit significance.

    violated: a measured (type I, type II) pair lies strictly below the claimed one-step trade-off curve,
    i.e. p_value <= 0.001; p_value is the smallest significance at which it would be.

    epsilon_claimed and epsilon_certified are those of ONE un-subsampled step at sigma and delta.
    """
    try:
        sigma_v, epsilon_v = _number("sigma", sigma, float), _number("epsilon", epsilon, float)
        samples_v, dim_v, seed_v = _number("samples", samples, int), _number("dim", dim, int), _number(
            "seed", seed, int)
        setting = _step_setting(sigma_v, epsilon_v, _number("delta", delta, float), _number("clip", clip, float))
        _validate(samples_v, dim_v, seed_v, path)
        options = _parse_options(option)
        if plugins:
            from workers import plugins as plugin_modules  # lazy: keeps privbench --help light

            plugin_modules.load(plugins, search=[Path.cwd()])
        module = mechanisms.get(mechanism)
        if problems := module.option_problems(options):  # as strict as a grid's mechanism_options
            raise _Invalid("; ".join(problems))
    except (_Invalid, mechanisms.UnknownName, mechanisms.PluginError) as e:
        raise _fail(str(e)) from None
    try:
        if setting.epsilon is not None:
            sigma_v = hooks.step_plan(module, dataclasses.replace(setting, options=options)).sigma
            if sigma_v is None:
                raise _fail(f"{mechanism} adds no noise: --epsilon cannot be met, use --sigma")
        audited = dataclasses.replace(setting, epsilon=None, sigma=1.0 if sigma_v is None else sigma_v,
                                      options=options)
        result = _step_audit.audit_step(module, audited, samples=samples_v, dim=dim_v, seed=seed_v, path=path)
    except typer.Exit:
        raise
    except ValueError as e:
        raise _fail(str(e)) from None
    except Exception as e:  # the mechanism itself failed: a runtime failure, not bad input
        raise _fail(f"auditing {mechanism} failed: {type(e).__name__}: {e}", code=1) from None
    record = result.as_record()
    if setting.epsilon is not None:
        record["epsilon_target"] = setting.epsilon
    if as_json:
        typer.echo(json.dumps(record))
    else:
        out.print(_table(result))
