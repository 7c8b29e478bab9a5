"""Leaderboard rows from a sweep's result records: mean +- std over seeds.

Every column, where it comes from in the record and how seeds combine is declared in `storage.schema`.

`step x` is each private trial's own paired measurement (workers/overhead.py), mean over seeds, with the widest
95% interval; a row without one has none (never the ratio of two trials' median steps, another quantity). The
memory ratio of records without a paired one compares with `nonprivate` on the same dataset / model / batch size.
A value that does not apply is None, never a made-up number. Rows are ranked by utility at equal certified
epsilon, and only rows whose claim is `ok` are ranked or highlighted (`honest`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from dashboards import tuned_cells
from storage import schema
from storage.verdicts import sweep_claim_statuses

STATUS_ORDER = {"violated": 3, "overclaimed": 2, "uncertified": 1, "ok": 0}
VIEWS = ("certified", "claimed")
# The memory sampler resolves about 15 MB, and a small model's non-private step needs almost no extra
# memory (a 20k-parameter CNN: ~1 MB, which made a "297x" ratio). Below this baseline the ratio is noise
# and is left null; the absolute `peak_memory_mb` is always there.
MEMORY_RATIO_MIN_BASELINE_MB = 50.0


@dataclasses.dataclass(frozen=True)
class LeaderboardRow:
    dataset: str
    model: str
    mechanism: str
    epsilon_target: float | None
    delta: float | None
    metric: str
    utility_mean: float | None
    utility_std: float | None
    epsilon_claimed: float | None
    epsilon_certified: float | None
    epsilon_audited: float | None
    claim_status: str | None
    sigma: float | None
    accountant: str | None
    sampler: str | None
    step_time_ratio: float | None  # the trials' paired measurements (workers/overhead.py), None without one
    peak_memory_ratio: float | None
    examples_per_s: float | None
    wall_s: float | None
    n_finished: int
    n_failed: int
    batch_size: int | None = None
    pareto: bool = False  # an ok row; no other ok row has epsilon <= and utility >= (one strictly)
    mu_claimed: float | None = None  # one-step GDP view of the claim (mechanism-level audit)
    mu_audited: float | None = None  # one-step GDP lower bound measured by the audit
    epsilon_audited_step: float | None = None  # one un-subsampled step; not comparable to run epsilons
    peak_memory_mb: float | None = None  # extra peak memory of the training loop, mean over seeds
    step_time_ratio_low: float | None = None  # the 95% interval of step_time_ratio: the lowest low over seeds
    step_time_ratio_high: float | None = None  # and the highest high
    sweep: str | None = None  # rows of several sweeps are kept apart (`leaderboard A B`)
    # The one-run audit (docs/auditing.md): each estimator's lower bound, max over seeds like
    # `epsilon_audited`; the ceiling (what the same analysis reaches on the certified mechanism simulated
    # exactly), the black-box membership-inference view and the audit's cost, means over seeds.
    epsilon_audited_steinke: float | None = None
    epsilon_audited_fdp: float | None = None
    epsilon_audited_curve: float | None = None  # within the certified event's family (DP-SGD at q, T, any sigma)
    epsilon_audited_noise: float | None = None  # read off the noise the run really added (white-box measurement)
    audit_ceiling: float | None = None
    mia_auc: float | None = None
    mia_tpr_at_0_1pct_fpr: float | None = None
    audit_s: float | None = None
    audit_time_ratio: float | None = None
    # Where the trial's time went (seconds, means over seeds): planning, the accelerator, the analyses after.
    plan_s: float | None = None
    accelerator_s: float | None = None
    analysis_s: float | None = None
    private: bool = True  # the mechanism claims privacy (the records' `private`); False: the non-private reference
    # Tuning (dashboards/tuned_cells.py): "tuned (...): eps incl. tuning X", or "best of N, tuning unaccounted ..."
    tuning: str | None = None
    uncertified_reason: str | None = None  # why no sound analysis of what ran is known (the first seed's)
    audit_above_ceiling: bool | None = None  # some seed's audited epsilon exceeds its ceiling beyond its noise
    audit_violation: str | None = None  # what refutes the claim, in a few words (any seed's; `violation` column)


# The per-trial record fields the leaderboard aggregates itself by the schema's rule (the other
# columns are grouping keys or derived from several fields).
_KEYS = ("sweep", "dataset", "model", "mechanism", "epsilon_target")
AGGREGATED = tuple(f for f in schema.columns()
                   if f.section in ("metrics", "privacy") and f.aggregate in ("mean", "max", "min"))


def _flat(record: Mapping[str, Any], metric: str) -> dict[str, Any]:
    cfg, privacy, metrics = record["config"], record.get("privacy") or {}, record.get("metrics") or {}
    sections = {"config": cfg, "metrics": metrics, "privacy": privacy}
    return {
        "sweep": record.get("sweep"), "dataset": cfg["dataset"], "model": cfg["model"], "mechanism": cfg["mechanism"],
        "private": schema.is_private(record),
        "epsilon_target": cfg.get("epsilon"), "seed": cfg["seed"], "status": record["status"],
        "batch_size": (cfg.get("train") or {}).get("batch_size"), "utility": metrics.get(metric),
        "claim_status": privacy.get("claim_status"),
        "accountant": privacy.get("accountant"), "sampler": privacy.get("sampler"),
        "uncertified_reason": privacy.get("uncertified_reason"),
        "audit_violations": tuple(privacy.get("audit_violations")
                                  or (("above ceiling",) if privacy.get("audit_above_ceiling") else ())),
    } | {f.column: schema.value(sections[f.section], f) for f in AGGREGATED}


def _num(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


def _mean(values: pd.Series) -> float | None:
    v = pd.to_numeric(values, errors="coerce").dropna()
    return _num(v.mean()) if len(v) else None


PAIRED = ("step_time_ratio", "peak_memory_ratio")  # measured in each private trial (workers/overhead.py)


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _typed(field: schema.Field, value: float | None) -> Any:
    """A flag's aggregate as a flag (any seed flagged: True), a number as it is."""
    types = field.type if isinstance(field.type, tuple) else (field.type,)
    return bool(value) if value is not None and bool in types else value


