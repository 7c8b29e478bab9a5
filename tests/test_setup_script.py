"""scripts/setup.sh says what it is doing (issue 41: it printed nothing of its own for 2 1/4 minutes, then
NumPy's "Failed to initialize NumPy" because torch was imported before NumPy was installed), and installs
privbench so that `from privbench import Sweep` works from the clone's parent folder too, where the clone (a
folder named `privbench`) would otherwise shadow the package as an empty namespace package."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "setup.sh"


def commands(text: str) -> list[str]:
    """The script's top-level lines that do something (not comments, blank lines or function bodies)."""
    out, depth = [], 0
    for line in text.splitlines():
        stripped = line.strip()
        if depth == 0 and stripped and not stripped.startswith("#") and not line.startswith((" ", "\t")):
            out.append(stripped)
        depth += line.count("{") - line.count("}") if re.match(r"^\w+\(\) \{", line) or depth else 0
    return out


def test_setup_announces_every_step_and_ends_with_one_line_naming_what_it_installed():
    text = SETUP.read_text()
    steps = re.findall(r'^step "([^"]+)"', text, re.M)
    assert len(steps) == int(re.search(r"^STEPS=(\d+)$", text, re.M)[1]) >= 6
    lines = commands(text)
    first_step = next(i for i, ln in enumerate(lines) if ln.startswith("step "))
    work = [ln for ln in lines[first_step:] if re.search(r"apt_install|pip install|have ", ln)]
    for ln in work:  # every install belongs to an announced step
        before = lines[:lines.index(ln)]
        assert any(b.startswith("step ") for b in before), ln
    assert lines[-1].startswith('echo "setup done: privbench') and "installed now:" in lines[-1]


def test_numpy_is_installed_before_torch_is_first_imported():
    text = SETUP.read_text()
    numpy = text.index('step "NumPy')
    assert numpy < text.index("import torch")
    assert "pip install -q \"numpy" in text[numpy:text.index("import torch")]


def test_privbench_is_installed_so_that_the_clone_folder_cannot_shadow_it():
    """A finder-based editable install (setuptools' default for a flat layout) comes after the path search:
    from the clone's parent, `import privbench` found the clone folder first. `editable_mode=compat` puts the
    repository on sys.path, where the regular package wins over a namespace folder."""
    text = SETUP.read_text()
    assert re.search(r'pip install -q -e "\.\[test,postgres\]" --config-settings editable_mode=compat', text)


def test_from_the_parent_of_a_folder_named_privbench_the_path_install_finds_the_package(tmp_path):
    """What the compat install does (the repository on sys.path, after the working folder), from a folder
    holding a `privbench` folder such as the clone: the package is found, not the folder."""
    (tmp_path / "privbench").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", "from privbench import Sweep; import privbench; "
                           "print(privbench.__file__)"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(ROOT / "privbench" / "__init__.py")


@pytest.mark.slow
def test_an_editable_install_as_setup_makes_it_imports_from_the_clones_parent(tmp_path):
    """A real `pip install -e` with setup.sh's options into a fresh virtual environment (seeing this machine's
    packages, so that nothing is downloaded but the build backend), then `from privbench import Sweep` from a
    folder holding a `privbench` folder. About 20 s."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT),
                           "--config-settings", "editable_mode=compat"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    parent = tmp_path / "parent"
    (parent / "privbench").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "from privbench import Sweep; import privbench; print(privbench.__file__)"
    done = subprocess.run([str(python), "-c", code], cwd=parent, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(ROOT / "privbench" / "__init__.py")
