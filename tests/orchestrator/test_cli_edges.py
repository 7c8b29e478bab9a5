"""Every argument at its edges (issue 31, items 5, 6, 17, 18, 21, 25 and 27): one line and exit 2, never a
traceback, a silently wrong value, or a process that grows until the kernel kills it."""

from __future__ import annotations

import pytest

from tests.conftest import TINY

BASE = "name: edge\ngrid: {dataset: [digits], model: [mlp], mechanism: [dpsgd], epsilon: [1]}\n"


def one_error(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert "Traceback" not in result.output and len(lines) == 1 and lines[0].startswith("error:"), result.output
    return lines[0]


@pytest.mark.parametrize("text, said", [
    ("audit: {enabled: !!bool yes}", "!!bool 'yes'"),  # item 6: was false
    ("audit: {enabled: !!bool on}", "!!bool 'on'"),
    ("audit: {enabled: !!bool garbage}", "!!bool 'garbage'"),
    ("seeds: [" + "9" * 400 + "]", "integer of 400 digits"),  # item 21: OverflowError
    ("seeds: [0x" + "f" * 400 + "]", "integer of 400 digits"),
    ("seeds: [" + "9" * 5000 + "]", "integer of 5000 digits"),  # ValueError (int max str digits)
    ("train: {epochs: " + "9" * 30 + "}", "larger than a 64-bit integer"),
    ("train: {lr: !!float abc}", "!!float 'abc'"),
    ("seeds: [!!int 1.5]", "!!int '1.5'"),
    ('dataset_options: {digits: {split_seed: "\\uD800"}}', "lone surrogate"),  # item 17
    ("train: {lr: 1e300}", "lr must be at most 1000"),  # item 27: raw arithmetic errors at run time
], ids=lambda v: str(v)[:32])
def test_grid_values_at_their_edges_are_one_line(cli, tmp_path, text, said):
    path = tmp_path / "g.yaml"
    path.write_text(BASE + text + "\n")
    result = cli("sweep", "run", path, "--store", tmp_path / "store", "--dry-run")
    assert result.exit_code == 2 and said in one_error(result)
    assert not (tmp_path / "store").exists()


def test_a_lone_surrogate_in_a_dataset_name_is_one_line_before_the_store_is_made(cli, tmp_path):
    """Item 17: a dataset name `"hf:\\uD800"` (any `hf:` name passes validation) gave a traceback after the
    sweep's experiment was created."""
    path = tmp_path / "g.yaml"
    path.write_text('name: edge\ngrid: {dataset: ["hf:\\uD800"], model: [bert-tiny], mechanism: [dpsgd], '
                    'epsilon: [1]}\n')
    result = cli("sweep", "run", path, "--store", tmp_path / "store")
    assert result.exit_code == 2 and "lone surrogate" in one_error(result)
    assert not (tmp_path / "store").exists()


def test_a_tiny_sigma_is_refused_in_the_grid(cli, tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("name: edge\nsigma: 1e-300\ngrid: {dataset: [digits], model: [mlp], mechanism: [dpsgd]}\n")
    result = cli("sweep", "run", path, "--dry-run")
    assert result.exit_code == 2 and "sigma must be >= 0.001" in one_error(result)


def test_a_large_flat_grid_is_not_blamed_on_aliases(cli, tmp_path):
    """Item 27: a 1 MB flat file was refused with the hint "nested aliases?"."""
    path = tmp_path / "g.yaml"
    path.write_text(BASE + "seeds: [" + ", ".join(map(str, range(120_000))) + "]\n")
    line = one_error(cli("sweep", "run", path, "--dry-run"))
    assert "more than 100,000 values" in line and "aliases" not in line
    path.write_text("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                    "e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n")
    assert "nested aliases" in one_error(cli("sweep", "run", path, "--dry-run"))


@pytest.mark.parametrize("args, said", [
    (("gredp", "--sigma", "1", "--option", "noize=real"), "unknown option(s) noize"),  # item 5
    (("gredp", "--sigma", "1", "--option", "[/x]=1"), "unknown option(s) [/x]"),
    (("gredp", "--sigma", "1", "--option", "noise=imaginary"), "noise"),
    (("gredp", "--samples", "100000000000"), "--samples must be at most 100000000"),  # item 18: grew to 22 GB
    (("gredp", "--samples", "9" * 400), "--samples must be at most 100000000"),
    (("gredp", "--seed", "9" * 30), "--seed must be at most 4294967295"),
    (("gredp", "--sigma", "1e-300"), "--sigma must be at least 0.001"),
], ids=lambda v: " ".join(map(str, v))[:40] if isinstance(v, tuple) else None)
def test_audit_arguments_at_their_edges(cli, args, said):
    result = cli("audit", *args)
    assert result.exit_code == 2 and said in one_error(result)


EPS = ("privacy", "epsilon", "--sample-rate", "0.01", "--delta", "1e-5")


@pytest.mark.parametrize("args, said", [
    ((*EPS, "--sigma", "1e-300", "--steps", "100"), "--sigma must be at least 0.001"),  # item 25: ZeroDivisionError
    ((*EPS, "--sigma", "1", "--steps", "100000000000"), "at most 100,000,000"),  # ArrayMemoryError
    ((*EPS, "--sigma", "1", "--steps", "9" * 5000), "out of range"),
    (("privacy", "epsilon", "--sigma", "1", "--dataset-size", "1000000000", "--batch-size", "1", "--epochs", "1000",
      "--delta", "1e-5"), "at most 100,000,000"),
    (("privacy", "agm", "--epsilon", "1e-300", "--delta", "1e-5"), "out of the range"),
], ids=lambda v: " ".join(map(str, v))[:60] if isinstance(v, tuple) else None)
def test_privacy_arguments_at_their_edges(cli, args, said):
    result = cli(*args)
    assert result.exit_code == 2 and said in one_error(result)


def test_an_empty_owner_list_is_not_printed(cli, monkeypatch, write_grid, store):
    """Item 27: "2 trial(s) are being run by another driver ()"."""
    from orchestrator import runner

    summary = runner.SweepSummary(sweep="s", store="x", trials=2, finished_before=0, started=2, counts={},
                                  not_run=2, running_elsewhere=True, leased_by=())
    monkeypatch.setattr(runner, "run", lambda *a, **k: summary)
    result = cli("sweep", "run", write_grid(TINY), "--store", store)
    assert result.exit_code == 0 and "another driver, which records them" in result.output and "()" not in result.output
