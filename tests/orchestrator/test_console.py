"""Every print of user text is escaped once, at the edge (issue 31, items 15 and 20): rich markup in a sweep
name, a path, a store URI, an option or a plugin id is printed as typed, never read as markup (no
`MarkupError`, no `[bold]` eaten), and escape sequences reach the terminal as `\\x1b`, not as commands."""

from __future__ import annotations

import pytest

from tests.orchestrator.test_store_cli import four  # noqa: F401 - a fixture: a store with one finished sweep

HOSTILE = ["[/bold]", "exp[old]y", "a[/x]b", "\x1b]0;pwned\x07", "\u202eevil", "[red]\x1b[31m"]


def commands(s: str, store, grid_file, tmp):
    """One invocation per command and argument kind, each carrying the hostile text `s`."""
    missing = tmp / f"st{s}"
    return [
        ("leaderboard", s, "--store", store), ("sweep", "status", s, "--store", store),
        ("export", s, "--store", store, "--out", tmp / "x.json"),
        ("report", s, "--store", store, "--out", tmp / "r.html"),
        ("plot", s, "--store", store, "--out", tmp / "f.pdf"), ("leaderboard", "--store", missing),
        ("sweep", "list", "--store", missing), ("store", "check", "--store", missing), ("ui", "--store", missing),
        ("sweep", "run", tmp / f"grid{s}.yaml", "--store", store), ("sweep", "run", grid_file, "--store", missing / "x",
                                                                     "--dry-run"),
        ("audit", s), ("audit", "gredp", "--option", f"{s}=1"), ("audit", "gredp", "--option", f"noise={s}"),
        ("privacy", "epsilon", "--sigma", "1", "--sample-rate", "0.1", "--steps", "1", "--delta", "1e-5",
         "--accountant", s),
        ("list", s), ("leaderboard", "four", "--store", store, "--metric", s),
    ]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_text_is_printed_as_typed_by_every_command(cli, four, tmp_path, hostile):  # noqa: F811
    store, grid_file = four
    for args in commands(hostile, store, grid_file, tmp_path):
        result = cli(*args)
        text = result.output
        assert result.exit_code in (0, 1, 2), (args, text)
        assert "Traceback" not in text and "MarkupError" not in text, (args, text)
        assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text, (args, text)
        if result.exit_code:
            assert repr(hostile)[1:-1] in text, (args, text)  # as typed; control characters as escapes


def test_styled_escapes_values_and_keeps_its_own_markup():
    from orchestrator.console import styled

    line = styled("[bold red]error:[/] {message}", message="[/bold] exp[old]y \x1b[31m")
    assert line.plain == "error: [/bold] exp[old]y \\x1b[31m"
    assert [s.style for s in line.spans] == ["bold red"]
