"""The ledger is the store's truth and MLflow its mirror: every MLflow call of `storage/` goes through
the sink (storage/mlflow_sink.py), and the store module itself does not import MLflow."""

from __future__ import annotations

import ast
from pathlib import Path

STORAGE = Path(__file__).resolve().parents[2] / "storage"


def _module_level_imports(path: Path) -> set[str]:
    """Modules imported by statements at module level (not inside functions: those run when called)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_store_module_does_not_import_mlflow_at_module_level():
    imported = _module_level_imports(STORAGE / "store.py")
    assert not {m for m in imported if m == "mlflow" or m.startswith("mlflow.")}, imported
    assert "storage.mlflow_sink" in imported  # it reaches MLflow through the sink


def test_the_sink_is_the_only_storage_module_that_names_the_mlflow_client():
    naming = sorted(p.name for p in STORAGE.rglob("*.py") if "MlflowClient" in p.read_text())
    assert naming == ["mlflow_sink.py"]


def test_the_fault_hook_lives_outside_the_production_modules():
    """`fault()` is defined once, in the test-hook module, and only imported elsewhere."""
    defining = sorted(p.name for p in STORAGE.rglob("*.py") if "def fault(" in p.read_text())
    assert defining == ["faults.py"]


def _schema(path: Path) -> tuple[list, list]:
    """Every table's and index's definition (its lines sorted: MLflow's own migrations write a table's
    constraints in an order that varies from run to run), and the alembic revision."""
    with sqlite3_connect(path) as db:
        return ([(kind, name, sorted((sql or "").splitlines()))
                 for kind, name, sql in db.execute("select type, name, sql from sqlite_master order by name")],
                db.execute("select version_num from alembic_version").fetchall())


def test_a_new_store_copies_the_schema_mlflow_would_migrate_to(tmp_path, monkeypatch):
    """A new store's mlflow.db is a copy of the per-version template (no migrations): its tables, indexes and
    alembic revision are those MLflow makes by migrating a new file itself, and it holds MLflow's default
    experiment only (made at the first open, the template has none). Where the data folder cannot be written,
    the store is made by the migrations, as before."""
    from mlflow.tracking import MlflowClient

    from storage.mlflow_sink import MlflowSink, schema_template

    reference = tmp_path / "reference.db"
    MlflowClient(tracking_uri=f"sqlite:///{reference}").search_experiments()  # MLflow's own migrations
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    template = schema_template()
    assert template is not None and template.is_relative_to(tmp_path / "data")
    with sqlite3_connect(template) as db:
        assert db.execute("select count(*) from experiments").fetchone() == (0,)
    (tmp_path / "in-the-way").write_text("a file where the data folder's parent would be")
    for data, name in ((tmp_path / "data", "copied"), (tmp_path / "in-the-way" / "data", "migrated")):
        monkeypatch.setenv("XDG_DATA_HOME", str(data))
        folder = tmp_path / name
        folder.mkdir()
        MlflowSink(f"sqlite:///{folder / 'mlflow.db'}", str(folder), writer=True).create_file(folder / "mlflow.db")
        assert _schema(folder / "mlflow.db") == _schema(reference), name
        client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
        assert [e.name for e in client.search_experiments()] == ["Default"], name
    assert schema_template() is None  # the data folder is under a file: nothing kept, nothing raised


def sqlite3_connect(path: Path):
    import contextlib
    import sqlite3

    return contextlib.closing(sqlite3.connect(path))
