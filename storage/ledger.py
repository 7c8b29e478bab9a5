"""The sweep ledger: which trials exist, their status and MLflow run, and their result record.

It is what makes resume exact: a trial is `finished` only once its MLflow run is complete, and the
ledger row is written last, so a crash at any point leaves at worst an unfinished row to redo.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

metadata = sa.MetaData()

sweeps = sa.Table(
    "privbench_sweeps", metadata,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("experiment_id", sa.String(64), nullable=False),
    sa.Column("grid_yaml", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

trials = sa.Table(
    "privbench_trials", metadata,
    sa.Column("sweep", sa.String(200), primary_key=True),
    sa.Column("trial_key", sa.String(64), primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),  # pending | running | finished | failed | superseded
    sa.Column("run_id", sa.String(64)),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("dataset", sa.String(200)),
    sa.Column("model", sa.String(200)),
    sa.Column("mechanism", sa.String(100)),
    sa.Column("epsilon", sa.Float),
    sa.Column("seed", sa.Integer),
    sa.Column("config_json", sa.Text, nullable=False),
    sa.Column("result_json", sa.Text),
    sa.Column("error", sa.Text),
    sa.Column("updated_at", sa.Float, nullable=False),
)

SQLITE_BUSY_TIMEOUT_MS = 30_000


def engine_for(uri: str) -> sa.Engine:
    eng = sa.create_engine(uri, future=True)
    if eng.dialect.name == "sqlite":
        @event.listens_for(eng, "connect")
        def _pragmas(dbapi_conn: Any, _: Any) -> None:  # concurrent readers (leaderboard, UI) wait
            dbapi_conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            dbapi_conn.execute("PRAGMA journal_mode = WAL")
    return eng


class Ledger:
    def __init__(self, uri: str, *, create: bool = False) -> None:
        self.engine = engine_for(uri)
        if create:
            metadata.create_all(self.engine)

    def has_schema(self) -> bool:
        return sa.inspect(self.engine).has_table("privbench_trials")

    # sweeps -------------------------------------------------------------------------------------
    def upsert_sweep(self, name: str, experiment_id: str, grid_yaml: str) -> None:
        now = time.time()
        with self.engine.begin() as c:
            if c.execute(sa.select(sweeps.c.name).where(sweeps.c.name == name)).first():
                c.execute(sweeps.update().where(sweeps.c.name == name).values(grid_yaml=grid_yaml, updated_at=now))
            else:
                c.execute(sweeps.insert().values(name=name, experiment_id=experiment_id, grid_yaml=grid_yaml,
                                                 created_at=now, updated_at=now))

    def sweep(self, name: str) -> dict[str, Any] | None:
        with self.engine.connect() as c:
            row = c.execute(sa.select(sweeps).where(sweeps.c.name == name)).mappings().first()
        return dict(row) if row else None

    def sweep_names(self) -> list[str]:
        with self.engine.connect() as c:
            return [r[0] for r in c.execute(sa.select(sweeps.c.name).order_by(sweeps.c.updated_at.desc()))]

    # trials -------------------------------------------------------------------------------------
    def sync_trials(self, sweep: str, configs: Iterable[Mapping[str, Any]]) -> list[str]:
        """Make the sweep's trials those of its current grid: insert new ones (pending), mark known ones
        that left the grid `superseded` (an edited grid must not mix old settings into the leaderboard as
        extra seeds, nor retry them), and give a trial that came back the status its result says.
        Returns the MLflow run ids that became superseded."""
        now = time.time()
        configs = list(configs)
        current = {cfg["trial_key"] for cfg in configs}
        superseded: list[str] = []
        with self.engine.begin() as c:
            known = {r.trial_key: r for r in c.execute(
                sa.select(trials.c.trial_key, trials.c.status, trials.c.run_id, trials.c.result_json)
                .where(trials.c.sweep == sweep))}
            for key, row in known.items():
                if key not in current and row.status != "superseded":
                    status = "superseded"
                    superseded += [row.run_id] if row.run_id else []
                elif key in current and row.status == "superseded":
                    status = json.loads(row.result_json)["status"] if row.result_json else "pending"
                else:
                    continue
                c.execute(trials.update().where((trials.c.sweep == sweep) & (trials.c.trial_key == key))
                          .values(status=status, updated_at=now))
            rows = [dict(sweep=sweep, trial_key=cfg["trial_key"], status="pending", attempts=0,
                         dataset=cfg["dataset"], model=cfg["model"], mechanism=cfg["mechanism"],
                         epsilon=cfg.get("epsilon"), seed=cfg["seed"], config_json=json.dumps(cfg),
                         updated_at=now)
                    for cfg in configs if cfg["trial_key"] not in known]
            if rows:
                c.execute(trials.insert(), rows)
        return superseded

    def mark_running(self, sweep: str, trial_key: str) -> None:
        with self.engine.begin() as c:
            c.execute(trials.update().where((trials.c.sweep == sweep) & (trials.c.trial_key == trial_key))
                      .values(status="running", attempts=trials.c.attempts + 1, updated_at=time.time()))

    def record(self, record: Mapping[str, Any], run_id: str | None) -> None:
        with self.engine.begin() as c:
            c.execute(trials.update()
                      .where((trials.c.sweep == record["sweep"]) & (trials.c.trial_key == record["trial_key"]))
                      .values(status=record["status"], run_id=run_id, result_json=json.dumps(record),
                              error=record.get("error"), updated_at=time.time()))

    def trials(self, sweep: str) -> list[dict[str, Any]]:
        with self.engine.connect() as c:
            rows = c.execute(sa.select(trials).where(trials.c.sweep == sweep)
                             .order_by(trials.c.dataset, trials.c.model, trials.c.mechanism,
                                       trials.c.epsilon, trials.c.seed)).mappings().all()
        return [dict(r) for r in rows]

    def status_counts(self, sweep: str) -> dict[str, int]:
        with self.engine.connect() as c:
            rows = c.execute(sa.select(trials.c.status, sa.func.count()).where(trials.c.sweep == sweep)
                             .group_by(trials.c.status)).all()
        return {s: n for s, n in rows}
