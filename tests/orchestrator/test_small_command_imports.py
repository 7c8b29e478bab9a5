"""`privbench privacy ...` and `privbench audit --help` import only what they need (no torch, Ray, MLflow).

How fast that makes them is measured, not asserted (a timed test flakes on a shared machine):
benchmarks/cli_latency.py. The privacy commands need the mechanisms package's accountants, which import
whatever `import mechanisms` itself imports; this checks they add nothing to that beyond dp_accounting and
SciPy, and that `agm` does without dp_accounting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = os.environ | {"PYTHONPATH": str(ROOT)}
PROBE = """
import atexit, json, runpy, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted({m.split(".")[0] for m in sys.modules}))))
if sys.argv[2] == "-c":
    exec(sys.argv[3])
else:
    sys.argv = ["privbench", *sys.argv[2:]]
    runpy.run_module("orchestrator", run_name="__main__")
"""
# Never on these paths: training, orchestration, tracking, plotting, the store.
FORBIDDEN = {"torch", "ray", "mlflow", "opacus", "workers", "matplotlib", "sklearn", "transformers", "pandas",
             "sqlalchemy", "alembic", "storage", "dashboards"}
PRIVACY = [
    ("epsilon", "--sigma", "1", "--sample-rate", "0.01", "--steps", "100", "--delta", "1e-5"),
    ("sigma", "--epsilon", "2", "--sample-rate", "0.01", "--steps", "100", "--delta", "1e-5"),
    ("agm", "--epsilon", "1", "--delta", "1e-5"),
]


def imported(tmp_path: Path, *args: str) -> set[str]:
    out = tmp_path / "modules.json"
    result = subprocess.run([sys.executable, "-c", PROBE, str(out), *args], env=ENV, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return set(json.loads(out.read_text()))


@pytest.fixture(scope="module")
def package_itself(tmp_path_factory) -> set[str]:
    """What `import mechanisms` pulls in on its own (its registry's business, not the CLI's)."""
    return imported(tmp_path_factory.mktemp("pkg"), "-c", "import mechanisms")


@pytest.mark.parametrize("args", PRIVACY, ids=[a[0] for a in PRIVACY])
def test_privacy_commands_import_only_the_accountants(tmp_path, package_itself, args):
    modules = imported(tmp_path, "privacy", *args)
    extra = (modules - package_itself) & FORBIDDEN
    assert extra == set(), f"privacy {args[0]} imports {sorted(extra)}"
    if "torch" not in package_itself:  # once the mechanisms package is torch-free, so is this command
        assert not modules & FORBIDDEN, sorted(modules & FORBIDDEN)
    if args[0] == "agm" and "dp_accounting" not in package_itself:
        assert "dp_accounting" not in modules  # the analytic Gaussian is SciPy only


def test_the_accountants_package_imports_its_parts_on_first_use(tmp_path, package_itself):
    """`mechanisms.accounting` names its API lazily (PEP 562): each name is its submodule's object."""
    modules = imported(tmp_path, "-c", "import mechanisms.accounting.analytic_gaussian")
    if "dp_accounting" not in package_itself:
        assert "dp_accounting" not in modules
    import mechanisms.accounting as accountants
    from mechanisms.accounting import analytic_gaussian, compare, sound

    assert accountants.epsilon is sound.epsilon and accountants.sigma_for is compare.sigma_for
    assert accountants.amgm_sigma is analytic_gaussian.amgm_sigma
    assert set(accountants.__all__) == set(accountants._NAMES) | set(accountants._SUBMODULES)
    assert all(getattr(accountants, name) is not None for name in accountants.__all__)
    with pytest.raises(AttributeError):
        accountants.no_such_name  # noqa: B018


def test_audit_help_imports_nothing_heavy(tmp_path):
    modules = imported(tmp_path, "audit", "--help")
    heavy = modules & (FORBIDDEN | {"mechanisms", "numpy", "scipy", "dp_accounting"})
    assert heavy == set(), f"privbench audit --help imports {sorted(heavy)}"
