"""Damaged stores through the CLI (issue 31, items 1, 2, 4 and 11): one line and exit 2 naming the file and its
recovery, nothing written, the read commands never showing a damaged ledger as empty, `privbench store
check|rebuild-ledger|rebuild-mirror`, and `--out` refused onto a hard link of the ledger. No Ray: a
refused `sweep run` stops before Ray starts."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from orchestrator import grid
from storage.location import resolve
from storage.store import Store
from tests.storage.test_ledger_survives_mirror import active_runs, digest, ledger_rows, zero
from tests.storage.test_store import client_of

GRID = "name: four\nseeds: [0, 1, 2, 3]\ngrid: {dataset: [digits], model: [mlp], mechanism: [nonprivate]}\n"


@pytest.fixture
def four(tmp_path: Path) -> tuple[Path, Path]:
    """A store whose 4-trial sweep is finished, written as the driver writes it (no Ray), and its grid."""
    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    spec = grid.load(path)
    folder = tmp_path / "store"
    st = Store(resolve(folder), create=True)
    st.open_sweep(spec.name, spec.text, [t.to_dict() for t in spec.trials], key_of=grid.stored_key)
    for cfg in (t.to_dict() for t in spec.trials):
        assert st.claim(spec.name, cfg["trial_key"])
        st.record({"sweep": spec.name, "trial_key": cfg["trial_key"], "status": "finished", "config": cfg,
                   "metrics": {"accuracy": 0.9, "wall_s": 1.0}})
    st.release(spec.name)
    st.close()
    return folder, path


def error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert "Traceback" not in result.output and len(lines) == 1, result.output
    return lines[0]


def test_a_damaged_mlflow_db_stops_a_rerun_and_the_ledger_keeps_its_results(four, cli, tmp_path):
    folder, grid_file = four
    zero(folder / "mlflow.db", "runs", 0.5, 1.0)
    before, mirror = ledger_rows(folder), digest(folder / "mlflow.db")
    grid_file.write_text(GRID.replace("[0, 1, 2, 3]", "[0, 1, 2, 3, 4]"))  # one seed added
    for extra in ((), ("--reconcile",)):
        result = cli("sweep", "run", grid_file, "--store", folder, *extra)
        assert result.exit_code == 2 and "mlflow.db is damaged" in error_line(result)
        assert "rebuild-mirror" in result.output
    assert ledger_rows(folder) == before and digest(folder / "mlflow.db") == mirror
    out = tmp_path / "export.json"
    assert cli("export", "four", "--store", folder, "--out", out).exit_code == 0
    assert len(json.loads(out.read_text())) == 4
    check = cli("store", "check", "--store", folder)
    assert check.exit_code == 2 and "ledger.db: ok" in check.output and "mlflow.db is damaged" in check.output
    rebuilt = cli("store", "rebuild-mirror", "--store", folder)
    assert rebuilt.exit_code == 0 and "4 finished" in rebuilt.output, rebuilt.output
    assert active_runs(folder, "four") == {k: 1 for k in before}
    assert cli("store", "check", "--store", folder).exit_code == 0
    # the sweep's summary is back too: the experiment's description and the parent run's files
    client = client_of(folder)
    experiment = client.get_experiment_by_name("four")
    assert experiment.tags["mlflow.note.content"].startswith("four: 4 trials, 4 finished"), experiment.tags
    parent = next(r for r in client.search_runs([experiment.experiment_id])
                  if r.data.tags.get("privbench.sweep_run") == "true")
    assert [p for p in folder.rglob("summary.md") if parent.info.run_id in str(p)], parent.info.artifact_uri


def test_a_damaged_ledger_is_never_read_as_empty_and_is_rebuilt_from_the_mirror(four, cli, tmp_path):
    folder, grid_file = four
    zero(folder / "ledger.db", "sqlite_autoindex_privbench_trials_1", 0.5, 1.0)
    mirror = digest(folder / "mlflow.db")
    out = tmp_path / "export.json"
    for args in (("sweep", "list", "--json"), ("sweep", "status", "four", "--json"),
                 ("export", "four", "--out", out), ("leaderboard", "four"), ("sweep", "run", grid_file)):
        result = cli(*args, "--store", folder)
        assert result.exit_code == 2, (args, result.output)
        line = error_line(result)
        assert "ledger.db is damaged" in line and "rebuild-ledger" in line, line
    assert not out.exists() and digest(folder / "mlflow.db") == mirror
    assert active_runs(folder, "four") == {t.trial_key: 1 for t in grid.parse(GRID).trials}
    rebuilt = cli("store", "rebuild-ledger", "--store", folder)
    assert rebuilt.exit_code == 0 and "1 sweep(s), 4 finished" in rebuilt.output, rebuilt.output
    listed = cli("sweep", "list", "--json", "--store", folder)
    assert json.loads(listed.output)["sweeps"] == [{"sweep": "four", "trials": {"finished": 4}}]
    assert cli("export", "four", "--store", folder, "--out", out).exit_code == 0
    assert len(json.loads(out.read_text())) == 4


def test_out_onto_a_hard_link_of_the_ledger_is_refused(four, cli):
    folder, _ = four
    link = folder.parent / "innocent.json"
    os.link(folder / "ledger.db", link)
    before = digest(folder / "ledger.db")
    for args in (("export", "four"), ("leaderboard", "four", "--format", "csv"), ("report", "four")):
        result = cli(*args, "--store", folder, "--out", link)
        assert result.exit_code == 2 and "is a file of the store itself" in error_line(result), args
    assert digest(folder / "ledger.db") == before
    assert cli("sweep", "list", "--store", folder).exit_code == 0


def test_plot_onto_a_full_disk_is_one_line(four, cli, tmp_path):
    """Issue 31 #24: `plot --out` onto a full disk gave AttributeError: 'Stream' object has no attribute 'pos'."""
    from tests.storage.test_store_faults import tiny_tmpfs

    folder, _ = four
    with tiny_tmpfs(tmp_path / "disk", "1m") as disk:
        with open(disk / "filler", "wb") as fh, contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        for kind, suffix in (("privacy-utility", "pdf"), ("verdicts", "svg")):
            result = cli("plot", "four", "--kind", kind, "--store", folder, "--out", disk / f"fig.{suffix}")
            assert result.exit_code == 2 and "No space left on device" in error_line(result), result.output
