"""The documentation stays true to the program: every `privbench` command and option that README.md and
docs/ show exists (its `--help` answers and lists the option), relative links resolve, and nothing in the
repository (code, docs, `--help`) points to documents outside the project."""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Pages other parts of the project write; links to them are checked once they exist.
PAGES_WRITTEN_ELSEWHERE = {"store.md", "clipping.md", "auditing.md"}
OUTSIDE = re.compile(r"research/|shared/(papers|research)|\bthe digest\b|\bdigest('s)? (section )?\d|"
                     r"\b(DESIGN|STYLE)\.md\b|docs/readme/", re.I)
DOC_POINTER = re.compile(r"\bdocs/[A-Za-z0-9_./-]+\.md\b")


def command_lines(text: str) -> list[str]:
    """`privbench ...` invocations: lines of code blocks (with their `[--option]` continuation lines),
    and inline code spans."""
    found: list[str] = []
    in_block = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            stripped = line.strip().removeprefix("$ ")
            if stripped.startswith("privbench "):
                found.append(stripped.split("#")[0])
            elif found and stripped.startswith("[") and line.startswith(" "):
                found[-1] += " " + stripped
        else:
            found += [m for m in re.findall(r"`(privbench [^`]+)`", line)]
    return found


def help_of(path: list[str]):
    from orchestrator.cli import app

    return CliRunner().invoke(app, [*path, "--help"], terminal_width=200)


def root_command() -> Any:
    from orchestrator.cli import app

    return typer.main.get_command(app)


def _is_group(cmd: Any) -> bool:
    """Typer vendors its own click, so groups are recognised by their sub-commands."""
    return hasattr(cmd, "commands")


def resolve(words: list[str]) -> tuple[list[str], Any, list[str]]:
    """Walk sub-commands as far as the words name them; alternatives `a|b` must all exist."""
    cmd: Any = root_command()
    path: list[str] = []
    rest = list(words)
    while rest and _is_group(cmd):
        word = rest[0]
        names = word.split("|")
        if not all(n in cmd.commands for n in names):
            break
        path.append(names[0])
        cmd = cmd.commands[names[0]]
        rest.pop(0)
    return path, cmd, rest


def shown_commands() -> list[tuple[str, str]]:
    return [(doc.relative_to(ROOT).as_posix(), line) for doc in DOCS for line in command_lines(doc.read_text())]


def test_the_docs_show_commands_at_all():
    shown = {line.split()[1] for _, line in shown_commands()}
    assert {"sweep", "leaderboard", "plot", "report", "privacy", "audit", "ui", "list"} <= shown


@pytest.mark.parametrize(("doc", "line"), shown_commands())
def test_every_shown_command_and_option_exists(doc, line):
    words = line.split()[1:]
    path, cmd, rest = resolve(words)
    if _is_group(cmd) and rest and not rest[0].startswith(("-", "[", "...")):
        pytest.fail(f"{doc}: `{line}`: `privbench {' '.join(path)}` has no command {rest[0]!r}")
    result = help_of(path)
    assert result.exit_code == 0, result.output
    known = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
    for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", " ".join(rest)):
        assert option in known, f"{doc}: `privbench {' '.join(path)}` has no option {option}"
        assert option in result.output, f"{doc}: {option} missing from `privbench {' '.join(path)} --help`"


def test_relative_links_resolve():
    missing = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path = (doc.parent / target).resolve()
            if not path.exists() and path.name not in PAGES_WRITTEN_ELSEWHERE:
                missing.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not missing


def test_nothing_points_outside_the_project():
    """Code, docs and examples explain in the project's own words or cite papers by arXiv id."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in files:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ""} or path == Path(__file__):
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        hits += [f"{name}:{i}: {ln.strip()[:100]}" for i, ln in enumerate(text.splitlines(), 1) if OUTSIDE.search(ln)]
    assert not hits, f"{len(hits)} references to documents outside the project:\n" + "\n".join(hits)


def test_pointers_to_docs_name_docs_that_exist():
    """`docs/<page>.md` in code, docs, examples and `--help` names a project page (no stale `docs/readme/...`)."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    missing = []
    for name in files:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt"} or path == Path(__file__):
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        missing += [f"{name}: {m}" for m in DOC_POINTER.findall(text) if not (ROOT / m).is_file()]
    assert not missing, "pointers to missing docs:\n" + "\n".join(missing)


