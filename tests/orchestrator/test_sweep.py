"""End to end on real Ray and real MLflow/SQLite: run, resume, failures, bad input, leaderboard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from dashboards.leaderboard import LeaderboardRow

LEADERBOARD_KEYS = {
    "dataset", "model", "mechanism", "epsilon_target", "delta", "metric", "utility_mean", "utility_std",
    "epsilon_claimed", "epsilon_certified", "epsilon_audited", "claim_status", "sigma", "accountant", "sampler",
    "step_time_ratio", "peak_memory_ratio", "examples_per_s", "wall_s", "n_finished", "n_failed",
}


pytestmark = pytest.mark.usefixtures("local_ray")  # tests/conftest.py


def active_runs(store: Path, sweep: str) -> list:
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = client.get_experiment_by_name(sweep)
    return [r for r in client.search_runs([exp.experiment_id]) if "privbench.sweep_run" not in r.data.tags]  # trials


def test_sweep_records_runs_and_leaderboard_then_rerun_adds_nothing(cli, write_grid, store):
    grid = write_grid({"seeds": [0, 1]})
    result = cli("sweep", "run", grid, "--store", store)
    assert result.exit_code == 0, result.output
    runs = active_runs(store, "tiny")
    assert len(runs) == 4
    assert {r.data.tags["status"] for r in runs} == {"finished"}
    dp = [r for r in runs if r.data.params["mechanism"] == "dpsgd"]
    assert all(r.data.tags["version.torch"] and r.data.tags["version.opacus"] for r in dp)
    assert all(r.data.metrics["epsilon_certified"] > 0 for r in dp)
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    curve = client.get_metric_history(dp[0].info.run_id, "test_accuracy")
    assert [m.step for m in curve] == [1]

    board = json.loads(cli("leaderboard", "tiny", "--store", store, "--format", "json").stdout)
    assert len(board) == 2 and all(LEADERBOARD_KEYS <= set(row) for row in board)
    dprow = next(r for r in board if r["mechanism"] == "dpsgd")
    assert dprow["n_finished"] == 2 and dprow["utility_std"] is not None
    assert dprow["epsilon_claimed"] == pytest.approx(dprow["epsilon_certified"])
    assert dprow["claim_status"] == "ok" and dprow["step_time_ratio"] > 0
    nonpriv = next(r for r in board if r["mechanism"] == "nonprivate")
    assert nonpriv["epsilon_certified"] is None and nonpriv["claim_status"] is None
    assert set(LeaderboardRow.__dataclass_fields__) >= LEADERBOARD_KEYS

    again = cli("sweep", "run", grid, "--store", store)
    assert again.exit_code == 0 and "4 already finished" in again.output.replace("\n", " ")
    assert len(active_runs(store, "tiny")) == 4

    status = json.loads(cli("sweep", "status", "tiny", "--store", store, "--json").stdout)
    assert status["counts"] == {"finished": 4}
    listing = json.loads(cli("sweep", "list", "--store", store, "--json").stdout)
    assert listing["sweeps"][0]["sweep"] == "tiny"
    for fmt in ("csv", "markdown", "latex", "html"):
        assert "dpsgd" in cli("leaderboard", "--store", store, "--format", fmt).stdout


def test_edited_grid_supersedes_old_trials_and_reverting_restores_them(cli, write_grid, store):
    """Changing dpsgd's lr makes a new trial; the old one must not count as a second seed, nor be rerun."""
    first = write_grid({"name": "edited"})
    assert cli("sweep", "run", first, "--store", store).exit_code == 0
    edited = write_grid({"name": "edited", "mechanism_train": {"dpsgd": {"lr": 0.2}}})
    result = cli("sweep", "run", edited, "--store", store)
    assert result.exit_code == 0 and "1 already finished, 1 to run" in result.output.replace("\n", " ")
    status = json.loads(cli("sweep", "status", "edited", "--store", store, "--json").stdout)
    assert status["counts"] == {"finished": 2, "superseded": 1}
    board = json.loads(cli("leaderboard", "edited", "--store", store, "--format", "json").stdout)
    assert {r["mechanism"]: r["n_finished"] for r in board} == {"nonprivate": 1, "dpsgd": 1}
    runs = active_runs(store, "edited")
    assert len(runs) == 3  # the superseded run is kept for history, and flagged
    old = [r for r in runs if r.data.tags.get("privbench.superseded") == "true"]
    assert len(old) == 1 and old[0].data.params["train.lr"] == "0.5"

    again = cli("sweep", "run", first, "--store", store)  # back to the first grid: nothing to run
    assert again.exit_code == 0 and "2 already finished, 0 to run" in again.output.replace("\n", " ")
    status = json.loads(cli("sweep", "status", "edited", "--store", store, "--json").stdout)
    assert status["counts"] == {"finished": 2, "superseded": 1}


