"""The sweep's own MLflow run (issue 41): its page shows the sweep's summary (as the experiment's description
does), and its duration is the time of the `sweep run` attempts that completed, not the hours between a killed
attempt and the rerun that finished the sweep. A real file store and MLflow; two drivers one after the other,
the first killed (it never logs the sweep's files)."""

from __future__ import annotations

import time

from storage.location import resolve
from storage.mlflow_sink import SUMMARY_FILE, SWEEP_SECONDS_TAG
from storage.mlflow_view import NOTE_TAG
from storage.store import Store

TRIAL = {"trial_key": "k0", "dataset": "digits", "model": "mlp", "mechanism": "nonprivate", "epsilon": None,
         "seed": 0}
KILLED_AFTER_S = 1.5  # the killed attempt's time; the run's duration must not include it


def test_sweep_run_shows_the_summary_and_counts_completed_attempts_only(tmp_path):
    first = Store(resolve(str(tmp_path / "store")), create=True)
    first.open_sweep("s1", "name: s1\n", [TRIAL])  # the attempt that is killed: no summary, no end
    first.close()
    time.sleep(KILLED_AFTER_S)  # the killed driver's work: elapsed time, not synchronisation
    second = Store(resolve(str(tmp_path / "store")), create=True)  # a writer: the driver of the rerun
    second.open_sweep("s1", "name: s1\n", [TRIAL])
    began = time.time()
    run_id = second.log_sweep_files("s1", {SUMMARY_FILE: "**s1**: 1 trials, 1 finished.\n", "leaderboard.md": "x"})
    took = time.time() - began
    run = second.sink.client.get_run(run_id)
    second.close()
    assert run.data.tags[NOTE_TAG] == "**s1**: 1 trials, 1 finished.\n"  # the run's page shows the summary
    duration = (run.info.end_time - run.info.start_time) / 1000
    assert duration == float(run.data.tags[SWEEP_SECONDS_TAG]) or abs(
        duration - float(run.data.tags[SWEEP_SECONDS_TAG])) < 0.002
    assert duration < KILLED_AFTER_S  # only the second attempt (open to files logged), not the killed one
    assert run.info.status == "FINISHED" and duration <= took + 1.0


def test_a_long_summary_is_cut_at_a_line_to_fit_mlflow_and_says_where_the_rest_is(tmp_path, caplog):
    """A 114-trial sweep's summary (9,165 characters) is over MLflow's 8,000 for a run tag: MLflow cut it mid-line
    and warned on the driver's terminal. The run's description now ends at a whole line with a pointer to the
    summary file; the experiment's (20,000 allowed) is the whole summary; MLflow warns nothing."""
    from storage.mlflow_sink import fitted

    summary = "".join(f"| row {i} | {'x' * 60} |\n" for i in range(150))
    assert 8_000 < len(summary) < 20_000 and fitted(summary, len(summary)) == summary
    store = Store(resolve(str(tmp_path / "store")), create=True)
    try:
        store.open_sweep("s1", "name: s1\n", [TRIAL])
        run_id = store.log_sweep_files("s1", {SUMMARY_FILE: summary})
        run = store.sink.client.get_run(run_id)
        experiment = store.sink.client.get_experiment(run.info.experiment_id)
    finally:
        store.close()
    note = run.data.tags[NOTE_TAG]
    assert len(note) <= 8_000 and note.endswith(f"the whole summary is this run's `{SUMMARY_FILE}`)\n")
    kept = note.split("\n\n(cut to")[0]
    assert summary.startswith(kept + "\n") and kept.endswith("|")  # whole lines only
    assert experiment.tags[NOTE_TAG] == summary
    assert not [r for r in caplog.records if "truncated" in r.getMessage()]
