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
