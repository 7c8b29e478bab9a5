"""The suite runs on every core (pytest-xdist, `-n auto` in pyproject.toml): a serial run kept one of two cores idle.
Tests of one expensive session fixture (the dashboards' store of real sweeps, a PostgreSQL) share a worker
(`--dist loadgroup`, the groups set in tests/conftest.py), so the fixture is made once. With pytest 9.2 xdist
silently groups nothing; this checks that the installed pair does group, in a session of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = '''
import os, pytest

@pytest.fixture(scope="session")
def expensive():
    return os.environ["PYTEST_XDIST_WORKER"]

@pytest.mark.parametrize("i", range(6))
def test_uses_it(expensive, i):
    print("WORKER", expensive)

@pytest.mark.parametrize("i", range(6))
def test_does_not(i):
    pass
'''


def test_tests_of_one_shared_fixture_run_in_one_worker(tmp_path: Path):
    (tmp_path / "test_grouped.py").write_text(TESTS)
    (tmp_path / "conftest.py").write_text(
        (Path(__file__).parent / "conftest.py").read_text().replace('("figure_store", "pg")', '("expensive",)'))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                           "-v", "-s", "-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    grouped = [ln.split()[0] for ln in done.stdout.splitlines() if ln.startswith("[gw") and "test_uses_it" in ln]
    assert len(grouped) == 6
    assert len(set(grouped)) == 1, grouped  # one worker ran every test of the fixture
    assert len({ln.split()[0] for ln in done.stdout.splitlines() if ln.startswith("[gw")}) == 2  # both worked
