"""orchestrator/submit.py fans a trial out phase by phase (issue 19): a plan shared by the trials that share its
settings, per-phase times in the record and in MLflow, a lost analysis phase rerun from the stored accelerator
output, without retraining, with every trial recorded exactly once, and a freed slot given to a trial whose plan
is ready."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient

from orchestrator import grid
from tests.conftest import TINY
from workers.trial import AcceleratorOutput, accelerator_phase, analysis_phase, plan_phase, step_phase

PHASES = ("plan_s", "accelerator_s", "analysis_s")


def trial_runs(store: Path, sweep: str) -> list:
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = client.get_experiment_by_name(sweep)
    return [r for r in client.search_runs([exp.experiment_id]) if "privbench.sweep_run" not in r.data.tags]


def test_the_accelerator_output_survives_the_ledger_and_gives_the_same_analysis():
    """What the analysis phase needs crosses the ledger as JSON: the bounds and MIA scores computed from the
    stored copy are those of the live one (no model, no retraining)."""
    import yaml

    spec = grid.parse(yaml.safe_dump(TINY | {"grid": TINY["grid"] | {"mechanism": ["dpsgd"]},
                                             "audit": {"mode": "one-run", "canaries": 200, "family_bounds": False}}))
    (config,) = spec.trials
    planned = plan_phase(config)
    output = accelerator_phase(config, planned)
    stored = AcceleratorOutput.from_dict(json.loads(json.dumps(output.to_dict())))
    live = analysis_phase(config, planned, output, step_phase(config, planned))
    again = analysis_phase(config, planned, stored, {})
    for key in ("epsilon_audited", "epsilon_audited_steinke", "epsilon_audited_fdp", "audit_ceiling", "mia_auc",
                "mia_tpr_at_1pct_fpr", "epsilon_certified"):
        assert again["privacy"][key] == live["privacy"][key], key
    assert live["privacy"]["epsilon_audited"] is not None and live["privacy"]["mia_auc"] is not None
    assert set(PHASES) <= set(live["metrics"]) and live["metrics"]["accelerator_s"] >= live["metrics"]["train_s"]


def test_a_plan_made_for_another_process_is_refused():
    import dataclasses

    import yaml

    spec = grid.parse(yaml.safe_dump(TINY | {"grid": TINY["grid"] | {"mechanism": ["dpsgd"]}}))
    (config,) = spec.trials
    planned = plan_phase(config)
    bigger = dataclasses.replace(config, train=dataclasses.replace(config.train, max_train_examples=500))
    with pytest.raises(RuntimeError, match="accounted process must be the executed one"):
        accelerator_phase(bigger, planned)


def test_seeds_share_one_plan_and_phase_times_reach_mlflow(local_ray, cli, write_grid, store):
    grid_file = write_grid({"name": "phases", "seeds": [0, 1, 2], "audit": {"mode": "step", "samples": 200}})
    result = cli("sweep", "run", grid_file, "--store", store)
    assert result.exit_code == 0, result.output
    from storage.store import Store

    records = Store(store).records("phases")
    dp = [r for r in records if r["config"]["mechanism"] == "dpsgd"]
    assert len(dp) == 3
    # one plan task for the three seeds: the same object, so the same seconds to the last bit
    assert len({r["metrics"]["plan_s"] for r in dp}) == 1
    assert len({r["metrics"]["calibration_s"] for r in dp}) == 1
    assert all(r["privacy"]["mu_audited"] is not None for r in dp)  # the one-step audit ran beside training
    for run in trial_runs(store, "phases"):
        assert all(run.data.metrics[m] > 0 for m in PHASES), run.data.metrics
        # the trial's span from its accelerator phase to its analysis: at least the training phase itself
        assert run.data.metrics["wall_s"] >= run.data.metrics["accelerator_s"]


def test_a_trial_with_a_stored_accelerator_output_is_analysed_without_training(local_ray):
    """The driver's loop (orchestrator/submit.py) on real Ray: a trial whose accelerator output is stored
    gets only its plan and analysis tasks; the others train."""
    import yaml

    from orchestrator.cluster import resolve_gpus
    from orchestrator.submit import run_all

    spec = grid.parse(yaml.safe_dump(TINY | {"seeds": [0, 1], "grid": TINY["grid"] | {"mechanism": ["dpsgd"]},
                                             "audit": {"mode": "one-run", "canaries": 100}}))
    trials = resolve_gpus(list(spec.trials), 0.0)
    stored_trial = trials[0]
    stored = accelerator_phase(stored_trial, plan_phase(stored_trial)).to_dict()  # trained here, in this process
    saved, records = {}, []
    run_all(trials, max_concurrent=1, retries=0, on_start=lambda c: True, on_result=records.append,
            load_phase=lambda c: stored if c.trial_key == stored_trial.trial_key else None,
            save_phase=lambda c, out: saved.setdefault(c.trial_key, out))
    by_key = {r["trial_key"]: r for r in records}
    assert [r["status"] for r in records] == ["finished", "finished"]
    assert by_key[stored_trial.trial_key]["environment"]["pid"] == os.getpid()  # not trained again
    assert list(saved) == [trials[1].trial_key]  # only the trained trial's output was stored
    assert by_key[trials[1].trial_key]["environment"]["pid"] != os.getpid()
    assert all(r["privacy"]["epsilon_audited"] is not None for r in records)


def ledger_rows(ledger: Path) -> list[tuple]:
    with sqlite3.connect(ledger, timeout=30) as db:
        return db.execute("select trial_key, status, phase_json is not null from privbench_trials").fetchall()


@pytest.mark.slow  # two drivers, each starting Ray: about 100 s on 2 cores
def test_a_lost_analysis_reruns_from_the_stored_accelerator_output(write_grid, store):
    """The driver is killed right after storing a trial's accelerator output (fault point
    `after_phase_saved`): the rerun analyses that trial without training it again, and every trial ends up
    recorded once in the ledger and in MLflow."""
    grid_file = write_grid({"name": "lostphase", "audit": {"mode": "one-run", "canaries": 100}})
    cmd = [sys.executable, "-m", "orchestrator", "sweep", "run", str(grid_file), "--store", str(store),
           "--max-concurrent", "1"]
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    killed = subprocess.run(cmd, env=env | {"PRIVBENCH_FAULT": "after_phase_saved"}, capture_output=True,
                            text=True, timeout=600, start_new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    rows = ledger_rows(store / "ledger.db")
    saved = [key for key, status, has_phase in rows if has_phase]
    assert len(saved) == 1 and all(status != "finished" for _, status, _ in rows)

    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert [(status, has_phase) for _, status, has_phase in ledger_rows(store / "ledger.db")] == \
        [("finished", False)] * 2  # the stored output is dropped once the trial is recorded
    from storage.store import Store

    records = {r["trial_key"]: r for r in Store(store).records("lostphase")}
    restored = records[saved[0]]
    assert restored["environment"].get("accelerator_restored") is True
    assert all("accelerator_restored" not in r["environment"] for k, r in records.items() if k != saved[0])
    if restored["config"]["mechanism"] == "dpsgd":
        assert restored["privacy"]["epsilon_audited"] is not None
    keys = [r.data.tags["privbench.trial_key"] for r in trial_runs(store, "lostphase")]
    assert sorted(keys) == sorted(records) and len(keys) == 2


def test_retries_rerun_a_failed_trial_and_record_it_once(local_ray, cli, write_grid, store):
    grid_file = write_grid({"name": "retried", "grid": {"dataset": ["synthetic"], "model": ["mlp"],
                                                        "mechanism": ["nonprivate"]},
                            "dataset_options": {"synthetic": {"n_train": 10}}})  # valid, but smaller than a batch
    result = cli("sweep", "run", grid_file, "--store", store, "--retries", "2")
    assert result.exit_code == 1 and "accelerator phase" in result.output  # non-private: no plan phase
    status = json.loads(cli("sweep", "status", "retried", "--store", store, "--json").stdout)
    (row,) = status["trials"]
    assert row["status"] == "failed" and row["attempts"] == 3 and "exceeds dataset_size" in row["error"]
    assert len(trial_runs(store, "retried")) == 1


def test_a_freed_slot_takes_the_first_trial_whose_plan_is_ready():
    from orchestrator.submit import ready_first

    queue = deque(SimpleNamespace(config=name) for name in ("dp-a", "dp-b", "ref", "dp-c"))
    assert ready_first(queue, lambda c: c == "ref", 32) == 2  # the DP plans are not made yet
    assert ready_first(queue, lambda c: c in ("dp-b", "ref"), 32) == 1  # the queue's order among the ready
    assert ready_first(queue, lambda c: False, 32) == 0  # none ready: the first, as before
    assert ready_first(queue, lambda c: c == "ref", 2) == 0  # beyond the window: not looked at
