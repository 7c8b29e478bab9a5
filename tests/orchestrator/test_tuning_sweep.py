"""A tuned grid through the real CLI on a local Ray: each candidate is recorded with its tuning fields, a
rerun resumes the same draws, the tuned view shows the selected candidate, and untuned runs at another
setting of the same cell are flagged as unaccounted tuning."""

from __future__ import annotations

import json

import pytest
import yaml

from dashboards import tuned_cells
from storage.location import resolve
from storage.store import Store
from workers.tuning_candidates import RECORD_FIELDS

GRID = {
    "name": "tuned", "seeds": [0], "delta": 1e-5,
    "grid": {"dataset": ["digits"], "model": ["mlp"], "mechanism": ["dpsgd"], "epsilon": [2]},
    "dataset_options": {"digits": {"val_fraction": 0.1}},
    "train": {"epochs": 1, "batch_size": 64, "lr": 0.5},
    "audit": {"mode": "off"},
    "tune": {"space": {"lr": [0.2, 0.5, 1.0], "clip": [0.5, 1.0]}, "runs": {"distribution": "geometric", "mean": 2}},
}
K = 2  # geometric(mean 2) at seed 0


pytestmark = pytest.mark.usefixtures("local_ray")  # tests/conftest.py


def records(store, sweep: str) -> list[dict]:
    st = Store(resolve(str(store)))
    try:
        return st.records(sweep)
    finally:
        st.close()


@pytest.mark.slow
def test_a_tuned_sweep_records_resumes_and_ranks(cli, tmp_path, store):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(GRID))
    result = cli("sweep", "run", path, "--store", store)
    assert result.exit_code == 0, result.output
    found = records(store, "tuned")
    assert len(found) == K and {r["status"] for r in found} == {"finished"}
    for r in found:
        p = r["privacy"]
        assert set(RECORD_FIELDS) <= set(p)
        assert p["tuning_runs"] == K and p["tuning_budget"] == "total"
        assert p["tuning_distribution"] == "geometric(mean 2)"
        assert p["epsilon_certified_tuned"] <= 2.0 and p["epsilon_certified"] < 2.0
        assert r["config"]["tuning"]["candidate"] == p["tuning_candidate"]
    assert {r["privacy"]["tuning_candidate"] for r in found} == set(range(K))

    again = cli("sweep", "run", path, "--store", store)
    assert again.exit_code == 0 and f"{K} already finished" in again.output.replace("\n", " ")
    assert sorted(r["trial_key"] for r in records(store, "tuned")) == sorted(r["trial_key"] for r in found)

    (row,) = json.loads(cli("leaderboard", "tuned", "--store", store, "--view", "tuned", "--format", "json").stdout)
    best = max(found, key=lambda r: (r["metrics"]["val_accuracy"], -r["privacy"]["tuning_candidate"]))
    assert row["utility_mean"] == pytest.approx(best["metrics"]["accuracy"])
    assert row["epsilon_tuned"] == pytest.approx(best["privacy"]["epsilon_certified_tuned"])
    default = cli("leaderboard", "tuned", "--store", store, "--format", "markdown").stdout
    assert "dpsgd eps 2: tuned (geometric(mean 2), budget total)" in default

    # the same cell run without `tune:` at two learning rates, compared on the leaderboard: best of 2
    for lr, name in ((0.2, "plain-a"), (1.0, "plain-b")):
        plain = {k: v for k, v in GRID.items() if k != "tune"} | {"name": name, "train": GRID["train"] | {"lr": lr}}
        path.write_text(yaml.safe_dump(plain))
        assert cli("sweep", "run", path, "--store", store).exit_code == 0
    board = cli("leaderboard", "plain-a", "plain-b", "--store", store, "--format", "markdown").stdout
    flag = tuned_cells.unaccounted(records(store, "plain-a") + records(store, "plain-b"))
    (note,) = flag.values()
    assert note.settings == 2 and note.epsilon_fixed_runs > 2.0
    assert board.count(f"dpsgd eps 2: {note.note()}") == 2
