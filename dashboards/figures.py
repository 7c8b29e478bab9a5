"""Publication figures from a sweep's result records, one function per figure, each returning a
`matplotlib.figure.Figure`.

Figures are built with the object API (`Figure()`, never `pyplot`), so making one touches no global
state: a notebook's or another library's pyplot figures are left alone, and nothing needs a display.
`save()` writes PDF, SVG, PNG or PGF from the file suffix; `svg_text()` gives the SVG for embedding in
the HTML report.

Every figure takes the plain result records that `Store.records()` returns (one per trial, several
sweeps may be mixed: their lines are labelled `mechanism (sweep)`), so error bars are computed over
the seeds that really ran.
"""

from __future__ import annotations

import functools
import io
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import NullFormatter

from dashboards.leaderboard import LeaderboardRow, rows
from storage import schema

KINDS = ("privacy-utility", "overhead", "curves", "verdicts")
FORMATS = ("pdf", "svg", "png", "pgf")
TUNING_KIND = "tuning"  # utility against epsilon per run and including tuning; not in KINDS (tuned sweeps only)

# Okabe-Ito: distinguishable with the common colour-vision deficiencies and in greyscale print.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"]
STATUS_COLOURS = {"ok": "#009E73", "overclaimed": "#E69F00", "violated": "#D55E00", "uncertified": "#999999"}
STATUS_TEXT = {
    "ok": "ok: certified and audited epsilon are both at most the claim",
    "overclaimed": "overclaimed: the sound (PLD) bound exceeds the claim",
    "violated": "violated: an audit measured more privacy loss than claimed",
    "uncertified": "uncertified: no sound analysis of what the code does is known",
}
# Type 42 (TrueType) fonts in PDF and PS: IEEE's and ACM's submission checks reject Type 3.
RC = {"font.size": 9, "axes.titlesize": 9, "axes.labelsize": 9, "legend.fontsize": 7.5,
      "xtick.labelsize": 8, "ytick.labelsize": 8, "svg.hashsalt": "privbench",
      "pdf.fonttype": 42, "ps.fonttype": 42}
SIZES = {"single": 3.3, "double": 7.0}  # inches: one column and the full text width of a two-column paper
LINESTYLES = ["-", "--", ":", "-."]  # one per epsilon, beside the mechanism's colour


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _sweeps(records: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted({str(r.get("sweep")) for r in records if r.get("sweep") is not None})


def _groups(board: Iterable[LeaderboardRow]) -> list[tuple[str, str]]:
    return sorted({(r.dataset, r.model) for r in board})


def _label(row: LeaderboardRow, multi: bool) -> str:
    return f"{row.mechanism} ({row.sweep})" if multi and row.sweep else row.mechanism


def _colours(labels: Iterable[str]) -> dict[str, str]:
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(sorted(set(labels)))}


def _styled(builder: Callable[..., Figure]) -> Callable[..., Figure]:
    """Build inside `rc_context(RC)`: text sizes are fixed when artists are made, and the caller's
    rcParams are restored afterwards (no global state changes)."""
    @functools.wraps(builder)
    def wrapped(*args: Any, **kwargs: Any) -> Figure:
        from matplotlib import rc_context

        with rc_context(RC):
            return builder(*args, **kwargs)

    return wrapped


