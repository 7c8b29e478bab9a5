"""privbench's built-in mechanisms, accountants, models and datasets are declared once: in their registries.

A Ray worker that receives privbench as shipped folders has no package metadata, so the registries must hold
the built-ins; pyproject.toml therefore declares no `privbench.*` entry point (a second list to keep equal),
and installed entry points into privbench's own packages (an older install's metadata may still list them)
are not read.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

from mechanisms.framework.registry import ACCOUNTANTS, GROUP_PREFIX, MECHANISMS, Registry
from workers.datasets.contract import DATASETS
from workers.models.contract import MODELS

ROOT = Path(__file__).resolve().parents[1]
REGISTRIES = (MECHANISMS, ACCOUNTANTS, MODELS, DATASETS)


def test_pyproject_declares_no_builtin_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = [g for g in project.get("entry-points", {}) if g.startswith(GROUP_PREFIX)]
    assert groups == [], f"built-ins are declared in their registries, not in pyproject.toml: {groups}"


def test_each_builtin_is_the_object_its_table_names():
    """The table's key is the name the object declares, and every built-in loads (none is broken)."""
    for registry in REGISTRIES:
        assert registry.builtins, registry.kind
        for name in registry.builtins:
            assert registry.name_of(registry.get(name)) == name, (registry.kind, name)
        assert not set(registry.builtins) & set(registry.broken()), registry.broken()


def _distribution(site: Path, name: str, group: str, entries: dict[str, str]) -> None:
    info = site / f"{name}-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))


def test_privbench_metadata_is_not_read_and_plugins_are(tmp_path, monkeypatch):
    """An installed privbench whose metadata lists an entry the table does not (an older install) is ignored;
    another distribution's entry point (a plugin) is read."""
    group = f"{GROUP_PREFIX}mechanisms"
    _distribution(tmp_path, "privbench", group, {"stale": "mechanisms.catalog.gone:mechanism"})
    _distribution(tmp_path, "a-plugin", group, {"mine": "a_plugin:mechanism"})
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry("mechanism", {"dpsgd": MECHANISMS.builtins["dpsgd"]}, MECHANISMS.name_of)
    points = {p.name: p.value for p in registry.entry_points()}
    assert points["dpsgd"] == MECHANISMS.builtins["dpsgd"] and points["mine"] == "a_plugin:mechanism"
    assert "stale" not in points