def _max(values: pd.Series) -> float | None:
    v = pd.to_numeric(values, errors="coerce").dropna()
    return _num(v.max()) if len(v) else None


def _min(values: pd.Series) -> float | None:
    v = pd.to_numeric(values, errors="coerce").dropna()
    return _num(v.min()) if len(v) else None


COMBINE = {"mean": _mean, "max": _max, "min": _min}


def rows(records: Iterable[Mapping[str, Any]], *, metric: str = "accuracy",
         view: str = "certified") -> list[LeaderboardRow]:
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
    everything = list(records)
    records = tuned_cells.for_default_view(everything)  # a tuned cell is its selected candidate
    flags = tuned_cells.unaccounted(everything)
    frame = pd.DataFrame([_flat(r, metric) for r in records])
    frame["claim_status"] = sweep_claim_statuses(records)  # step audits corrected over each sweep (Holm)
    if frame.empty:
        return []
    keys = list(_KEYS)
    frame["sweep"] = frame["sweep"].fillna("")
    frame["epsilon_target"] = frame["epsilon_target"].astype(object).where(frame["epsilon_target"].notna(), None)
    ok = frame[frame.status == "finished"]
    base = ok[~ok.private.astype(bool)].groupby(["sweep", "dataset", "model", "batch_size"])[
        ["peak_memory_mb"]].mean()
    out: list[LeaderboardRow] = []
    for key, group in frame.groupby(keys, dropna=False, sort=True):
        sweep, dataset, model, mechanism, eps = key
        eps = None if eps is None or (isinstance(eps, float) and math.isnan(eps)) else float(eps)
        fin = group[group.status == "finished"]
        util = pd.to_numeric(fin.utility, errors="coerce").dropna()
        statuses = [s for s in fin.claim_status if isinstance(s, str)]
        batch = fin.batch_size.iloc[0] if len(fin) else None
        at = (sweep, dataset, model, batch)
        ref = base.loc[at] if at in base.index else None

        def ratio(col: str, ref: pd.Series | None = ref, fin: pd.DataFrame = fin,
                  floor: float = 0.0) -> float | None:
            mine = _mean(fin[col])
            den = None if ref is None else _num(ref[col])
            return mine / den if mine is not None and den and den >= floor else None

        out.append(LeaderboardRow(
            dataset=dataset, model=model, mechanism=mechanism, epsilon_target=eps,
            metric=metric,
            utility_mean=_num(util.mean()) if len(util) else None,
            utility_std=_num(util.std(ddof=1)) if len(util) > 1 else (0.0 if len(util) == 1 else None),
            claim_status=max(statuses, key=STATUS_ORDER.__getitem__) if statuses else None,
            accountant=next(iter(fin.accountant.dropna()), None),
            sampler=next(iter(fin.sampler.dropna()), None),
            uncertified_reason=next(iter(fin.uncertified_reason.dropna()), None),
            audit_violation=", ".join(dict.fromkeys(v for seed in fin.audit_violations for v in seed)) or None,
            # the trials' own paired measurements only (never two trials' medians); the reference is 1 by definition
            step_time_ratio=_mean(fin.step_time_ratio) if group.private.any() else (1.0 if len(fin) else None),
            peak_memory_ratio=_first(_mean(fin.peak_memory_ratio),
                                     ratio("peak_memory_mb", floor=MEMORY_RATIO_MIN_BASELINE_MB)),
            n_finished=int(len(fin)), n_failed=int((group.status == "failed").sum()),
            batch_size=int(batch) if batch is not None and batch == batch else None,
            sweep=sweep or None, private=bool(group.private.any()),
            # max for lower bounds (never averaged away) and epsilon_certified (never under-reported); an
            # interval's ends: the widest over seeds
            **{f.column: _typed(f, COMBINE[f.aggregate](fin[f.column])) for f in AGGREGATED if f.column not in PAIRED},
        ))
    out = [dataclasses.replace(r, tuning=tuned_cells.note_for(r, everything, flags)) for r in out]
    return rank(out, view)


