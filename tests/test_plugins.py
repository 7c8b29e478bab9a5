"""Plugins and registries: import-light registries, an installed plugin package (tests/plugins/ext_mech) found
through its entry points, `plugins:` modules, broken plugins. The built-ins' one declaration:
tests/test_builtin_entries.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "plugins" / "ext_mech"
HEAVY = ("torch", "opacus", "transformers", "scipy", "ray", "mlflow")


def run_python(code: str, *paths: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(map(str, (ROOT, *paths)))}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def install(target: Path, source: Path = PLUGIN) -> Path:
    """`pip install --no-deps --target` of a copy (the build writes into the source folder)."""
    copy = target.parent / f"src-{target.name}"
    shutil.copytree(source, copy)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                    "--quiet", "--target", str(target), str(copy)], check=True, capture_output=True, timeout=300)
    return target


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    return install(tmp_path_factory.mktemp("site") / "site")


def test_registries_import_no_torch_opacus_transformers_or_scipy():
    result = run_python("import json, sys\n"
                        "import mechanisms, workers.models as m, workers.datasets as d\n"
                        "from mechanisms.framework.registry import ACCOUNTANTS\n"
                        "names = [mechanisms.names(), m.names(), d.names(), ACCOUNTANTS.names()]\n"
                        "descs = [mechanisms.get(n).description for n in mechanisms.names()]\n"
                        "print(json.dumps([names, descs, sorted({k.split('.')[0] for k in sys.modules})]))")
    assert result.returncode == 0, result.stderr
    names, descs, modules = json.loads(result.stdout)
    assert "dpsgd" in names[0] and "mlp" in names[1] and "digits" in names[2] and "pld" in names[3]
    assert not set(HEAVY) & set(modules), sorted(set(HEAVY) & set(modules))
    assert any(d.endswith("(Bu, Dong, Long, Su, arXiv 1911.11607).") for d in descs)  # the whole first paragraph


@pytest.mark.parametrize("what", ["mechanisms", "datasets", "models", "accountants"])
def test_list_imports_nothing_heavy(what):
    result = run_python("import runpy, sys\n"
                        f"sys.argv = ['privbench', 'list', {what!r}]\n"
                        "try:\n    runpy.run_module('orchestrator', run_name='__main__')\n"
                        "except SystemExit:\n    pass\n"
                        "print(sorted({k.split('.')[0] for k in sys.modules}))")
    assert result.returncode == 0, result.stderr
    assert not {m for m in HEAVY if f"'{m}'" in result.stdout.splitlines()[-1]}, result.stdout[-500:]


def test_an_installed_plugin_is_found_through_its_entry_points(installed):
    result = run_python("import json, mechanisms\n"
                        "from workers import models, datasets\n"
                        "m = mechanisms.get('dpsgd-tightclip')\n"
                        "print(json.dumps([mechanisms.names(), models.names(), datasets.names(), m.private,"
                        " models.get_entry('ext-linear')[0].kinds, datasets.get_loader('ext-blobs')[0].kind]))",
                        installed)
    assert result.returncode == 0, result.stderr
    mechs, models, datasets, private, kinds, kind = json.loads(result.stdout)
    assert "dpsgd-tightclip" in mechs and "dpsgd" in mechs and private is True
    assert "ext-linear" in models and kinds == ["image"] and "ext-blobs" in datasets and kind == "image"


def test_the_grid_validates_plugin_names_like_builtins(installed, tmp_path):
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\ngrid: {dataset: [ext-blobs], model: [ext-linear], mechanism: [dpsgd-tightclip], "
                    "epsilon: [2]}\nmechanism_options: {dpsgd-tightclip: {clip_scale: 2}}\n")
    result = run_python(f"from orchestrator import grid\ntry:\n    grid.load({str(grid)!r})\n"
                        "except grid.GridError as e:\n    print(e)", installed)
    assert result.returncode == 0, result.stderr
    assert "clip_scale must lie in (0, 1]" in result.stdout  # the plugin's own option check, before any run


def test_plugins_key_imports_modules_beside_the_grid(tmp_path):
    shutil.copytree(PLUGIN / "ext_mech", tmp_path / "ext_mech")
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\nplugins: [ext_mech.mechanisms, ext_mech.models, ext_mech.datasets]\n"
                    "grid: {dataset: [ext-blobs], model: [ext-linear], mechanism: [dpsgd-tightclip, nonprivate], "
                    "epsilon: [2]}\n")
    result = run_python(f"import json\nfrom orchestrator import grid\nspec = grid.load({str(grid)!r})\n"
                        "print(json.dumps([list(spec.plugins), [(t.mechanism, t.epsilon, list(t.plugins)) "
                        "for t in spec.trials]]))")
    assert result.returncode == 0, result.stderr
    plugins, trials = json.loads(result.stdout)
    assert plugins == ["ext_mech.mechanisms", "ext_mech.models", "ext_mech.datasets"]
    assert sorted(t[:2] for t in trials) == [["dpsgd-tightclip", 2], ["nonprivate", None]]  # `private` decides


def test_a_bad_plugins_entry_is_a_grid_problem(tmp_path):
    from orchestrator import grid

    for value, message in (("[no_such_module_xyz]", "cannot import 'no_such_module_xyz'"),
                           ("[json]", "defines no mechanism"), ("['1bad']", "not a module name")):
        with pytest.raises(grid.GridError, match=message):
            grid.parse(f"name: g\nplugins: {value}\ngrid: {{dataset: [digits], model: [mlp], "
                       "mechanism: [nonprivate]}\n")


def test_a_broken_entry_point_names_itself_and_hides_nothing(tmp_path):
    broken = tmp_path / "broken_src"
    (broken / "broken_plugin").mkdir(parents=True)
    (broken / "broken_plugin" / "__init__.py").write_text("raise RuntimeError('plugin exploded')\n")
    (broken / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "broken-plugin"\nversion = "0"\n'
        '[project.entry-points."privbench.mechanisms"]\nbroken = "broken_plugin:mechanism"\n'
        '[tool.setuptools]\npackages = ["broken_plugin"]\n')
    site = install(tmp_path / "site", broken)
    result = run_python("import mechanisms\nprint(mechanisms.names())\ntry:\n    mechanisms.get('broken')\n"
                        "except mechanisms.PluginError as e:\n    print(e)", site)
    assert result.returncode == 0, result.stderr
    names, error = result.stdout.splitlines()
    assert "dpsgd" in names and "broken" not in names
    assert "broken = broken_plugin:mechanism" in error and "plugin exploded" in error


def test_notebook_registration_and_contract_checks():
    import mechanisms
    from mechanisms.catalog.dpsgd import DpSgd

    class Mine(DpSgd):
        ID = "mine-test"

    mine = mechanisms.register(Mine())
    try:
        assert mechanisms.get("mine-test") is mine
        with pytest.raises(mechanisms.PluginError, match="registered twice"):
            mechanisms.register(Mine())
    finally:
        mechanisms.unregister("mine-test")
    with pytest.raises(mechanisms.PluginError, match="not a mechanisms.Mechanism"):
        mechanisms.register(object())

    class NoId(mechanisms.Mechanism):
        pass

    with pytest.raises(mechanisms.PluginError, match="NoId has no ID"):
        mechanisms.register(NoId())


def test_the_readme_example_is_the_tested_package():
    """README's "write a package" section shows the example plugin's own entry points and code."""
    import re

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Bring your own mechanism"):text.index("## Documentation")]
    toml_block = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    package = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]["entry-points"]
    assert tomllib.loads(toml_block)["project"]["entry-points"] == package
    source = (PLUGIN / "ext_mech" / "mechanisms.py").read_text()
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    for line in code.splitlines():
        line = line.split("  #")[0].rstrip()
        assert not line.strip() or line in source, f"README shows {line!r}, not in ext_mech/mechanisms.py"


FAILING = {"raises": "raise RuntimeError('plugin exploded at import')\n", "exits": "import sys\nsys.exit(3)\n"}


@pytest.mark.parametrize("kind", sorted(FAILING))
def test_a_plugin_that_fails_at_import_is_one_line_and_exit_2(tmp_path, kind):
    """Issue 31 #22: a raising plugin crashed validation; one calling sys.exit(3) made privbench exit 3
    silently. Importing a plugin runs its code: whatever it does is one grid problem, exit 2."""
    (tmp_path / f"bad_{kind}.py").write_text(FAILING[kind])
    grid = tmp_path / "g.yaml"
    grid.write_text(f"name: g\nplugins: [bad_{kind}]\ngrid: {{dataset: [digits], model: [mlp], "
                    "mechanism: [nonprivate]}\n")
    result = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "run", str(grid), "--dry-run",
                             "--store", str(tmp_path / "store")], env=os.environ | {"PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"plugins: bad_{kind}" in lines[0]
    assert ("plugin exploded at import" if kind == "raises" else "sys.exit(3)") in lines[0]
    assert not (tmp_path / "store").exists()


def test_a_plugin_beside_the_grid_ships_the_modules_it_imports_from_its_folder(tmp_path):
    """Issue 31 #27: `mine.py` importing `helpers.py` beside it validated, then failed in every trial with
    "No module named 'helpers'": the workers got the plugin but not what it imports."""
    shutil.copytree(PLUGIN / "ext_mech", tmp_path / "ext_mech")
    (tmp_path / "helpers.py").write_text("SCALE = 0.5\n")
    (tmp_path / "mine.py").write_text("import helpers\nfrom ext_mech.mechanisms import *  # noqa: F403\n")
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\nplugins: [mine]\ngrid: {dataset: [digits], model: [mlp], "
                    "mechanism: [dpsgd-tightclip], epsilon: [2]}\n")
    result = run_python(f"from orchestrator import grid\nfrom workers.plugins import shipped\n"
                        f"spec = grid.load({str(grid)!r})\nprint(sorted(m.__name__ for m in shipped(spec.plugins)))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['ext_mech', 'helpers', 'mine']"


def test_a_trial_key_names_its_plugin_code(installed, tmp_path):
    """An installed plugin's trials carry its distribution, version and source hash (part of the key);
    privbench's own entries carry none, so the keys of built-in trials are what they were."""
    result = run_python("import json\nfrom orchestrator import grid\n"
                        "spec = grid.parse('name: g\\ngrid: {dataset: [digits], model: [mlp], "
                        "mechanism: [dpsgd-tightclip, dpsgd], epsilon: [2]}\\n')\n"
                        "print(json.dumps({t.mechanism: dict(t.code) for t in spec.trials}))", installed)
    assert result.returncode == 0, result.stderr
    code = json.loads(result.stdout)
    assert code["dpsgd"] == {}
    assert code["dpsgd-tightclip"]["mechanism"].startswith("dpsgd-tightclip: privbench-ext-mech 0.1.0 sha256:")


