"""Tuned cells on the leaderboard: the selected candidate of each cell, and untuned comparisons flagged.

A tuned cell (a grid's `tune:` block, workers/tuning_candidates.py) is K candidate trials. Its result is the candidate
with the highest validation accuracy (ties to the lowest index); a failed candidate counts toward K but
cannot be selected; a cell is complete when all K are recorded. Only the selected candidate's test score is
shown, and `--view tuned` ranks mechanisms by it at their epsilon *including tuning*.

A cell compared across several values of a training setting (lr, clip, batch size, epochs) without a
`tune:` block is "best of N, tuning unaccounted": picking the best of N fixed runs is only covered by their
N-fold composition (`mechanisms.accounting.tuning_cost.fixed_runs_epsilon`), which the flag shows.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from storage import schema

TUNED_VIEW = "tuned"
SELECT_ON = "val_accuracy"
# = mechanisms.accounting.tuning_cost.TUNABLE (a test keeps them equal)
SETTINGS = ("lr", "clip", "batch_size", "epochs")


def _tuned(record: Mapping[str, Any]) -> bool:
    return bool((record.get("config") or {}).get("tuning"))


@dataclasses.dataclass(frozen=True)
class Selection:
    """One tuned cell: its candidates' records and, once all K are recorded, the selected one."""

    sweep: str
    cell: str
    runs: int
    candidates: tuple[Mapping[str, Any], ...]

    @property
    def complete(self) -> bool:
        return len({c["config"]["tuning"]["candidate"] for c in self.candidates}) >= self.runs

    @property
    def selected(self) -> Mapping[str, Any] | None:
        """The finished candidate with the highest validation accuracy (ties: the lowest index), or None
        while the cell is incomplete or no candidate finished with a validation score."""
        if not self.complete:
            return None
        scored = [c for c in self.candidates if c["status"] == "finished"
                  and isinstance((c.get("metrics") or {}).get(SELECT_ON), (int, float))]
        if not scored:
            return None
        return max(scored, key=lambda c: (c["metrics"][SELECT_ON], -c["config"]["tuning"]["candidate"]))


def selections(records: Iterable[Mapping[str, Any]]) -> list[Selection]:
    """Every tuned cell among `records`, grouped by (sweep, cell key)."""
    cells: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        if _tuned(r):
            cells[str(r.get("sweep") or ""), str(r["config"]["tuning"]["cell"])].append(r)
    return [Selection(sweep, cell, int(group[0]["config"]["tuning"]["runs"]), tuple(group))
            for (sweep, cell), group in sorted(cells.items())]


def for_default_view(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records the default leaderboard ranks: untuned ones as they are, and for each complete tuned cell
    its selected candidate (the test scores of the others are never shown)."""
    records = list(records)
    chosen = [s.selected for s in selections(records)]
    return [r for r in records if not _tuned(r)] + [r for r in chosen if r is not None]


# --- the tuned view ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TunedRow:
    """A (dataset, model, mechanism, target epsilon) of a tuned sweep: the selected candidates' test utility
    (mean +- std over cell seeds) at the epsilon including tuning (max over seeds, never under-reported)."""

    sweep: str | None
    dataset: str
    model: str
    mechanism: str
    epsilon_target: float | None
    metric: str
    utility_mean: float | None
    utility_std: float | None
    epsilon_tuned: float | None
    epsilon_run: float | None
    budget: str | None
    distribution: str | None
    runs_mean: float | None  # K drawn, mean over cells
    cells: int
    incomplete: int  # cells with a candidate still missing, or none selectable
    selected_params: str | None = None


def rows(records: Iterable[Mapping[str, Any]], metric: str = "accuracy") -> list[TunedRow]:
    groups: dict[tuple[Any, ...], list[Selection]] = defaultdict(list)
    for s in selections(records):
        cfg = s.candidates[0]["config"]
        groups[s.sweep, cfg["dataset"], cfg["model"], cfg["mechanism"], cfg.get("epsilon")].append(s)
    out = []
    for (sweep, dataset, model, mechanism, eps), cells in groups.items():
        chosen = [s.selected for s in cells if s.selected is not None]
        utils = [float(v) for r in chosen if isinstance(v := (r.get("metrics") or {}).get(metric), (int, float))]
        privacy = [r.get("privacy") or {} for r in chosen]
        mean = sum(utils) / len(utils) if utils else None
        std = (math.sqrt(sum((u - mean) ** 2 for u in utils) / (len(utils) - 1)) if len(utils) > 1 else 0.0) \
            if utils else None
        first = cells[0].candidates[0].get("privacy") or {}
        out.append(TunedRow(
            sweep or None, dataset, model, mechanism, eps, metric, mean, std,
            _most(p.get("epsilon_certified_tuned") for p in privacy),
            _most(p.get("epsilon_certified_run") for p in privacy),
            first.get("tuning_budget"), first.get("tuning_distribution"),
            sum(s.runs for s in cells) / len(cells), len(cells), len(cells) - len(chosen),
            "; ".join(_params(r) for r in chosen) or None))
    return sorted(out, key=lambda r: (r.dataset, r.model, math.inf if r.epsilon_tuned is None else r.epsilon_tuned,
                                      -(r.utility_mean if r.utility_mean is not None else -math.inf)))


def _most(values: Iterable[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, (int, float))]
    return max(numbers) if numbers else None


def _params(record: Mapping[str, Any]) -> str:
    params = record["config"]["tuning"]["params"]
    return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in sorted(params.items()))


def _fmt(x: Any, f: schema.Field | None = None) -> str:
    """A number as every output writes quantity `f` (an epsilon: as a certified one, rounded up), else to
    three significant digits."""
    if not isinstance(x, float):
        return "-" if x is None else str(x)
    return schema.shown(x, f) if f is not None else f"{x:.3g}"


EPSILON = schema.field("privacy", "epsilon_certified")  # an epsilon including tuning is an upper bound


HEADERS = ("dataset", "model", "mechanism", "eps target", "utility (selected)", "eps incl. tuning", "eps per run",
           "budget", "runs", "K mean", "cells", "selected")


def table(board: list[TunedRow]) -> list[list[str]]:
    """The tuned view's cells, one list per row (HEADERS' order)."""
    return [[r.dataset, r.model, r.mechanism, _fmt(r.epsilon_target),
             "-" if r.utility_mean is None else (f"{_fmt(r.utility_mean, schema.utility_field(r.metric))} ± "
                                                 f"{_fmt(r.utility_std, schema.utility_field(r.metric))}"),
             _fmt(r.epsilon_tuned, EPSILON), _fmt(r.epsilon_run, EPSILON), r.budget or "-", r.distribution or "-",
             _fmt(r.runs_mean),
             f"{r.cells - r.incomplete}" + (f" ({r.incomplete} incomplete)" if r.incomplete else ""),
             r.selected_params or "-"] for r in board]


def markdown(board: list[TunedRow]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table(board)]
    return "\n".join(lines) + "\n"


# --- untuned comparisons ----------------------------------------------------------------------------------

_EVENTS = None


def _event_classes() -> dict[str, Any]:
    global _EVENTS
    if _EVENTS is None:
        import dp_accounting  # lazy: heavy (dp_accounting)

        _EVENTS = {name: getattr(dp_accounting, name) for name in dir(dp_accounting)
                   if name.endswith("DpEvent") and isinstance(getattr(dp_accounting, name), type)}
    return _EVENTS


def event_from_repr(text: str) -> Any:
    """The DpEvent a record stores as its repr (`effective_event`), rebuilt without `eval`: only
    dp-accounting's event classes with literal arguments are accepted (else ValueError)."""
    classes = _event_classes()

    def build(node: ast.AST) -> Any:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes and not node.args:
            return classes[node.func.id](**{k.arg: build(k.value) for k in node.keywords})
        if isinstance(node, ast.List):
            return [build(e) for e in node.elts]
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        raise ValueError(f"not a dp-accounting event: {ast.dump(node)[:80]}")

    return build(ast.parse(text, mode="eval").body)