def _new_figure(n_panels: int, width_per: float = 3.4, height: float = 2.8, nrows: int = 1,
                extra_width: float = 0.0) -> tuple[Figure, list]:
    width = max(width_per * math.ceil(n_panels / nrows), 3.4) + extra_width
    fig = Figure(figsize=(width, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, max(1, math.ceil(n_panels / nrows)), squeeze=False).ravel().tolist()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes[:n_panels]


def _empty(fig: Figure, message: str) -> Figure:
    fig.text(0.5, 0.5, message, ha="center", va="center")
    return fig


@_styled
def privacy_utility(records: Sequence[Mapping[str, Any]], metric: str = "accuracy", size: str | None = None) -> Figure:
    """Utility against certified epsilon (log x), one line per mechanism, one panel per dataset/model.

    Filled markers with error bars (std over seeds) sit at the certified epsilon; a hollow marker at the
    claimed epsilon is joined to it by a dotted line, so an over-optimistic claim shows as a visible gap.
    A translucent bar from the audited lower bound to the certified upper bound is the interval where
    the run's true epsilon lies. The non-private reference is a band (mean +- std). Mechanisms without
    a sound bound (uncertified) appear at their claimed epsilon only, as hollow markers.
    """
    board = rows(records, metric=metric)
    multi = len(_sweeps(records)) > 1
    groups = _groups(board)
    narrow = size == "single"  # one column: the legend goes below the panels
    fig, axes = _new_figure(max(1, len(groups)), width_per=3.2, extra_width=0.0 if narrow else 2.0,
                            height=3.6 if narrow else 2.8)
    if not groups:
        return _empty(fig, "no finished trials")
    colours = _colours(_label(r, multi) for r in board if r.private)
    legend: dict[str, Any] = {}
    for ax, (dataset, model) in zip(axes, groups, strict=True):
        part = [r for r in board if (r.dataset, r.model) == (dataset, model) and r.utility_mean is not None]
        xs = [e for r in part for e in (r.epsilon_certified, r.epsilon_claimed) if _finite(e) and e > 0]
        audited = [r.epsilon_audited for r in part if _finite(r.epsilon_audited) and r.epsilon_audited > 0]
        floor = min(xs + audited) / 2 if xs else 0.1  # an audited bound of 0 starts the bar at the axis edge
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
            c = colours[label]
            cert = sorted((r for r in members if _finite(r.epsilon_certified)), key=lambda r: r.epsilon_certified)
            if cert:
                ax.errorbar([r.epsilon_certified for r in cert], [r.utility_mean for r in cert],
                            yerr=[r.utility_std or 0.0 for r in cert], color=c, marker="o", ms=5, lw=1.4,
                            capsize=2.5, zorder=3)
            for r in members:
                if _finite(r.epsilon_claimed) and r.epsilon_claimed > 0:
                    ax.plot([r.epsilon_claimed], [r.utility_mean], marker="o", ms=8, mfc="white", mec=c,
                            mew=1.4, ls="none", zorder=2.5)  # a ring around the certified dot
                    if _finite(r.epsilon_certified):
                        ax.plot([r.epsilon_claimed, r.epsilon_certified], [r.utility_mean] * 2, color=c,
                                ls=":", lw=1, zorder=2)
                if _finite(r.epsilon_certified) and r.epsilon_audited is not None and _finite(r.epsilon_audited):
                    low = max(r.epsilon_audited, floor)
                    ax.plot([low, r.epsilon_certified], [r.utility_mean] * 2, color=c, lw=6, alpha=0.22,
                            solid_capstyle="butt", zorder=2)
        ax.set_xscale("log")
        ticks = sorted({float(f"{x:.2g}") for x in xs + audited})
        if 0 < len(ticks) <= 8:  # label the epsilons that occur; log minor labels overlap on short ranges
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("epsilon (certified; hollow: claimed)")
        ax.set_ylabel(metric)
        ax.set_title(f"{dataset} / {model}")
        ax.grid(True, which="major", alpha=0.3)
        for label in sorted(lines):
            legend[label] = Line2D([], [], color=colours[label], marker="o", lw=1.4, label=label)
        if any(not r.private for r in part):
            legend["~np"] = Patch(facecolor="0.85", edgecolor="0.4", ls="--", label="non-private (mean ± std)")
    handles = [legend[k] for k in sorted(legend)] + [
        Line2D([], [], color="0.3", marker="o", mfc="white", ls=":", label="claimed epsilon"),
        Line2D([], [], color="0.3", lw=6, alpha=0.22, label="audited to certified")]
    fig.legend(handles=handles, loc="outside lower center" if narrow else "outside right upper", frameon=False,
               ncols=2 if narrow else 1)
    return fig


def _per_trial(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        if r.get("status") != "finished":
            continue
        cfg, m = r["config"], r.get("metrics") or {}
        out.append({"sweep": r.get("sweep"), "dataset": cfg["dataset"], "model": cfg["model"],
                    "mechanism": cfg["mechanism"], "epsilon": cfg.get("epsilon"), "private": schema.is_private(r),
                    "batch_size": (cfg.get("train") or {}).get("batch_size"),
                    "step_time_s": m.get("step_time_s"), "peak_memory_mb": m.get("peak_memory_mb")})
    return out


def _eps_label(eps: float | None) -> str:
    return "non-private" if eps is None else f"epsilon {eps:g}"


@_styled
def overhead(records: Sequence[Mapping[str, Any]], size: str | None = None) -> Figure:
    """Step time relative to non-private (left) and extra peak memory in MB (right), per mechanism, one
    row of panels per dataset/model (named in the titles).

    Each dot is one trial, coloured by its target epsilon (legend); a short bar marks the mean step-time
    ratio of a mechanism at one epsilon. Step time is a ratio against the non-private trials of the same
    sweep, dataset, model and batch size. Memory is each trial's own peak in MB, with no mean or error
    bar: a trial's figure depends on what its process allocated before (docs/commands.md), so an
    average over trials would suggest a precision the measurement does not have. At `size='single'` the
    two panels stack and the legend goes below.
    """
    trials = _per_trial(records)
    multi = len(_sweeps(records)) > 1
    base: dict[tuple, list[float]] = defaultdict(list)
    for t in trials:
        if not t["private"] and _finite(t["step_time_s"]):
            base[(t["sweep"], t["dataset"], t["model"], t["batch_size"])].append(t["step_time_s"])
    groups = sorted({(t["dataset"], t["model"]) for t in trials})
    narrow = size == "single"
    n = 2 * max(1, len(groups))
    fig, axes = (_new_figure(n, width_per=3.3, height=2.3, nrows=n) if narrow else
                 _new_figure(n, width_per=3.6, nrows=max(1, len(groups)), extra_width=1.1))
    if not trials:
        return _empty(fig, "no finished trials with timings")
    epsilons = sorted({t["epsilon"] for t in trials}, key=lambda e: (e is not None, e or 0))
    colours = {e: ("0.35" if e is None else PALETTE[i % len(PALETTE)]) for i, e in enumerate(epsilons)}
    for gi, (dataset, model) in enumerate(groups):
        ax_t, ax_m = axes[2 * gi], axes[2 * gi + 1]
        part = [t for t in trials if (t["dataset"], t["model"]) == (dataset, model)]
        labels = sorted({f"{t['mechanism']} ({t['sweep']})" if multi else t["mechanism"] for t in part})
        step: dict[tuple, list[float]] = defaultdict(list)
        memory: dict[tuple, list[float]] = defaultdict(list)
        for t in part:
            label = f"{t['mechanism']} ({t['sweep']})" if multi else t["mechanism"]
            ref = base.get((t["sweep"], t["dataset"], t["model"], t["batch_size"]))
            if ref and _finite(t["step_time_s"]):
                step[(label, t["epsilon"])].append(t["step_time_s"] / (sum(ref) / len(ref)))
            if _finite(t["peak_memory_mb"]):
                memory[(label, t["epsilon"])].append(t["peak_memory_mb"])
        width = 0.7 / max(1, len(epsilons))
        for ax, data, ylabel, title, bar in (
                (ax_t, step, "step time / non-private", "step time", True),
                (ax_m, memory, "extra peak memory (MB)", "peak memory per trial", False)):
            top = 0.0
            for (label, eps), values in data.items():
                x = labels.index(label) + (epsilons.index(eps) - (len(epsilons) - 1) / 2) * width
                ax.plot([x] * len(values), values, ls="none", marker="o", ms=4, mfc="none", mec=colours[eps])
                if bar:
                    ax.plot([x - width * 0.4, x + width * 0.4], [sum(values) / len(values)] * 2, color=colours[eps],
                            lw=2)
                top = max(top, *values)
            if bar and data:
                ax.axhline(1.0, color="0.4", lw=1, ls="--")
            ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
            ax.set_xlim(-0.6, len(labels) - 0.4)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{dataset} / {model}: {title}")
            ax.set_ylim(0, top * 1.12 if top > 0 else 1)  # headroom: the highest trial's marker is whole
            ax.grid(True, axis="y", alpha=0.3)
    fig.legend(handles=[Line2D([], [], ls="none", marker="o", mfc="none", mec=colours[e], label=_eps_label(e))
                        for e in epsilons], loc="outside lower center" if narrow else "outside right upper",
               frameon=False, title="target", ncols=len(epsilons) if narrow else 1)
    return fig


CURVE_TITLES = {"train_loss": "training loss", "test_accuracy": "test accuracy", "val_accuracy": "validation accuracy"}


@_styled
def curves(records: Sequence[Mapping[str, Any]]) -> Figure:
    """Per-epoch learning curves every trial records, mean over seeds with a +- std band.

    One panel per curve kind (columns) and dataset/model (rows), each titled with both; one line per
    mechanism and epsilon: colour by mechanism, line style by epsilon, in one legend for the figure.
    """
    multi = len(_sweeps(records)) > 1
    series: dict[tuple, dict[tuple, list[list[float]]]] = defaultdict(lambda: defaultdict(list))
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
    order = [k for k in CURVE_TITLES if k in kinds] + sorted(kinds - set(CURVE_TITLES))
    groups = sorted({(d, m) for d, m, _ in series})
    fig, axes = _new_figure(max(1, len(order) * len(groups)), width_per=3.0, nrows=max(1, len(groups)),
                            extra_width=1.6)
    if not series:
        return _empty(fig, "no learning curves recorded")
    colours = _colours(label for g in series.values() for label, _ in g)
    eps_all = sorted({e for g in series.values() for _, e in g if e is not None})
    legend: dict[tuple, Line2D] = {}
    for gi, (dataset, model) in enumerate(groups):
        for ki, kind in enumerate(order):
            ax = axes[gi * len(order) + ki]
            for (label, eps), runs in sorted(series.get((dataset, model, kind), {}).items(),
                                             key=lambda kv: (kv[0][0], kv[0][1] if kv[0][1] is not None else -1)):
                n = min(len(v) for v in runs)
                mean = [sum(v[i] for v in runs) / len(runs) for i in range(n)]
                std = [(sum((v[i] - mean[i]) ** 2 for v in runs) / (len(runs) - 1)) ** 0.5 if len(runs) > 1 else 0.0
                       for i in range(n)]
                epochs = list(range(1, n + 1))
                style = LINESTYLES[eps_all.index(eps) % len(LINESTYLES)] if eps in eps_all else "-"
                name = label + (f", eps {eps:g}" if eps is not None else "")
                line = ax.plot(epochs, mean, color=colours[label], ls=style, marker="o", ms=3, lw=1.3, label=name)[0]
                ax.fill_between(epochs, [m - s for m, s in zip(mean, std, strict=True)],
                                [m + s for m, s in zip(mean, std, strict=True)], color=colours[label], alpha=0.12)
                legend.setdefault((label, -1 if eps is None else eps), line)
            ax.set_xlabel("epoch")
            ax.set_ylabel(CURVE_TITLES.get(kind, kind))
            ax.set_title(f"{dataset} / {model}: {CURVE_TITLES.get(kind, kind)}")
            ax.grid(True, alpha=0.3)
            ax.xaxis.get_major_locator().set_params(integer=True)
    handles = [legend[k] for k in sorted(legend)]
    fig.legend(handles=handles, labels=[h.get_label() for h in handles], loc="outside right upper", frameon=False)
    return fig


@_styled
def verdicts(records: Sequence[Mapping[str, Any]]) -> Figure:
    """Mechanism x target epsilon grid coloured by `claim_status`; each cell shows claimed / certified.

    One panel per dataset/model; the worst status over seeds colours the cell, a blank cell means no
    finished trial at that point.
    """
    board = [r for r in rows(records) if r.private]
    multi = len(_sweeps(records)) > 1
    groups = _groups(board)
    fig, axes = _new_figure(max(1, len(groups)), width_per=4.2,
                            height=1.2 + 0.45 * len({_label(r, multi) for r in board}))
    if not board:
        return _empty(fig, "no private trials")
    for ax, (dataset, model) in zip(axes, groups, strict=True):
        part = [r for r in board if (r.dataset, r.model) == (dataset, model)]
        mechs = sorted({_label(r, multi) for r in part})
        eps = sorted({r.epsilon_target for r in part}, key=lambda e: (e is None, e or 0))
        for r in part:
            x, y = eps.index(r.epsilon_target), mechs.index(_label(r, multi))
            colour = STATUS_COLOURS.get(r.claim_status or "", "white")
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=colour, edgecolor="white", lw=2))

            def fmt(v: float | None) -> str:
                return "-" if v is None else ("inf" if math.isinf(v) else f"{v:.3g}")

            ax.text(x, y, f"{r.claim_status or '-'}\n{fmt(r.epsilon_claimed)} / {fmt(r.epsilon_certified)}",
                    ha="center", va="center", fontsize=7, color="black" if r.claim_status != "violated" else "white")
        ax.set_xlim(-0.5, len(eps) - 0.5)
        ax.set_ylim(len(mechs) - 0.5, -0.5)
        ax.set_xticks(range(len(eps)), ["-" if e is None else f"{e:g}" for e in eps])
        ax.set_yticks(range(len(mechs)), mechs)
        ax.set_xlabel("target epsilon (cells: claimed / certified)")
        ax.set_title(f"{dataset} / {model}")
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        ax.tick_params(length=0)
    present = sorted({r.claim_status for r in board if r.claim_status}, key=list(STATUS_COLOURS).index)
    fig.legend(handles=[Patch(facecolor=STATUS_COLOURS[s], label=s) for s in present], loc="outside lower center",
               ncols=max(1, len(present)), frameon=False)
    return fig