EDITED_GRID = ("name: ext\nplugins: [ext_mech.mechanisms, ext_mech.models, ext_mech.datasets]\nseeds: [0]\n"
               "grid: {dataset: [ext-blobs], model: [ext-linear], mechanism: [dpsgd-tightclip, nonprivate], "
               "epsilon: [4]}\ntrain: {epochs: 1, batch_size: 50}\naudit: {mode: 'off'}\n"
               "resources: {cpus: 1, gpus: 0}\n")


def test_an_edited_plugin_gives_its_trials_new_keys_and_one_line_says_so(tmp_path):
    """The default suite's check of the slow end-to-end test below, without Ray: editing the plugin beside the
    grid changes the keys of the trials that use it (its code is in them), and against the trials recorded with
    the old code one line names the plugin and the trials that run again. Each side is read by a fresh process,
    as each `sweep run` is."""
    shutil.copytree(PLUGIN / "ext_mech", tmp_path / "ext_mech")
    grid = tmp_path / "grid.yaml"
    grid.write_text(EDITED_GRID)
    program = ("import json, pathlib, sys, types\nfrom orchestrator import runner\n"
               "spec = runner.load_grid(pathlib.Path(sys.argv[1]))\n"
               "old = json.loads(pathlib.Path(sys.argv[2]).read_text()) if len(sys.argv) > 2 else []\n"
               "rows = [types.SimpleNamespace(status='finished', record={'config': c}) for c in old]\n"
               "print(json.dumps({'keys': [t.trial_key for t in spec.trials], 'configs': [t.to_dict() for t in "
               "spec.trials], 'lines': runner.code_changes(rows, spec.trials)}))")

    def read(*args: Path) -> dict:
        done = subprocess.run([sys.executable, "-c", program, *map(str, args)], capture_output=True, text=True,
                              timeout=300, env=os.environ | {"PYTHONPATH": str(ROOT)}, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)

    first = read(grid)
    assert first["lines"] == []
    (tmp_path / "first.json").write_text(json.dumps(first["configs"]))
    source = tmp_path / "ext_mech" / "mechanisms.py"
    source.write_text(source.read_text() + "\n# a comment: any edit is new code\n")
    second = read(grid, tmp_path / "first.json")
    assert not set(first["keys"]) & set(second["keys"])  # both trials use the plugin's dataset and model
    (line,) = second["lines"]
    assert line.startswith("plugin ext_mech changed") and "2 trials run again" in line, line
    (private,) = [c for c in second["configs"] if c["mechanism"] == "dpsgd-tightclip"]
    assert line.split(" -> ")[1].split(";")[0] in private["code"]["mechanism"]  # the new code, as its key has it