def _eps_of(row: LeaderboardRow, view: str) -> float:
    eps = row.epsilon_certified if view == "certified" else row.epsilon_claimed
    return math.inf if eps is None else eps


def honest(row: LeaderboardRow) -> bool:
    """Whether the row may be ranked, put in bold, marked Pareto or drawn as a contender: its claim is `ok`.
    An overclaimed, violated or uncertified row is shown, its status in words, and never highlighted: an
    optimistic analysis must not top the board in any output."""
    return row.private and row.claim_status == "ok"


def tier(row: LeaderboardRow) -> int:
    """Where a row sorts within its dataset/model: honest rows (ranked), the non-private reference, then the
    rows whose claim is not `ok` (shown, not ranked)."""
    return 0 if honest(row) else 1 if not row.private else 2


def rank(board: list[LeaderboardRow], view: str = "certified") -> list[LeaderboardRow]:
    """Within each dataset/model: the honest rows first, by epsilon (the chosen view; no bound = inf) then
    utility; then the non-private reference; then the rest in the same order. The Pareto front (most utility
    for the least epsilon) is marked among the honest rows only."""
    contenders = [r for r in board if honest(r) and r.utility_mean is not None]

    def dominated(r: LeaderboardRow) -> bool:
        for o in contenders:
            if o is r or (o.dataset, o.model) != (r.dataset, r.model):
                continue
            if _eps_of(o, view) <= _eps_of(r, view) and o.utility_mean >= r.utility_mean and (
                    _eps_of(o, view) < _eps_of(r, view) or o.utility_mean > r.utility_mean):
                return True
        return False

    marked = [dataclasses.replace(r, pareto=any(r is c for c in contenders) and not dominated(r)) for r in board]
    return sorted(marked, key=lambda r: (r.dataset, r.model, tier(r), _eps_of(r, view),
                                         -(r.utility_mean if r.utility_mean is not None else -math.inf)))


def as_dicts(board: list[LeaderboardRow]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(r) for r in board]