def test_help_texts_point_nowhere_outside():
    texts = {}

    def walk(cmd: Any, path: list[str]) -> None:
        texts[" ".join(path)] = help_of(path).output
        if _is_group(cmd):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])

    walk(root_command(), [])
    assert len(texts) > 10
    assert not [p for p, text in texts.items() if OUTSIDE.search(text)]
    assert not [p for p, text in texts.items() if any(not (ROOT / m).is_file() for m in DOC_POINTER.findall(text))]


def test_readme_is_a_front_page_starting_with_the_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    assert text.startswith("# privbench\n\n```bash\n")
    assert first_block == ("bash scripts/setup.sh && privbench sweep run examples/quickstart.yaml && privbench "
                           "leaderboard quickstart\nbash scripts/setup.sh && python3 -m pytest\n")
    assert len(text.splitlines()) < 250


RESULT_BLOCK = re.compile(r"<!-- results: ([\w-]+) -->\n(.*?)<!-- /results -->", re.S)


def test_result_tables_are_what_the_commands_print():
    """Result tables are written by scripts/results.py from a run and `leaderboard --format markdown`:
    each block names the commands that made it, and its columns are the ones the leaderboard prints
    today (a table pasted by hand, or left from older columns, fails here). Columns the schema shows only
    when some row has them (the phase seconds, newer than some runs) may or may not be there."""
    import yaml

    from dashboards.render import render
    from storage import schema

    header = render([], "markdown", columns="all").splitlines()[0]
    sparse = {f.header for f in schema.FIELDS if f.sparse}

    def dense(line: str) -> str:
        return "|" + "|".join(c for c in line.strip("|").split("|") if c.strip() not in sparse) + "|"

    blocks = [(doc.name, *m.groups()) for doc in DOCS for m in RESULT_BLOCK.finditer(doc.read_text())]
    assert {name for _, name, _ in blocks} >= {"quickstart", "gdp", "gredp", "shuffled_dpsgd", "dp_forward", "text"}
    for doc, name, body in blocks:
        sweep = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())["name"]
        assert f"`privbench sweep run examples/{name}.yaml` (" in body, f"{doc}: block {name} was not generated"
        assert re.search(rf"`privbench leaderboard {re.escape(sweep)} --format markdown( --columns all)?`", body), (
            f"{doc}: block {name}")
        lines = body.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("|"))
        # the leaderboard's table (a tuned grid's block adds its `--view tuned` table after it)
        table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
        assert dense(table[0]) == header, f"{doc}: block {name} has other columns than the leaderboard prints"
        assert len(table) > 2 and all(line.count(" | ") == table[0].count(" | ") for line in table[2:])
    outside = RESULT_BLOCK.sub("", "\n".join(doc.read_text() for doc in DOCS))
    assert header not in outside, "a leaderboard table outside the generated blocks"


def test_results_script_writes_no_wall_time_for_a_resume_that_ran_nothing():
    """A rerun on a store that already holds the sweep ran nothing: its seconds are not the sweep's run
    time. The block keeps the time it had; with none, there is nothing true to write."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_script", ROOT / "scripts" / "results.py")
    results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results)
    kept = "13 min 03 s wall on 2 CPU cores; a rerun on a store that already holds the sweep only resumes"
    assert results.timing(0, 6, 37.0, kept, "here") == kept
    with pytest.raises(SystemExit, match="nothing ran"):
        results.timing(0, 6, 37.0, None, "here")
    assert results.timing(6, 6, 188.0, kept, "here").startswith("3 min 08 s wall on here;")
    assert "for 2 of 6 trials" in results.timing(2, 6, 60.0, kept, "here")
    assert results.previous_timing("quickstart").startswith(tuple(f"{m} min" for m in range(100)))


def test_the_plugin_docs_show_the_hooks_table_rendered_from_the_code():
    """docs/plugins.md's hooks table, and the final methods under it, are exactly `hooks_table()`: the rendering of
    the `@hook` marks and `typing.final` methods (`mechanisms.framework.mechanism`)."""
    from mechanisms.framework.mechanism import hooks_table

    text = (ROOT / "docs" / "plugins.md").read_text()
    table = hooks_table()
    assert table in text, "docs/plugins.md's hooks table differs from hooks_table(): paste its output there"
    assert text.count("| hook | used by | guarantee it must keep |") == 1