@pytest.mark.slow  # 80 s: two sweeps, each starting Ray with the plugin shipped; the test above checks the keys
def test_an_edited_plugin_reruns_its_trials_and_supersedes_the_old_ones(tmp_path):
    """The researcher edits the plugin beside the grid and reruns: its trials run again (new keys), the old
    records are kept as superseded, one line says why, and a worker checks it runs the code the key names."""
    shutil.copytree(PLUGIN / "ext_mech", tmp_path / "ext_mech")
    grid = tmp_path / "grid.yaml"
    grid.write_text(EDITED_GRID)
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    store = tmp_path / "store"

    def sweep(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "orchestrator", *args, "--store", str(store)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=600)

    first = sweep("sweep", "run", str(grid))
    assert first.returncode == 0, first.stderr[-3000:]
    source = tmp_path / "ext_mech" / "mechanisms.py"
    source.write_text(source.read_text() + "\n# a comment: any edit is new code\n")
    second = sweep("sweep", "run", str(grid))
    assert second.returncode == 0, second.stderr[-3000:]
    lines = [ln for ln in (second.stdout + second.stderr).splitlines() if "plugin ext_mech changed" in ln]
    assert len(lines) == 1 and "2 trials run again" in lines[0], second.stdout + second.stderr
    trials = json.loads(sweep("sweep", "status", "ext", "--json").stdout)["trials"]
    assert sorted(t["status"] for t in trials) == ["finished", "finished", "superseded", "superseded"], trials
    export = tmp_path / "export.json"
    assert sweep("export", "ext", "--out", str(export)).returncode == 0
    (private,) = [r for r in json.loads(export.read_text()) if r["config"]["mechanism"] == "dpsgd-tightclip"]
    assert set(private["config"]["code"]) == {"mechanism", "model", "dataset"}
    assert lines[0].split(" -> ")[1].split(";")[0] in private["config"]["code"]["mechanism"]  # the new code's record
