"""Publication figures from a sweep's result records, one function per figure, each returning a
`matplotlib.figure.Figure`.

Figures are built with the object API (`Figure()`, never `pyplot`), so making one touches no global
state: a notebook's or another library's pyplot figures are left alone, and nothing needs a display.
`save()` writes PDF, SVG, PNG or PGF from the file suffix; `svg_text()` gives the SVG for embedding in
the HTML report.

Every figure takes the plain result records that `Store.records()` returns (one per trial, several
sweeps may be mixed: their lines are labelled `mechanism (sweep)`), so error bars are computed over
the seeds that really ran.

Each figure is laid out for the width it is made at (`width`, inches; `build` takes a venue's `single` or
`double` width, dashboards/venues.py): narrower than NARROW_IN, its panels stack in one column, share
their x axis, and the legend goes below; wider, panels sit side by side with the legend at the right.
Panel titles name the dataset / model only, and axis labels the quantity, so no title outgrows a column.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import math
import shutil
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from matplotlib import rc_context
from matplotlib.figure import Figure
from matplotlib.legend_handler import HandlerTuple
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import NullFormatter

from dashboards import tuned_cells as tuned
from dashboards.leaderboard import LeaderboardRow, honest, rows
from dashboards.venues import DEFAULT_VENUE, WIDTHS, venue
from storage import schema

KINDS = ("privacy-utility", "overhead", "curves", "verdicts")
FORMATS = ("pdf", "svg", "png", "pgf")
TUNING_KIND = "tuning"  # utility against epsilon per run and including tuning; not in KINDS (tuned sweeps only)

# Two colour sets that share no colour, from the Okabe-Ito and Tol palettes (distinguishable with the common
# colour-vision deficiencies): verdicts take green, orange, vermillion and grey, and mechanisms the rest. A
# mechanism's colour follows from its name alone, so it is the same in every figure of every sweep: the
# built-in mechanisms have theirs (mechanisms compared in one example grid never share one), any other name
# takes the palette's colour its name hashes to.
STATUS_COLOURS = {"ok": "#009E73", "overclaimed": "#E69F00", "violated": "#D55E00", "uncertified": "#999999"}
PALETTE = ["#0072B2", "#CC79A7", "#000000", "#56B4E9", "#882255", "#999933", "#332288", "#DDCC77"]
BUILT_IN_COLOURS = {
    "dpsgd": "#0072B2", "dpsgd-gdp": "#CC79A7", "gredp": "#000000", "dpsgd-shuffle-rdp": "#56B4E9",
    "dpsgd-fixed-order": "#882255", "dpftrl-tree": "#999933", "dp-bandmf": "#332288", "dp-bandmf-4": "#DDCC77",
    "shuffled-dpsgd": "#000000", "dp-forward": "#CC79A7", "dpsgd-adaclip": "#56B4E9",
}
# Type 42 (TrueType) fonts in PDF and PS: IEEE's and ACM's submission checks reject Type 3. No text is
# smaller than 8 pt (a figure at its width is printed at 100%).
RC = {"font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8, "legend.fontsize": 8,
      "xtick.labelsize": 8, "ytick.labelsize": 8, "legend.title_fontsize": 8, "svg.hashsalt": "privbench",
      "pdf.fonttype": 42, "ps.fonttype": 42}
SIZES = WIDTHS  # single: one column of a two-column paper; double: both (the venue says how wide)
NARROW_IN = 4.0  # narrower figures stack their panels and put the legend below
LINESTYLES = ["-", "--", ":", "-."]  # one per epsilon, beside the mechanism's colour
MARKERS = ["o", "s", "^", "D", "v", "P"]  # one per target epsilon in the overhead figure
# One meaning per colour across the figures: a mechanism keeps its colour in every figure of every sweep
# (`mechanism_colour`), non-private is grey everywhere, and epsilons are told apart by line style or marker.
NONPRIVATE_COLOUR = "0.4"
EPS = r"$\varepsilon$"  # the tables' symbol (LaTeX's \varepsilon), in mathtext


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _sweeps(records: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted({str(r.get("sweep")) for r in records if r.get("sweep") is not None})


def _groups(board: Iterable[LeaderboardRow]) -> list[tuple[str, str]]:
    return sorted({(r.dataset, r.model) for r in board})


def _label(row: LeaderboardRow, multi: bool) -> str:
    return f"{row.mechanism} ({row.sweep})" if multi and row.sweep else row.mechanism


def mechanism_colour(mechanism: str) -> str:
    """The colour of a private mechanism, from its name alone (stable across sweeps and figures)."""
    if mechanism in BUILT_IN_COLOURS:
        return BUILT_IN_COLOURS[mechanism]
    return PALETTE[int(hashlib.sha256(mechanism.encode()).hexdigest(), 16) % len(PALETTE)]


def mechanism_colours(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each line label (`mechanism`, or `mechanism (sweep)` with several sweeps: told apart by their markers,
    `sweep_marker`) of the records: a private mechanism's colour, non-private grey; the same in every figure."""
    multi = len(_sweeps(records)) > 1
    out: dict[str, str] = {}
    for r in records:
        mechanism = (r.get("config") or {}).get("mechanism")
        if mechanism is not None:
            label = f"{mechanism} ({r.get('sweep')})" if multi else mechanism
            private = schema.is_private(r) and out.get(label) != NONPRIVATE_COLOUR
            out[label] = mechanism_colour(mechanism) if private else NONPRIVATE_COLOUR
    return out