BUILDERS = {"privacy-utility": privacy_utility, "overhead": overhead, "curves": curves, "verdicts": verdicts}


def build(kind: str, records: Sequence[Mapping[str, Any]], metric: str = "accuracy",
          size: str | None = None) -> Figure:
    """The figure `kind`; `size` ('single': 3.3 in, 'double': 7 in wide) rescales it to a paper's column
    or text width, keeping its aspect ratio within bounds (constrained layout reflows it)."""
    if kind == TUNING_KIND:  # only for sweeps with a `tune:` block (dashboards/tuning.py)
        from dashboards import tuning

        return tuning.figure(records, metric)
    if kind not in BUILDERS:
        raise ValueError(f"unknown figure kind {kind!r}; known: {', '.join(KINDS)}")
    if size is not None and size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    if kind in ("privacy-utility", "overhead"):  # these two lay themselves out for one column
        fig = privacy_utility(records, metric, size) if kind == "privacy-utility" else overhead(records, size)
    else:
        fig = BUILDERS[kind](records)
    if size is not None:
        w, h = fig.get_size_inches()
        width = SIZES[size]
        fig.set_size_inches(width, h if kind == "overhead" and size == "single" else
                            min(max(h * width / w, 2.2), 1.3 * width if width < 4 else 0.8 * width))
    return fig


def tex_engine() -> str | None:
    """The TeX engine matplotlib's PGF backend can measure text with (None: no TeX installed)."""
    import shutil

    return next((e for e in ("xelatex", "pdflatex", "lualatex") if shutil.which(e)), None)


def save(fig: Figure, path: Path | BinaryIO, fmt: str | None = None) -> Path | BinaryIO:
    """Write the figure; the format follows the suffix (or `fmt` for a file object). Dates are left out
    so reruns give equal files, and PDF / PS fonts are TrueType (`RC` is in force when the file is
    written, which is when matplotlib reads the font type)."""
    fmt = fmt or Path(path).suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ValueError(f"unsupported figure format {fmt!r}; known: {', '.join('.' + f for f in FORMATS)}")
    from matplotlib import rc_context

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
