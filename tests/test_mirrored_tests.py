"""Tests mirror modules, as in dp-accounting: every module `X/Y/z.py` of `mechanisms/` and `orchestrator/` (not
`__init__.py`, not `__main__.py`) has its tests in `tests/X/Y/test_z.py`, so that a module's tests are found
without a search and a module without tests shows.

A new module without its test file fails here. Two mirrored files of the same
name (`tests/mechanisms/test_lazy.py`, `tests/orchestrator/test_lazy.py`) must import as different modules, which
pytest's default import mode gives only to files inside packages (`__init__.py`): checked here too.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIRRORED = ("mechanisms", "orchestrator")


def mirror(module: Path) -> Path:
    """Where the tests of `module` (relative to the project root) belong."""
    return Path("tests") / module.parent / f"test_{module.name}"


def modules() -> list[Path]:
    return sorted(path.relative_to(ROOT) for package in MIRRORED for path in (ROOT / package).rglob("*.py")
                  if path.name not in ("__init__.py", "__main__.py"))


def import_name(test_file: Path) -> str:
    """The module name pytest's default (`prepend`) import mode gives `test_file`: its dotted path from the
    nearest directory above it that is not a package."""
    parts, folder = [test_file.stem], test_file.parent
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts)


def test_every_module_has_its_mirrored_test_file():
    missing = [str(m) for m in modules() if not (ROOT / mirror(m)).is_file()]
    assert not missing, f"modules without their test file at the mirrored path: {', '.join(missing)}"


def test_no_two_test_files_import_as_one_module():
    names = Counter(import_name(path) for path in (ROOT / "tests").rglob("test_*.py"))
    clashes = sorted(name for name, count in names.items() if count > 1)
    assert not clashes, f"test files that pytest would import under one name (add __init__.py): {clashes}"
