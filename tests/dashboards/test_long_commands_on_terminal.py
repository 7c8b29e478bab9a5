"""Every long command on a real pseudo-terminal (issue 41, item 1): `report`, `plot`, `export` and the store
rebuilds draw what they draw to a terminal, which piped runs never exercise (`sweep run` hung only there).
Each ends with exit 0 and its one `wrote`/`rebuilt` line, and the store reads the same afterwards."""

from __future__ import annotations

import shutil

import pytest

from tests.orchestrator.test_sweep_on_terminal import finish, spawn


@pytest.mark.parametrize("width", [80])
def test_long_commands_end_on_a_terminal(figure_store, tmp_path, width):
    store = tmp_path / "store"
    shutil.copytree(figure_store, store)

    def run(*args: str) -> str:
        code, text = finish(spawn(width, *args, "--store", str(store)))
        assert code == 0, (args, text[-3000:])
        assert "Traceback" not in text and "error:" not in text, (args, text[-3000:])
        return text

    _, before = finish(spawn(width, "leaderboard", "figs", "--store", str(store), "--format", "csv"))
    for args, name in ((["report", "figs"], "r.html"), (["plot", "figs"], "f.pdf"),
                       (["export", "figs", "--format", "csv"], "e.csv")):
        text = run(*args, "--out", str(tmp_path / name))
        assert f"wrote {tmp_path / name}" in text.replace("\n", "")
        assert (tmp_path / name).stat().st_size > 100
    (store / "mlflow.db").rename(tmp_path / "lost-mlflow.db")  # a lost mirror: rebuilt from the ledger
    run("store", "rebuild-mirror")
    moved = tmp_path / "lost-ledger"
    moved.mkdir()
    for f in store.glob("ledger.db*"):  # a lost ledger: rebuilt from the mirror
        shutil.move(f, moved / f.name)
    run("store", "rebuild-ledger")
    _, after = finish(spawn(width, "leaderboard", "figs", "--store", str(store), "--format", "csv"))
    assert after == before