def sweep_marker(sweep: str | None, sweeps: Sequence[str]) -> str:
    """The marker of a sweep's points where several sweeps share a figure (a mechanism has one colour in all)."""
    return MARKERS[sweeps.index(sweep) % len(MARKERS)] if len(sweeps) > 1 and sweep in sweeps else "o"


def not_ok(members: Iterable[LeaderboardRow]) -> str:
    """The claim statuses other than `ok` of a line's rows, in words ('' when every row is ok): a figure
    names them beside the mechanism, as the tables do in their status column."""
    return ", ".join(sorted({r.claim_status or "no verdict" for r in members if not honest(r)}))


def utility_label(metric: str) -> tuple[str, float]:
    """(axis label, scale) of a utility metric as every table writes it: a percent field in % (`accuracy (%)`)."""
    f = schema.utility_field(metric)
    return (f"{metric.replace('_', ' ')} (%)", 100.0) if f.percent else (metric.replace("_", " "), 1.0)


def uninformative(kind: str, records: Sequence[Mapping[str, Any]]) -> str | None:
    """Why figure `kind` would tell nothing for these records (the report leaves it out with this line), or
    None: a verdicts grid where every verdict is `ok` is one colour."""
    if kind == "verdicts":
        statuses = {r.claim_status for r in rows(records) if r.private}
        if statuses == {"ok"}:
            return "Verdicts figure left out: every verdict is ok (the leaderboard's status column says so)."
    return None


def _styled(builder: Callable[..., Figure]) -> Callable[..., Figure]:
    """Build inside `rc_context(RC)`: text sizes are fixed when artists are made, and the caller's
    rcParams are restored afterwards (no global state changes)."""
    @functools.wraps(builder)
    def wrapped(*args: Any, **kwargs: Any) -> Figure:
        with rc_context(RC):
            return builder(*args, **kwargs)

    return wrapped


LEGEND_ROW_IN = 0.2  # height of one row of a legend below the panels