def _setting(record: Mapping[str, Any]) -> str:
    """The record's training settings. A stored config omits a setting the grid left at its default
    (`TrialConfig.to_dict`), so "default" stands for it (reading the defaults would import `workers` into
    every leaderboard command); a grid that writes the default out reads as another setting."""
    train = record["config"].get("train") or {}
    return json.dumps({k: train.get(k, "default") for k in SETTINGS}, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class Unaccounted:
    """A (dataset, model, mechanism, target) compared across `settings` training settings, no `tune:` block."""

    settings: int
    epsilon_fixed_runs: float | None  # what the composition of one run per setting certifies (None: unknown)

    def note(self) -> str:
        eps = f"; the {self.settings} runs composed certify eps {_fmt(self.epsilon_fixed_runs, EPSILON)}" \
            if self.epsilon_fixed_runs is not None else ""
        return f"best of {self.settings}, tuning unaccounted{eps}"


def unaccounted(records: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], Unaccounted]:
    """(dataset, model, mechanism, epsilon target) -> its flag, for the untuned cells whose finished records
    hold more than one training setting (several sweeps, or several grids, compared on utility)."""
    cells: dict[tuple[Any, ...], dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for r in records:
        if _tuned(r) or r.get("status") != "finished":
            continue
        cfg = r["config"]
        cells[cfg["dataset"], cfg["model"], cfg["mechanism"], cfg.get("epsilon")].setdefault(_setting(r), r)
    out = {}
    for key, by_setting in cells.items():
        if len(by_setting) > 1:
            out[key] = Unaccounted(len(by_setting), _fixed_runs(by_setting.values()))
    return out


def _fixed_runs(runs: Iterable[Mapping[str, Any]]) -> float | None:
    from mechanisms.accounting.tuning_cost import fixed_runs_epsilon  # lazy: keeps the read commands light

    try:
        events = [event_from_repr((r.get("privacy") or {})["effective_event"]) for r in runs]
        return fixed_runs_epsilon(events, max(float((r.get("privacy") or {})["delta"]) for r in runs))
    except (KeyError, TypeError, ValueError, SyntaxError):
        return None  # a non-private mechanism, or an event the accountant cannot compose


def note_for(row: Any, records: list[Mapping[str, Any]], flags: Mapping[tuple[Any, ...], Unaccounted]) -> str | None:
    """The tuning note of a default-view leaderboard row: accounted tuning, an unaccounted best of N, or None."""
    key = (row.dataset, row.model, row.mechanism, row.epsilon_target)
    if key in flags:
        return flags[key].note()
    tuned = [r for r in records if _tuned(r) and (r.get("sweep") or None) == row.sweep
             and (r["config"]["dataset"], r["config"]["model"], r["config"]["mechanism"], r["config"].get("epsilon"))
             == key]
    if not tuned:
        return None
    privacy = [r.get("privacy") or {} for r in tuned]
    eps = _most(p.get("epsilon_certified_tuned") for p in privacy)
    return (f"tuned ({privacy[0].get('tuning_distribution')}, budget {privacy[0].get('tuning_budget')}): "
            f"eps incl. tuning {_fmt(eps, EPSILON)}")


__all__ = ["Selection", "TunedRow", "Unaccounted", "event_from_repr", "for_default_view", "markdown", "note_for",
           "rows", "selections", "table", "unaccounted"]
