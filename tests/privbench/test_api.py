"""The Python API on real Ray and MLflow/SQLite: a sweep runs without the CLI and returns records and
DataFrames, a rerun resumes (nothing to do), callbacks see every trial, and importing it is light."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import TINY

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("local_ray")  # tests/conftest.py


class Recorder:
    """A user's callback: subclasses `privbench.Callback` and overrides a few hooks."""

    def __new__(cls):
        from privbench import Callback

        class _Recorder(Callback):
            def __init__(self) -> None:
                self.events: list[tuple] = []

            def on_sweep_start(self, spec, todo, max_concurrent, store):
                self.events.append(("sweep_start", spec.name, tuple(c.trial_key for c in todo)))

            def on_trial_start(self, config):
                self.events.append(("trial_start", config.trial_key))

            def on_trial_result(self, record, run_id):
                self.events.append(("trial_result", record["trial_key"], record["status"], run_id))

            def on_sweep_end(self, summary):
                self.events.append(("sweep_end", summary))

        return _Recorder()


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """One tiny sweep (digits, mlp, nonprivate + dpsgd, 1 epoch) run through the API."""
    from privbench import Sweep

    store = tmp_path_factory.mktemp("api") / "store"
    sweep = Sweep(yaml.safe_dump(TINY | {"name": "api"}), store=store)
    recorder = Recorder()
    summary = sweep.run(callbacks=[recorder])
    return sweep, summary, recorder, store


def test_a_sweep_runs_without_the_cli_and_returns_records_and_frames(ran):
    sweep, summary, _, _ = ran
    assert summary.ok and summary.counts == {"finished": 2}
    assert (summary.trials, summary.finished_before, summary.started) == (2, 0, 2)
    records = sweep.records()
    assert sorted(r["config"]["mechanism"] for r in records) == ["dpsgd", "nonprivate"]
    assert all(r["status"] == "finished" for r in records)
    board = sweep.leaderboard()
    assert sorted(board.mechanism) == ["dpsgd", "nonprivate"]
    dp = board[board.mechanism == "dpsgd"].iloc[0]
    assert dp.epsilon_certified > 0 and dp.n_finished == 1
    status = sweep.status()
    assert set(status.status) == {"finished"} and status.run_id.notna().all()
    results = sweep.results()
    assert "privacy.epsilon_certified" in results.columns and len(results) == 2


def test_a_custom_callback_sees_every_trial_start_and_result(ran):
    sweep, summary, recorder, _ = ran
    kinds = [e[0] for e in recorder.events]
    assert kinds[0] == "sweep_start" and kinds[-1] == "sweep_end"
    keys = {r["trial_key"] for r in sweep.records()}
    assert set(recorder.events[0][2]) == keys
    started = [e[1] for e in recorder.events if e[0] == "trial_start"]
    results = {e[1]: e for e in recorder.events if e[0] == "trial_result"}
    assert sorted(started) == sorted(keys) and set(results) == keys
    assert all(e[2] == "finished" and e[3] for e in results.values())  # recorded, with an MLflow run id
    for key in keys:  # each trial starts before its result
        assert recorder.events.index(("trial_start", key)) < recorder.events.index(results[key])
    assert recorder.events[-1][1] is summary


def test_a_rerun_resumes_with_nothing_to_do(ran):
    from privbench import Sweep, SweepError, run_sweep

    sweep, _, _, store = ran
    recorder = Recorder()
    again = run_sweep(sweep.spec, store=store, callbacks=[recorder])
    assert again.nothing_to_do and again.ok and again.started == 0 and again.counts == {"finished": 2}
    assert [e[0] for e in recorder.events] == ["sweep_end"]
    assert len(Sweep(name="api", store=store).records()) == 2  # read back by name alone
    with pytest.raises(SweepError, match="unknown sweep 'other'; known: api") as unknown:
        Sweep(name="other", store=store).counts()
    assert unknown.value.code == 2


def test_bad_input_is_a_one_line_error_with_the_cli_exit_code(tmp_path):
    from privbench import Sweep, SweepError

    with pytest.raises(SweepError) as bad:
        Sweep(yaml.safe_dump(TINY | {"grid": {"dataset": ["nope"], "model": ["mlp"],
                                               "mechanism": ["dpsgd"]}}), store=tmp_path / "s")
    assert bad.value.code == 2 and "nope" in str(bad.value) and "\n" not in str(bad.value)
    with pytest.raises(SweepError, match="no privbench store at") as missing:
        Sweep(name="missing", store=tmp_path / "s").records()
    assert missing.value.code == 2
    assert not (tmp_path / "s").exists()  # reading created nothing


def test_importing_the_api_imports_no_torch_ray_or_mlflow():
    code = ("import sys, json, privbench; from privbench import Sweep, run_sweep, Callback, load_grid; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=os.environ | {"PYTHONPATH": str(ROOT)}, check=True).stdout
    heavy = set(json.loads(out)) & {"torch", "ray", "mlflow", "pandas", "sqlalchemy", "opacus", "workers"}
    assert heavy == set()


def python_blocks(page: Path) -> list[str]:
    return page.read_text().split("```python\n")[1:]


def test_the_documented_notebook_example_runs(tmp_path, monkeypatch):
    """docs/api.md's example, as a reader would paste it: a tiny sweep, its records and a DataFrame."""
    import pandas as pd

    from privbench import Callback

    example, callback = (block.split("```")[0] for block in python_blocks(ROOT / "docs" / "api.md"))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(example, "docs/api.md", "exec"), scope)  # noqa: S102 - the documented code itself
    assert len(scope["records"]) == 2 and all(r["status"] == "finished" for r in scope["records"])
    assert isinstance(scope["board"], pd.DataFrame) and sorted(scope["board"].mechanism) == ["dpsgd", "nonprivate"]
    assert (tmp_path / "privbench-store").is_dir()
    exec(compile(callback, "docs/api.md", "exec"), scope)  # noqa: S102
    assert issubclass(scope["Accuracies"], Callback)