def test_a_grid_runs_in_parts_with_only_and_no_part_supersedes_another(cli, write_grid, store):
    """`--only` runs part of the grid under the whole grid: the part's trials run, the others stay pending (not
    superseded, no 'not run' failure), and the next part completes the sweep."""
    grid = write_grid({"name": "parts", "seeds": [0, 1]})
    first = cli("sweep", "run", grid, "--store", store, "--only", "seed=0")
    assert first.exit_code == 0, first.output
    assert "2 trials, 0 already finished, 2 to run" in first.output.replace("\n", " ")
    status = json.loads(cli("sweep", "status", "parts", "--store", store, "--json").stdout)
    assert status["counts"] == {"finished": 2, "pending": 2}
    board = json.loads(cli("leaderboard", "parts", "--store", store, "--format", "json").stdout)
    assert {r["mechanism"]: r["n_finished"] for r in board} == {"nonprivate": 1, "dpsgd": 1}
    rest = cli("sweep", "run", grid, "--store", store)
    assert rest.exit_code == 0 and "2 already finished, 2 to run" in rest.output.replace("\n", " ")
    status = json.loads(cli("sweep", "status", "parts", "--store", store, "--json").stdout)
    assert status["counts"] == {"finished": 4}
    bad = cli("sweep", "run", grid, "--store", store, "--only", "seed=7")
    assert bad.exit_code == 2 and "--only seed='7': no trial of the grid has it (it has 0, 1)" in bad.output


def test_failing_trial_is_recorded_and_the_rest_finish(cli, write_grid, store):
    grid = write_grid({"name": "withfail", "grid": {"dataset": ["digits", "synthetic"], "model": ["mlp"],
                                                    "mechanism": ["nonprivate"]},
                       "dataset_options": {"synthetic": {"n_train": 10}}})  # valid, but smaller than a batch
    result = cli("sweep", "run", grid, "--store", store)
    assert result.exit_code == 1
    assert "1 trial(s) failed" in result.output and "synthetic" in result.output
    runs = {r.data.params["dataset"]: r for r in active_runs(store, "withfail")}
    assert runs["digits"].data.tags["status"] == "finished" and runs["digits"].info.status == "FINISHED"
    assert runs["synthetic"].data.tags["status"] == "failed" and runs["synthetic"].info.status == "FAILED"
    assert "exceeds dataset_size" in runs["synthetic"].data.tags["error"]
    status = json.loads(cli("sweep", "status", "withfail", "--store", store, "--json").stdout)
    failed = [t for t in status["trials"] if t["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["error"]
    # a rerun retries the failed trial (and only it); it fails again and keeps one run per trial
    rerun = cli("sweep", "run", grid, "--store", store)
    assert rerun.exit_code == 1 and len(active_runs(store, "withfail")) == 2


@pytest.mark.parametrize("overrides, text, fragment", [
    ({"grid": {"dataset": ["nope"], "model": ["mlp"], "mechanism": ["dpsgd"]}}, None, "unknown dataset"),
    ({"grid": {"dataset": ["digits"], "model": ["nope"], "mechanism": ["dpsgd"]}}, None, "unknown model"),
    ({"grid": {"dataset": ["digits"], "model": ["mlp"], "mechanism": ["nope"]}}, None, "unknown mechanism"),
    ({"grid": {"dataset": ["digits"], "model": ["mlp"], "mechanism": ["dpsgd"], "epsilon": [0]}}, None, "epsilon"),
    ({"delta": 2}, None, "delta"),
    (None, "name: bad\ngrid: [unclosed\n", "YAML syntax error"),
    ({"resources": {"cpus": 1, "gpus": 1}}, None, "GPUs"),
])
def test_bad_grid_exits_2_and_writes_nothing(cli, write_grid, store, overrides, text, fragment):
    grid = write_grid(overrides, text=text)
    result = cli("sweep", "run", grid, "--store", store)
    assert result.exit_code == 2
    assert fragment in result.output
    assert not store.exists()