def _figure(n_panels: int, width: float | None, panel: tuple[float, float], legend: tuple[float, int],
            sharex: bool = False) -> tuple[Figure, list, bool]:
    """A figure of `n_panels` panels for `width` inches (None: its natural width, panels side by side).
    `panel`: a panel's natural (width, height); `legend`: (width of a legend at the right, its entries).
    Narrow: one column of panels, the legend below in two columns (height added for it); wide: as many
    panels per row as fit beside the legend. Returns the figure, its panels and whether it is narrow."""
    (panel_w, panel_h), (legend_w, entries) = panel, legend
    n = max(1, n_panels)
    width = width or panel_w * n + legend_w
    narrow = width < NARROW_IN
    if narrow:
        nrows, ncols = n, 1
        height = panel_h * n + LEGEND_ROW_IN * (math.ceil(entries / 2) + 0.5)
    else:
        ncols = max(1, min(n, int((width - legend_w) // (0.75 * panel_w))))
        nrows = math.ceil(n / ncols)
        height = panel_h * nrows
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=sharex).ravel().tolist()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes[:n_panels], narrow


def _legend(fig: Figure, handles: Sequence[Any], labels: Sequence[str], narrow: bool, **kwargs: Any) -> None:
    """The figure's one legend: at the right, or below in two columns when narrow (in one column, with the
    figure made taller for it, when two would be wider than the figure)."""
    ncols = 1
    if narrow:
        entry_pt = max([len(label) for label in labels] + [0]) * 0.58 * RC["legend.fontsize"] + 30  # handle + pad
        ncols = 2 if 2 * entry_pt + 16 <= fig.get_size_inches()[0] * 72 else 1
        if ncols == 1:
            w, h = fig.get_size_inches()
            fig.set_size_inches(w, h + LEGEND_ROW_IN * (len(labels) - math.ceil(len(labels) / 2)))
    fig.legend(handles, labels, loc="outside lower center" if narrow else "outside right upper", frameon=False,
               ncols=ncols, handler_map={tuple: HandlerTuple(ndivide=None)}, **kwargs)


def _empty(fig: Figure, message: str) -> Figure:
    fig.text(0.5, 0.5, message, ha="center", va="center")
    return fig


def _log_ticks(ax: Any, values: Sequence[float], left: float, right: float, width_in: float) -> None:
    """Tick the epsilon upper bounds that occur, each written as the tables write it (`8.11`, rounded up, never
    `8.1`) and placed at that value; where most rows sit first (the target, which several mechanisms share),
    at most 8, leaving out one that would crowd a kept label."""
    eps = schema.field("privacy", "epsilon_certified")
    counts = Counter(schema.shown(x, eps) for x in values)
    if not counts:
        return
    span = math.log10(right / left)
    kept: list[str] = []
    for label in sorted(counts, key=lambda t: (-counts[t], float(t))):
        if len(kept) < 8 and all(abs(math.log10(float(label) / float(k))) / span * width_in >= 0.3 for k in kept):
            kept.append(label)
    kept.sort(key=float)
    ax.set_xticks([float(t) for t in kept], kept)
    ax.xaxis.set_minor_formatter(NullFormatter())


@_styled
def privacy_utility(records: Sequence[Mapping[str, Any]], metric: str = "accuracy",
                    width: float | None = None) -> Figure:
    """Utility against certified epsilon (log x), one line per mechanism, one panel per dataset/model.

    Filled markers with error bars (std over seeds) sit at the certified epsilon; a hollow marker at the
    claimed epsilon is joined to it by a dotted line, so an over-optimistic claim shows as a visible gap.
    A translucent bar from the audited lower bound to the certified upper bound is the interval where
    the run's true epsilon lies; an audited bound of 0 (no evidence of leakage) has no place on a log axis,
    so its bar starts at the axis' left edge with an arrow head there. The non-private reference is a band
    (mean +- std). Mechanisms without a sound bound (uncertified) appear at their claimed epsilon only.
    A mechanism whose claim is not `ok` at some epsilon is drawn dashed and thinner, its statuses in words in
    the legend (`dpsgd-shuffle-rdp (overclaimed)`): only honest rows are drawn as contenders.
    """
    board = rows(records, metric=metric)
    sweeps = _sweeps(records)
    multi = len(sweeps) > 1
    groups = _groups(board)
    colours = {k: v for k, v in mechanism_colours(records).items() if k in {_label(r, multi) for r in board
                                                                              if r.private}}
    ylabel, scale = utility_label(metric)
    board = [dataclasses.replace(r, utility_mean=None if r.utility_mean is None else r.utility_mean * scale,
                                 utility_std=None if r.utility_std is None else r.utility_std * scale) for r in board]
    fig, axes, narrow = _figure(len(groups), width, (3.2, 2.6), (1.9, len(colours) + 4))
    if not groups:
        return _empty(fig, "no finished trials")
    legend: dict[str, Any] = {}
    unranked: dict[str, str] = {}  # line label -> the statuses, in words, of its rows whose claim is not ok
    zero_audit = False
    for ax, (dataset, model) in zip(axes, groups, strict=True):
        part = [r for r in board if (r.dataset, r.model) == (dataset, model) and r.utility_mean is not None]
        xs = [e for r in part for e in (r.epsilon_certified, r.epsilon_claimed) if _finite(e) and e > 0]
        audited = [r.epsilon_audited for r in part if _finite(r.epsilon_audited) and r.epsilon_audited > 0]
        left, right = (min(xs + audited) / 1.6, max(xs + audited) * 1.6) if xs else (0.1, 10.0)
        for r in part:
            if r.private:
                continue
            std = r.utility_std or 0.0
            ax.axhspan(r.utility_mean - std, r.utility_mean + std, color="0.85", zorder=0)
            ax.axhline(r.utility_mean, color="0.4", lw=1, ls="--", zorder=1)
        lines: dict[str, list[LeaderboardRow]] = defaultdict(list)
        for r in part:
            if r.private:
                lines[_label(r, multi)].append(r)
        for label, members in sorted(lines.items()):
            words = not_ok(members)
            if words:
                unranked[label] = words
            legend[label] = _mechanism_line(ax, members, colours[label], sweep_marker(members[0].sweep, sweeps),
                                            bool(words), left)
            zero_audit |= any(_finite(r.epsilon_audited) and r.epsilon_audited <= 0 and _finite(r.epsilon_certified)
                              for r in members)
        ax.set_xscale("log")
        ax.set_xlim(left, right)
        _log_ticks(ax, xs, left, right, (width or 3.2) * (0.75 if narrow else 0.7 / len(groups)))
        ax.set_xlabel(f"{EPS} (certified; hollow: claimed)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{dataset} / {model}")
        ax.grid(True, which="major", alpha=0.3)
        if any(not r.private for r in part):
            legend["~non-private (mean ± std)"] = Patch(facecolor="0.85", edgecolor="0.4", ls="--")
    shown = list(dict.fromkeys(colours[k] for k in sorted(colours) if k in legend))
    labels = [k.lstrip("~") + (f" ({unranked[k]})" if k in unranked else "") for k in sorted(legend)] + [
        f"claimed {EPS}", "audited to certified"]
    handles = [legend[k] for k in sorted(legend)] + [
        tuple(Line2D([], [], color=c, marker="o", mfc="white", mew=1.4, ls=":") for c in shown) or Line2D([], []),
        tuple(Line2D([], [], color=c, lw=6, alpha=0.22) for c in shown) or Line2D([], [])]
    if zero_audit:
        handles.append(tuple(Line2D([], [], color=c, marker="<", ls="none") for c in shown))
        labels.append("audited bound 0")
    _legend(fig, handles, labels, narrow)
    return fig


def _mechanism_line(ax: Any, members: Sequence[LeaderboardRow], c: str, m: str, dashed: bool, left: float) -> Line2D:
    """One mechanism's rows in a privacy-utility panel (`privacy_utility` says what each mark means): solid when
    every claim is ok, else dashed and thinner, never emphasised. Returns its legend handle."""
    style = {"lw": 1.0 if dashed else 1.4, "ls": "--" if dashed else "-"}
    cert = sorted((r for r in members if _finite(r.epsilon_certified)), key=lambda r: r.epsilon_certified)
    if cert:
        ax.errorbar([r.epsilon_certified for r in cert], [r.utility_mean for r in cert],
                    yerr=[r.utility_std or 0.0 for r in cert], color=c, marker=m, ms=4 if dashed else 5, capsize=2.5,
                    zorder=3, **style)
    for r in members:
        if _finite(r.epsilon_claimed) and r.epsilon_claimed > 0:
            ax.plot([r.epsilon_claimed], [r.utility_mean], marker=m, ms=8, mfc="white", mec=c,
                    mew=1.4, ls="none", zorder=2.5)  # a ring around the certified dot
            if _finite(r.epsilon_certified):
                ax.plot([r.epsilon_claimed, r.epsilon_certified], [r.utility_mean] * 2, color=c, ls=":", lw=1,
                        zorder=2)
        if _finite(r.epsilon_certified) and _finite(r.epsilon_audited):
            low = r.epsilon_audited if r.epsilon_audited > 0 else left
            ax.plot([low, r.epsilon_certified], [r.utility_mean] * 2, color=c, lw=6, alpha=0.22,
                    solid_capstyle="butt", zorder=2)
            if r.epsilon_audited <= 0:
                ax.plot([left * 1.04], [r.utility_mean], marker="<", ms=6, color=c, ls="none", zorder=2.6)
    return Line2D([], [], color=c, marker=m, **style)


def _per_trial(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        if r.get("status") != "finished":
            continue
        cfg, m = r["config"], r.get("metrics") or {}
        out.append({"sweep": r.get("sweep"), "dataset": cfg["dataset"], "model": cfg["model"],
                    "mechanism": cfg["mechanism"], "epsilon": cfg.get("epsilon"), "private": schema.is_private(r),
                    "peak_memory_mb": m.get("peak_memory_mb"),
                    "step_time_ratio": m.get("step_time_ratio")})
    return out


def _eps_label(eps: float | None) -> str:
    return "non-private" if eps is None else f"{EPS} {eps:g}"


@_styled
def overhead(records: Sequence[Mapping[str, Any]], width: float | None = None) -> Figure:
    """Step time relative to non-private and extra peak memory in MB, per mechanism: two panels per
    dataset/model (side by side, or stacked when narrow), titled with the dataset / model.

    Each dot is one trial, in its mechanism's colour, its marker saying its target epsilon (legend); a short bar
    marks the mean step-time ratio of a mechanism at one epsilon: the leaderboard's `step x`. The ratio is each
    trial's own paired measurement (`step_time_ratio`, private and non-private steps taken in turns in the
    trial); a private trial without one has no dot (never the ratio of two trials' medians, as in the
    leaderboard), and non-private trials sit at 1, the reference. Memory is each trial's own peak in MB, with no
    mean or error bar: a trial's figure depends on what its process allocated before (docs/commands.md), so an
    average over trials would suggest a precision the measurement does not have.
    """
    trials = _per_trial(records)
    multi = len(_sweeps(records)) > 1
    groups = sorted({(t["dataset"], t["model"]) for t in trials})
    epsilons = sorted({t["epsilon"] for t in trials}, key=lambda e: (e is not None, e or 0))
    fig, axes, narrow = _figure(2 * max(1, len(groups)), width, (3.4, 2.2), (1.1, len(epsilons)))
    if not trials:
        return _empty(fig, "no finished trials with timings")
    markers = {e: MARKERS[i % len(MARKERS)] for i, e in enumerate(epsilons)}
    colours = mechanism_colours(records)
    grow: dict[int, float] = {}  # per dataset/model: inches its mechanism labels need
    for gi, (dataset, model) in enumerate(groups):
        ax_t, ax_m = axes[2 * gi], axes[2 * gi + 1]
        part = [t for t in trials if (t["dataset"], t["model"]) == (dataset, model)]
        labels = sorted({f"{t['mechanism']} ({t['sweep']})" if multi else t["mechanism"] for t in part})
        step: dict[tuple, list[float]] = defaultdict(list)
        memory: dict[tuple, list[float]] = defaultdict(list)
        for t in part:
            label = f"{t['mechanism']} ({t['sweep']})" if multi else t["mechanism"]
            if _finite(t["step_time_ratio"]) or not t["private"]:  # the trial's own paired measurement, as the tables
                step[(label, t["epsilon"])].append(t["step_time_ratio"] if t["private"] else 1.0)
            if _finite(t["peak_memory_mb"]):
                memory[(label, t["epsilon"])].append(t["peak_memory_mb"])
        bar_width = 0.7 / max(1, len(epsilons))
        for ax, data, ylabel, bar in ((ax_t, step, r"step time ($\times$ non-private)", True),
                                      (ax_m, memory, "extra peak memory (MB)", False)):
            top = 0.0
            for (label, eps), values in data.items():
                x = labels.index(label) + (epsilons.index(eps) - (len(epsilons) - 1) / 2) * bar_width
                colour = colours.get(label, NONPRIVATE_COLOUR)
                ax.plot([x] * len(values), values, ls="none", marker=markers[eps], ms=4, mfc="none", mec=colour)
                if bar:
                    ax.plot([x - bar_width * 0.4, x + bar_width * 0.4], [sum(values) / len(values)] * 2,
                            color=colour, lw=2)
                top = max(top, *values)
            if bar and data:
                ax.axhline(1.0, color="0.4", lw=1, ls="--")
            below = _category_ticks(ax, labels, fig.get_size_inches()[0] * (0.75 if narrow else 0.38))
            grow[gi] = max(grow.get(gi, 0.0), below)
            ax.set_xlim(-0.6, len(labels) - 0.4)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{dataset} / {model}")
            ax.set_ylim(0, top * 1.12 if top > 0 else 1)  # headroom: the highest trial's marker is whole
            ax.grid(True, axis="y", alpha=0.3)
        if narrow:  # stacked: the step-time panel shares the memory panel's mechanism axis
            ax_t.set_xticks(range(len(labels)), [""] * len(labels))
            ax_m.set_title("")
    w, h = fig.get_size_inches()
    fig.set_size_inches(w, h + sum(grow.values()))
    _legend(fig, [Line2D([], [], ls="none", marker=markers[e], mfc="none", mec="0") for e in epsilons],
            [_eps_label(e) for e in epsilons], narrow, title="target")
    return fig


def _category_ticks(ax: Any, labels: Sequence[str], axis_in: float) -> float:
    """Mechanism names under a panel about `axis_in` inches wide: level when they fit side by side, slanted
    when a slant makes them fit, upright otherwise (so that no two labels overlap). Returns the inches the
    labels take below the axis beyond one line (the figure grows by that much)."""
    spacing = axis_in * 72 / max(1, len(labels))
    widest = max([len(label) for label in labels] + [1]) * 0.6 * RC["xtick.labelsize"]
    height = 1.2 * RC["xtick.labelsize"]
    slant = math.radians(20)
    if widest <= 0.9 * spacing:
        ax.set_xticks(range(len(labels)), labels)
        return 0.0
    if widest * math.cos(slant) + height * math.sin(slant) <= 0.9 * spacing:
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", rotation_mode="anchor")
        return widest * math.sin(slant) / 72
    ax.set_xticks(range(len(labels)), labels, rotation=90)
    return (widest - height) / 72


CURVE_TITLES = {"train_loss": "training loss", "test_accuracy": "test accuracy", "val_accuracy": "validation accuracy"}
CURVE_QUANTITY = {"test_accuracy": "accuracy"}  # the metric a curve is the history of (its format), if not its name


@_styled
def curves(records: Sequence[Mapping[str, Any]], width: float | None = None) -> Figure:
    """Per-epoch learning curves every trial records, mean over seeds with a +- std band.

    One panel per curve kind (its y label) and dataset/model (the title): kinds side by side, or stacked
    when narrow; one line per mechanism and epsilon: colour by mechanism, line style by epsilon, in one
    legend for the figure.
    """
    sweeps = _sweeps(records)
    multi = len(sweeps) > 1
    series: dict[tuple, dict[tuple, list[list[float]]]] = defaultdict(lambda: defaultdict(list))
    marker: dict[str, str] = {}  # line label -> its sweep's marker (a mechanism has one colour in every sweep)
    kinds: set[str] = set()
    for r in records:
        if r.get("status") != "finished":
            continue
        cfg = r["config"]
        for kind, values in (r.get("curves") or {}).items():
            clean = [float(v) for v in values if _finite(v)]
            if clean:
                kinds.add(kind)
                label = f"{cfg['mechanism']} ({r.get('sweep')})" if multi else cfg["mechanism"]
                series[(cfg["dataset"], cfg["model"], kind)][(label, cfg.get("epsilon"))].append(clean)
                marker[label] = sweep_marker(r.get("sweep"), sweeps)
    order = [k for k in CURVE_TITLES if k in kinds] + sorted(kinds - set(CURVE_TITLES))
    groups = sorted({(d, m) for d, m, _ in series})
    entries = len({key for g in series.values() for key in g})
    fig, axes, narrow = _figure(max(1, len(order) * len(groups)), width, (2.9, 2.3), (1.6, entries))
    if not series:
        return _empty(fig, "no learning curves recorded")
    colours = mechanism_colours(records)
    eps_all = sorted({e for g in series.values() for _, e in g if e is not None})
    legend: dict[tuple, Line2D] = {}
    for gi, (dataset, model) in enumerate(groups):
        for ki, kind in enumerate(order):
            ax = axes[gi * len(order) + ki]
            for (label, eps), runs in sorted(series.get((dataset, model, kind), {}).items(),
                                             key=lambda kv: (kv[0][0], kv[0][1] if kv[0][1] is not None else -1)):
                n = min(len(v) for v in runs)
                scale = utility_label(CURVE_QUANTITY.get(kind, kind))[1]  # in % where the tables write it in %
                runs = [[x * scale for x in v] for v in runs]
                mean = [sum(v[i] for v in runs) / len(runs) for i in range(n)]
                std = [(sum((v[i] - mean[i]) ** 2 for v in runs) / (len(runs) - 1)) ** 0.5 if len(runs) > 1 else 0.0
                       for i in range(n)]
                epochs = list(range(1, n + 1))
                style = LINESTYLES[eps_all.index(eps) % len(LINESTYLES)] if eps in eps_all else "-"
                name = label + (f", {EPS} {eps:g}" if eps is not None else "")
                line = ax.plot(epochs, mean, color=colours[label], ls=style, marker=marker[label], ms=3, lw=1.3,
                               label=name)[0]
                ax.fill_between(epochs, [m - s for m, s in zip(mean, std, strict=True)],
                                [m + s for m, s in zip(mean, std, strict=True)], color=colours[label], alpha=0.12)
                legend.setdefault((label, -1 if eps is None else eps), line)
            last = ki == len(order) - 1
            ax.set_xlabel("epoch" if last or not narrow else "")
            percent = utility_label(CURVE_QUANTITY.get(kind, kind))[1] != 1.0
            ax.set_ylabel(CURVE_TITLES.get(kind, kind) + (" (%)" if percent else ""))
            ax.set_title(f"{dataset} / {model}" if ki == 0 or not narrow else "")
            ax.grid(True, alpha=0.3)
            ax.xaxis.get_major_locator().set_params(integer=True)
            if narrow and not last:
                ax.tick_params(labelbottom=False)
    handles = [legend[k] for k in sorted(legend)]
    _legend(fig, handles, [h.get_label() for h in handles], narrow)
    return fig


STATUS_SHORT = {"overclaimed": "over.", "uncertified": "uncert.", "violated": "viol.", "ok": "ok"}


@_styled
def verdicts(records: Sequence[Mapping[str, Any]], width: float | None = None) -> Figure:
    """Mechanism x target epsilon grid coloured by `claim_status`; each cell shows claimed / certified.

    One panel per dataset/model; the worst status over seeds colours the cell, a blank cell means no
    finished trial at that point. Cells too narrow for a status's name show its abbreviation.
    """
    board = [r for r in rows(records) if r.private]
    multi = len(_sweeps(records)) > 1
    groups = _groups(board)
    present = sorted({r.claim_status for r in board if r.claim_status}, key=list(STATUS_COLOURS).index)
    mechs_max = max([len({_label(r, multi) for r in board if (r.dataset, r.model) == g}) for g in groups] + [1])
    eps_max = max([len({r.epsilon_target for r in board if (r.dataset, r.model) == g}) for g in groups] + [1])
    fig, axes, narrow = _figure(len(groups), width, (1.6 + 1.1 * eps_max, 0.9 + 0.45 * mechs_max),
                                (1.3, len(present)))
    if not board:
        return _empty(fig, "no private trials")
    for ax, (dataset, model) in zip(axes, groups, strict=True):
        part = [r for r in board if (r.dataset, r.model) == (dataset, model)]
        mechs = sorted({_label(r, multi) for r in part})
        eps = sorted({r.epsilon_target for r in part}, key=lambda e: (e is None, e or 0))
        cell_pt = fig.get_size_inches()[0] * 72 * (0.62 if narrow else 0.62 / len(axes)) / len(eps)
        short = cell_pt < 62  # "overclaimed" at 8 pt is about 50 pt wide

        def fmt(v: float | None, key: str) -> str:  # rounded up, as the tables round upper bounds
            return "-" if v is None else ("inf" if math.isinf(v) else schema.shown(v, schema.field("privacy", key)))

        for r in part:
            x, y = eps.index(r.epsilon_target), mechs.index(_label(r, multi))
            colour = STATUS_COLOURS.get(r.claim_status or "", "white")
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=colour, edgecolor="white", lw=2))
            status = (STATUS_SHORT if short else {}).get(r.claim_status or "", r.claim_status or "-")
            ax.text(x, y, f"{status}\n{fmt(r.epsilon_claimed, 'epsilon_claimed')} / "
                    f"{fmt(r.epsilon_certified, 'epsilon_certified')}",
                    ha="center", va="center", color="black" if r.claim_status != "violated" else "white")
        ax.set_xlim(-0.5, len(eps) - 0.5)
        ax.set_ylim(len(mechs) - 0.5, -0.5)
        ax.set_xticks(range(len(eps)), ["-" if e is None else f"{e:g}" for e in eps])
        ax.set_yticks(range(len(mechs)), mechs)
        ax.set_xlabel(f"target {EPS} (cells: claimed / certified)")
        ax.set_title(f"{dataset} / {model}")
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        ax.tick_params(length=0)
    _legend(fig, [Patch(facecolor=STATUS_COLOURS[s]) for s in present], present, narrow)
    return fig


BUILDERS = {"privacy-utility": privacy_utility, "overhead": overhead, "curves": curves, "verdicts": verdicts}


class NoTunedCells(ValueError):
    """`--kind tuning` on sweeps without a tuned cell: there is nothing to draw."""


@_styled
def tuning(records: Iterable[Mapping[str, Any]], metric: str = "accuracy", width: float | None = None) -> Figure:
    """Utility of the selected candidates against epsilon (log x), one panel per dataset/model: a hollow
    marker at one run's certified epsilon, a filled one (with the std over cells) at the epsilon including
    tuning, joined by a dotted line; the mechanism's colour, one marker per budget. The gap is what tuning
    costs."""
    board = [r for r in tuned.rows(records, metric) if r.utility_mean is not None and r.epsilon_tuned is not None]
    panels = sorted({(r.dataset, r.model) for r in board})
    labels = sorted({f"{r.mechanism} ({r.budget})" for r in board})
    fig, axes, narrow = _figure(len(panels), width, (3.4, 2.8), (2.0, len(labels)))
    if not panels:
        return _empty(fig, "no complete tuned cells")
    budgets = sorted({str(r.budget) for r in board})
    ylabel, scale = utility_label(metric)
    for ax, (dataset, model) in zip(axes, panels, strict=True):
        mine = [r for r in board if (r.dataset, r.model) == (dataset, model)]
        for label in labels:
            line = sorted((r for r in mine if f"{r.mechanism} ({r.budget})" == label), key=lambda r: r.epsilon_tuned)
            if not line:
                continue
            c, m = mechanism_colour(line[0].mechanism), MARKERS[budgets.index(str(line[0].budget)) % len(MARKERS)]
            ax.errorbar([r.epsilon_tuned for r in line], [r.utility_mean * scale for r in line],
                        yerr=[(r.utility_std or 0.0) * scale for r in line], color=c, marker=m, capsize=2, label=label)
            for r in line:
                if r.epsilon_run is not None:
                    ax.plot([r.epsilon_run], [r.utility_mean * scale], marker=m, color=c, markerfacecolor="white")
                    ax.plot([r.epsilon_run, r.epsilon_tuned], [r.utility_mean * scale] * 2, ":", color=c, linewidth=1)
        ax.set_xscale("log")
        ax.set_title(f"{dataset} / {model}")
        ax.set_xlabel(f"{EPS} (hollow: one run; filled: with tuning)")
        ax.set_ylabel(f"{ylabel} (selected)")
    _legend(fig, *axes[0].get_legend_handles_labels(), narrow)
    return fig


def has_tuned_cells(records: Iterable[Mapping[str, Any]]) -> bool:
    return any((r.get("config") or {}).get("tuning") for r in records)


def build(kind: str, records: Sequence[Mapping[str, Any]], metric: str = "accuracy", size: str | None = None,
          venue_name: str = DEFAULT_VENUE) -> Figure:
    """The figure `kind`, laid out for `size` ('single': the venue's column width, 'double': its text width;
    None: the figure's natural width). Raises NoTunedCells for `tuning` on records without tuned cells."""
    if size is not None and size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    width = venue(venue_name).width_in(size) if size else None
    if kind == TUNING_KIND:  # only for sweeps with a `tune:` block (dashboards/tuned_cells.py)
        if not has_tuned_cells(records):
            raise NoTunedCells("no tuned cells in these sweeps: --kind tuning draws sweeps whose grid has a `tune:` "
                               "block")
        return tuning(records, metric, width)
    if kind not in BUILDERS:
        raise ValueError(f"unknown figure kind {kind!r}; known: {', '.join(KINDS)}")
    if kind == "privacy-utility":
        return privacy_utility(records, metric, width)
    return BUILDERS[kind](records, width)


def tex_engine() -> str | None:
    """The TeX engine matplotlib's PGF backend can measure text with (None: no TeX installed)."""
    return next((e for e in ("xelatex", "pdflatex", "lualatex") if shutil.which(e)), None)


def save(fig: Figure, path: Path | BinaryIO, fmt: str | None = None) -> Path | BinaryIO:
    """Write the figure; the format follows the suffix (or `fmt` for a file object). Dates are left out
    so reruns give equal files, and PDF / PS fonts are TrueType (`RC` is in force when the file is
    written, which is when matplotlib reads the font type)."""
    fmt = fmt or Path(path).suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ValueError(f"unsupported figure format {fmt!r}; known: {', '.join('.' + f for f in FORMATS)}")

    # PGF takes no metadata; its text is measured by the TeX engine that is installed.
    kwargs = {"pdf": {"metadata": {"CreationDate": None}}, "svg": {"metadata": {"Date": None}}, "png": {"dpi": 200},
              "pgf": {}}[fmt]
    with rc_context(RC | ({"pgf.texsystem": tex_engine() or "xelatex"} if fmt == "pgf" else {})):
        fig.savefig(path, format=fmt, **kwargs)
    return path


def svg_text(fig: Figure) -> str:
    """The figure as an inline `<svg>` element (no XML prolog), for a self-contained HTML page."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]
