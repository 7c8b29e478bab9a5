"""`privbench list mechanisms` and `privbench audit` see a plugin module named with --plugins, as a grid's
`plugins:` key loads it; a module that cannot be loaded is one line and exit 2."""

from __future__ import annotations

from pathlib import Path

PLUGINS = Path(__file__).parents[1] / "plugins" / "broken_mechs"


def test_list_mechanisms_shows_a_plugin_module(cli, monkeypatch):
    monkeypatch.chdir(PLUGINS)  # found beside the working folder, as beside a grid file
    result = cli("list", "mechanisms", "--plugins", "docs_adaclip")
    assert result.exit_code == 0, result.output
    assert "docs-adaclip" in result.output and "update_state" in result.output


def test_audit_a_plugin_mechanism(cli, monkeypatch):
    monkeypatch.chdir(PLUGINS)
    result = cli("audit", "docs-adaclip", "--plugins", "docs_adaclip", "--samples", "2000", "--dim", "20", "--json")
    assert result.exit_code == 0, result.output
    assert '"mechanism": "docs-adaclip"' in result.output


def test_an_unknown_plugin_module_is_one_line(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("list", "mechanisms", "--plugins", "no_such_plugin_module")
    assert result.exit_code == 2
    assert "no_such_plugin_module" in result.output and len(result.output.strip().splitlines()) == 1
