"""One name per number: the record schema (storage/schema.py) declares every field a real trial writes,
and the leaderboard, MLflow and exports take their names from it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from storage import schema

AUDITED = dict(dataset="digits", model="mlp", delta=1e-5, seed=0, train=dict(epochs=1, batch_size=64, lr=0.5),
               audit={"mode": "both", "canaries": 100, "samples": 2000, "dim": 50})


@pytest.fixture(scope="module")
def real_records() -> list[dict]:
    """Three real trials (a few seconds, no Ray): DP-SGD with every audit, non-private, and one that fails."""
    from workers.trial import run_trial

    configs = [AUDITED | dict(mechanism="dpsgd", epsilon=2.0), AUDITED | dict(mechanism="nonprivate", epsilon=None),
               AUDITED | dict(mechanism="dpsgd", epsilon=2.0, train=dict(epochs=1, batch_size=64, lr=float("nan")))]
    records = [run_trial(dict(c, sweep="schema", trial_key=f"k{i}")) for i, c in enumerate(configs)]
    assert [r["status"] for r in records] == ["finished", "finished", "failed"], records[2].get("traceback")
    return records


def _typed(value, f: schema.Field) -> bool:
    return value is None or isinstance(value, f.type) and not (isinstance(value, bool) and bool not in (
        f.type if isinstance(f.type, tuple) else (f.type,)))


def test_every_key_of_a_real_trial_record_is_declared_with_its_type(real_records):
    for record in real_records:
        assert schema.undeclared(record) == {}, record["status"]
        for section in ("config", "metrics", "privacy"):
            for key, value in (record.get(section) or {}).items():
                f = schema.field(section, key)
                assert _typed(value, f), f"{section}.{key} = {value!r} is not {f.type}"
    dp, nonprivate, _ = real_records
    assert dp["privacy"]["epsilon_audited_steinke"] is not None and "mia_tpr_at_0_1pct_fpr" in dp["privacy"]
    for f in schema.fields("privacy"):  # private-only fields stay empty for the non-private reference
        if f.private_only:
            assert nonprivate["privacy"].get(f.key) is None, f.key


def test_is_private_reads_an_old_record_as_the_worker_decided(real_records):
    """The record's `private` is the trial's (`TrialConfig.private`); a record without it (older, or failed
    before it was written) reads the same from its config."""
    from workers.config import TrialConfig

    for record in real_records:
        c = record["config"]
        decided = TrialConfig(dataset=c["dataset"], model=c["model"], mechanism=c["mechanism"],
                              epsilon=c.get("epsilon"), sigma=c.get("sigma")).private
        assert schema.is_private({"config": record["config"]}) == decided, record["config"]["mechanism"]
        if "private" in (record.get("privacy") or {}):
            assert schema.is_private(record) == decided
    assert [schema.is_private(r) for r in real_records[:2]] == [True, False]


def test_names_are_unique_legal_for_mlflow_and_legacy_names_are_not_current_ones():
    seen = [(f.section, f.key) for f in schema.FIELDS]
    assert len(seen) == len(set(seen))
    for f in schema.FIELDS:
        assert all(c.isalnum() or c in "_-./: " for c in f.key), f.key  # MLflow's rule for metric names
        assert not set(f.legacy) & schema.keys(f.section), f.key
        flag = bool in (f.type if isinstance(f.type, tuple) else (f.type,))  # any seed's flag: the max
        if f.aggregate == "max" and not flag:  # lower bounds and the certified bound: never averaged away, and
            assert f.key.startswith(("epsilon_", "mu_audited", "step_time_ratio_high")), f.key  # an interval's top
    columns = [f.column for f in schema.columns()]
    assert len(columns) == len(set(columns))
    headers = [f.header for f in schema.FIELDS if f.header]
    assert sorted(headers) == sorted(schema.DISPLAY_ORDER) and all(f.group for f in schema.FIELDS if f.header)
    for name in ("plan_s", "accelerator_s", "analysis_s"):
        f = schema.field("metrics", name)
        assert f.group == "overhead" and f.aggregate == "mean" and f.unit == "s" and f.mlflow


def test_schema_is_a_leaf_module():
    """No torch, pandas or other privbench module is imported with it (anything may import it)."""
    code = ("import sys; import storage.schema; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pandas', 'numpy', 'mlflow', "
            "'storage', 'workers', 'mechanisms', 'dashboards', 'orchestrator')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['storage', 'storage.schema']"


def test_leaderboard_fields_headers_and_exports_come_from_the_schema(real_records):
    from dashboards.leaderboard import LeaderboardRow, rows
    from dashboards.render import display, render

    assert [f.name for f in dataclasses.fields(LeaderboardRow)] and {
        f.name for f in dataclasses.fields(LeaderboardRow)} == {f.column for f in schema.columns()}
    board = rows(real_records[:2])
    assert set(json.loads(render(board, "json"))[0]) == {f.column for f in schema.columns()}
    assert set(render(board, "csv").splitlines()[0].split(",")) == {f.column for f in schema.columns()}
    assert set(render([], "csv").splitlines()[0].split(",")) == {f.column for f in schema.columns()}
    headers = {f.header for f in schema.FIELDS if f.header}
    assert {h for h, _ in display(board, "all")} <= headers
    dp = next(r for r in board if r.mechanism == "dpsgd")
    privacy = real_records[0]["privacy"]
    assert dp.epsilon_audited_steinke == privacy["epsilon_audited_steinke"]
    assert dp.mia_tpr_at_0_1pct_fpr == privacy["mia_tpr_at_0_1pct_fpr"]


def test_records_of_older_stores_still_read_under_the_new_names():
    from dashboards.leaderboard import rows

    old = {"sweep": "s", "status": "finished", "metrics": {"accuracy": 0.8},
           "config": {"dataset": "d", "model": "m", "mechanism": "dpsgd", "epsilon": 1.0, "seed": 0},
           "privacy": {"epsilon_certified": 1.0, "audit_epsilon_steinke": 0.3, "audit_epsilon_curve": 0.6,
                       "mia_tpr_at_0.1%_fpr": 0.01}}
    (r,) = rows([old])
    assert (r.epsilon_audited_steinke, r.epsilon_audited_curve, r.mia_tpr_at_0_1pct_fpr) == (0.3, 0.6, 0.01)


def test_mlflow_metrics_and_the_export_use_schema_names(real_records, store):
    from orchestrator.cli import app
    from storage.location import resolve
    from storage.store import Store

    st = Store(resolve(store), create=True)
    st.open_sweep("schema", "yaml", [r["config"] for r in real_records])
    run_ids = [st.record(r) for r in real_records]
    st.close()
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    declared = {f.key for f in schema.FIELDS if f.mlflow}
    for run_id in run_ids:
        logged = set(client.get_run(run_id).data.metrics)
        assert logged and logged <= declared, logged - declared
    dp = client.get_run(run_ids[0]).data.metrics
    assert dp["epsilon_audited_steinke"] == real_records[0]["privacy"]["epsilon_audited_steinke"]
    assert dp["mia_tpr_at_0_1pct_fpr"] == pytest.approx(real_records[0]["privacy"]["mia_tpr_at_0_1pct_fpr"])

    out = store.parent / "export.csv"
    done = CliRunner().invoke(app, ["export", "schema", "--store", str(store), "--format", "csv", "--out", str(out)])
    assert done.exit_code == 0, done.output
    for column in out.read_text().splitlines()[0].split(","):
        section, _, rest = column.partition(".")
        if rest:
            assert rest.split(".")[0] in schema.keys(section), column
        else:
            assert column in schema.keys("record"), column
