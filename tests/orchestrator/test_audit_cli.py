"""`privbench audit` through typer's CliRunner: JSON shape, verdicts, exit codes."""

import json

import pytest
from typer.testing import CliRunner

import mechanisms
from mechanisms.auditing import tradeoff
from mechanisms.catalog.dpsgd import DpSgd
from orchestrator.cli import app

runner = CliRunner()
RECORD_KEYS = ("mechanism", "sigma", "epsilon_claimed", "epsilon_certified", "epsilon_audited", "mu_audited",
               "mu_claimed", "claim_status", "samples")


def audit(*args: str):
    return runner.invoke(app, ["audit", *args])


class HalfNoise(DpSgd):
    """A mechanism that claims sigma and adds sigma / 2."""

    ID = "half-noise"

    def privatize_step(self, sums, sigma, clip, rng, **options):
        return super().privatize_step(sums, sigma / 2, clip, rng, **options)


class Crashes(DpSgd):
    ID = "crashes"

    def privatize_step(self, *_, **__):
        raise RuntimeError("boom")


@pytest.fixture
def registered():
    """Register mechanisms for one test (a notebook's `mechanisms.register`), and remove them after."""
    added = []

    def add(mechanism):
        added.append(mechanisms.register(mechanism).ID)
        return mechanism

    yield add
    for name in added:
        mechanisms.unregister(name)


@pytest.fixture
def half_noise(registered):
    return registered(HalfNoise())


def test_json_shape_for_dpsgd():
    result = audit("dpsgd", "--sigma", "1.0", "--samples", "4000", "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    for key in RECORD_KEYS:
        assert key in record
    assert record["mechanism"] == "dpsgd" and record["samples"] == 4000 and record["sigma"] == 1.0
    assert record["epsilon_claimed"] == pytest.approx(tradeoff.gaussian_epsilon(1.0, 1e-5), rel=1e-3)
    assert record["mu_claimed"] == pytest.approx(1.0)
    assert 0 < record["epsilon_audited"] < record["epsilon_certified"]
    assert record["claim_status"] == "ok" and record["violated"] is False
    assert "one privatisation step" in record["scope"]


def test_textbook_step_is_ok_at_seeds_0_to_19_with_its_p_value():
    """The documented example at its defaults (20,000 samples/side, dim 1000, significance 0.001): no false
    alarm at any of 20 seeds, and each verdict comes with its p-value (violated iff p <= significance)."""
    for seed in range(20):
        result = audit("dpsgd", "--sigma", "1", "--seed", str(seed), "--json")
        assert result.exit_code == 0, result.stderr
        record = json.loads(result.stdout)
        assert record["samples"] == 20_000 and record["dim"] == 1000 and record["significance"] == 0.001
        assert record["claim_status"] == "ok", (seed, record["p_value"], record["mu_audited"])
        assert 0.001 < record["p_value"] <= 1 and record["violated"] is False


def test_epsilon_picks_sigma_from_the_one_step_claim():
    result = audit("dpsgd", "--epsilon", "4.377", "--samples", "2000", "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["sigma"] == pytest.approx(1.0, rel=0.01)
    assert record["epsilon_claimed"] <= 4.377 and record["epsilon_target"] == 4.377


def test_broken_mechanism_is_reported_violated(half_noise):
    result = audit("half-noise", "--sigma", "1", "--samples", "20000", "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["claim_status"] == "violated" and record["violated"] is True
    assert record["mu_audited"] > record["mu_claimed"]
    assert record["p_value"] < 1e-100


def test_human_output_is_a_table():
    result = audit("dpsgd", "--samples", "2000", "--dim", "100000")
    assert result.exit_code == 0
    assert "claim_status" in result.stdout and "ok" in result.stdout and "dim=100000" in result.stdout
    assert "p_value" in result.stdout and "99.9% lower bound" in result.stdout


@pytest.mark.parametrize("args", [
    ("no-such-mechanism",),
    ("dpsgd", "--sigma", "-1"),
    ("dpsgd", "--sigma", "abc"),
    ("dpsgd", "--samples", "1"),
    ("dpsgd", "--samples", "2.5"),
    ("dpsgd", "--delta", "1.5"),
    ("dpsgd", "--dim", "0"),
    ("dpsgd", "--sigma", "1", "--epsilon", "2"),
    ("dpsgd", "--epsilon", "inf"),
    ("dpsgd", "--path", "sideways"),
    ("dpsgd", "--option", "novalue"),
])
def test_invalid_input_is_one_line_on_stderr_and_exit_2(args):
    result = audit(*args, "--json")
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error")


def test_a_failing_mechanism_exits_1(registered):
    registered(Crashes())
    result = audit("crashes", "--samples", "100", "--json")
    assert result.exit_code == 1 and "boom" in result.stderr


def test_every_registered_mechanism_is_audited_or_refused_cleanly():
    """Exit 0 with a record, or exit 2 naming a missing mechanism option: never a crash (exit 1)."""
    audited = []
    for name in mechanisms.names():
        result = audit(name, "--samples", "500", "--dim", "64", "--json")
        assert result.exit_code in (0, 2), (name, result.stderr)
        if result.exit_code == 2:
            assert result.stderr.strip().startswith("error") and len(result.stderr.strip().splitlines()) == 1
            continue
        record = json.loads(result.stdout)
        assert record["mechanism"] == name
        audited.append(name)
    assert {"dpsgd", "nonprivate"} <= set(audited)
