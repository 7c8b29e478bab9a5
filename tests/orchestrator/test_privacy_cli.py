"""`privbench privacy epsilon|sigma|agm` through typer's CliRunner: the JSON shapes, agreement with
the API, human tables, and exit code 2 with one line on stderr for bad input."""

import json
import math

import dp_accounting
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import mechanisms
from mechanisms.accounting import calibrate_sigma, epsilon
from mechanisms.parts.plan import PrivacySpec
from orchestrator.cli import app
from tests.events import poisson_event, poisson_events

runner = CliRunner()
MNIST = ["--sample-rate", str(256 / 60000), "--steps", "14063", "--delta", "1e-5"]
SHORT = ["--sample-rate", "0.01", "--steps", "300", "--delta", "1e-5"]


def privacy(*args: str):
    return runner.invoke(app, ["privacy", *args])


def test_epsilon_json_shape_and_value():
    result = privacy("epsilon", "--sigma", "1.1", *MNIST, "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    for key in ("accountant", "epsilon", "delta", "sigma", "sample_rate", "steps", "sampler"):
        assert key in record
    assert record["accountant"] == "pld" and record["sampler"] == "poisson"
    assert record["adjacency"] == "add-or-remove-one"
    assert record["epsilon"] == pytest.approx(2.391, abs=2e-3)
    assert record["epsilon"] == epsilon(poisson_event(1.1, 256 / 60000, 14063), 1e-5)


def test_epsilon_all_has_every_accountant_and_the_claims():
    result = privacy("epsilon", "--sigma", "1.0", *SHORT, "--accountant", "all", "--json",
                     "--dim", "1e6", "--batch-clip-ratio", "16")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    eps = record["epsilons"]
    assert set(eps) == {"pld", "rdp", "prv", "gdp", "ma_classic", "fenton_wilkinson"}
    assert eps["rdp"] >= eps["pld"]
    assert eps["prv"] == pytest.approx(eps["pld"], rel=0.02)
    assert eps["ma_classic"] > eps["rdp"]
    assert record["kinds"]["gdp"].startswith("claimed") and record["kinds"]["pld"].startswith("sound")
    assert record["dim"] == 1e6 and record["batch_clip_ratio"] == 16 and record["delta_split"] == 0.5
    without = json.loads(privacy("epsilon", "--sigma", "1.0", *SHORT, "--accountant", "all", "--json").stdout)
    assert "fenton_wilkinson" not in without["epsilons"]  # needs --dim and c'/c
    assert without["epsilons"]["pld"] == eps["pld"]


def test_fixed_sampler_is_recorded():
    result = privacy("epsilon", "--sigma", "1.0", "--dataset-size", "10000", "--batch-size", "100", "--epochs", "3",
                     "--delta", "1e-5", "--sampler", "fixed", "--accountant", "all", "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["sampler"] == "fixed" and record["adjacency"] == "replace-one"
    assert "ma_classic" not in record["epsilons"]  # a Poisson-only analysis
    assert "fixed-size" in record["notes"]["pld"]
    poisson = json.loads(privacy("epsilon", "--sigma", "1.0", *SHORT, "--json").stdout)
    assert record["epsilons"]["pld"] > poisson["epsilon"]


def test_sigma_json_matches_api_and_never_exceeds_target():
    result = privacy("sigma", "--epsilon", "3", *SHORT, "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["accountant"] == "pld" and record["epsilon"] <= 3.0
    assert record["epsilon"] >= 3.0 * (1 - 1e-3)
    assert record["sigma"] == calibrate_sigma(poisson_events(0.01, 300), 3.0, 1e-5, "pld").sigma
    gdp = json.loads(privacy("sigma", "--epsilon", "3", *SHORT, "--accountant", "gdp", "--json").stdout)
    assert gdp["sigma"] < record["sigma"] and gdp["epsilon"] <= 3.0


def test_sigma_all():
    result = privacy("sigma", "--epsilon", "2", *SHORT, "--accountant", "all", "--json")
    assert result.exit_code == 0, result.stderr
    sigmas = json.loads(result.stdout)["sigmas"]
    assert set(sigmas) == {"pld", "rdp", "prv", "gdp", "ma_classic"}
    assert sigmas["rdp"]["sigma"] > sigmas["pld"]["sigma"]
    assert all(v["epsilon"] <= 2.0 for v in sigmas.values())


@pytest.mark.parametrize("eps, sigma", [("1", 3.7306), ("4", 1.0812), ("8", 0.6002)])
def test_agm_design_vectors(eps, sigma):
    result = privacy("agm", "--epsilon", eps, "--delta", "1e-5", "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert {"sigma", "epsilon", "delta", "sensitivity"} <= set(record)
    assert record["sigma"] == pytest.approx(sigma, abs=1e-4)
    assert record["sensitivity"] == 1.0 and record["epsilon"] == float(eps)
    back = json.loads(privacy("agm", "--sigma", str(record["sigma"]), "--delta", "1e-5", "--json").stdout)
    assert back["epsilon"] == pytest.approx(float(eps), rel=1e-9)


def test_agm_sensitivity_and_releases():
    record = json.loads(privacy("agm", "--epsilon", "8", "--delta", "1e-5", "--sensitivity", "2",
                                "--releases", "3", "--json").stdout)
    assert record["sigma"] == pytest.approx(2.079, abs=1e-3)


def test_human_output_is_a_table():
    result = privacy("epsilon", "--sigma", "1.0", *SHORT, "--accountant", "all")
    assert result.exit_code == 0, result.stderr
    assert "Epsilon by accountant" in result.stdout and "claimed" in result.stdout and "gdp" in result.stdout
    result = privacy("agm", "--epsilon", "1", "--delta", "1e-5")
    assert result.exit_code == 0 and "3.73063" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["epsilon", "--sigma", "0", *SHORT], "sigma must be at least 0.001"),
    (["epsilon", "--sigma", "-1", *SHORT], "sigma must be at least 0.001"),
    (["epsilon", "--sigma", "1", "--sample-rate", "0", "--steps", "10", "--delta", "1e-5"], "sample_rate"),
    (["epsilon", "--sigma", "1", "--sample-rate", "1.5", "--steps", "10", "--delta", "1e-5"], "sample_rate"),
    (["epsilon", "--sigma", "1", "--sample-rate", "0.1", "--steps", "0", "--delta", "1e-5"], "steps"),
    (["epsilon", "--sigma", "1", "--sample-rate", "0.1", "--steps", "10", "--delta", "1"], "delta"),
    (["epsilon", "--sigma", "1", "--sample-rate", "0.1", "--steps", "10", "--delta", "0"], "delta"),
    (["epsilon", "--sigma", "abc", *SHORT], "--sigma must be a number"),
    (["epsilon", "--sigma", "1", "--sample-rate", "0.1", "--steps", "2.5", "--delta", "1e-5"], "--steps"),
    (["epsilon", *SHORT], "--sigma is required"),
    (["epsilon", "--sigma", "1", *SHORT, "--accountant", "moments"], "unknown accountant"),
    (["epsilon", "--sigma", "1", *SHORT, "--accountant", "fenton_wilkinson"], "needs --dim"),
    (["epsilon", "--sigma", "1", *SHORT, "--sampler", "fixed"], "--dataset-size, --batch-size and --epochs"),
    (["epsilon", "--sigma", "1", *SHORT, "--epochs", "2", "--dataset-size", "100", "--batch-size", "10"],
     "not both"),
    (["epsilon", "--sigma", "1", "--epochs", "2", "--dataset-size", "10", "--batch-size", "100", "--delta", "1e-5"],
     "exceeds dataset_size"),
    (["sigma", "--epsilon", "0", *SHORT], "epsilon must be > 0"),
    (["sigma", "--epsilon", "1e-6", "--sample-rate", "1", "--steps", "10000", "--delta", "1e-12"], "no sigma"),
    (["agm", "--epsilon", "1", "--delta", "2"], "delta"),
    (["agm", "--delta", "1e-5"], "exactly one"),
    (["agm", "--epsilon", "1", "--delta", "1e-5", "--sensitivity", "0"], "sensitivity"),
])
def test_bad_input_exits_2_with_one_line(args, message):
    result = privacy(*args)
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def cli_epsilon(sigma: float, *geometry: str) -> float:
    result = privacy("epsilon", "--sigma", repr(sigma), "--delta", "1e-5", *geometry, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["epsilon"]


def plan_epsilon(sigma: float, sampler: str, n: int, b: int, epochs: int) -> float:
    spec = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=n, batch_size=b, epochs=epochs, sigma=sigma,
                       sampler=sampler)
    return mechanisms.get("dpsgd").plan(spec).epsilon_certified


def test_issue_example_shuffle_one_epsilon():
    """N = 1001, B = 400, 2 epochs, sigma 1, shuffling: a trial runs round(N/B) = 3 steps per epoch, each
    record joins one batch per epoch; the CLI and the plan give the same number (once 15.5 and 20.1)."""
    geometry = ["--sampler", "shuffle", "--dataset-size", "1001", "--batch-size", "400", "--epochs", "2"]
    assert cli_epsilon(1.0, *geometry) == plan_epsilon(1.0, "shuffle", 1001, 400, 2)
    assert plan_epsilon(1.0, "shuffle", 1001, 400, 2) == pytest.approx(
        dp_accounting.gaussian_mechanism.get_epsilon_gaussian(0.5 / math.sqrt(2), 1e-5), rel=1e-6)


@settings(max_examples=30, deadline=None)
@given(sampler=st.sampled_from(["poisson", "fixed", "shuffle"]), n=st.integers(2, 60), data=st.data(),
       epochs=st.integers(1, 3), sigma=st.floats(0.5, 4.0))
def test_cli_epsilon_is_the_trial_plans_certified_epsilon(sampler, n, data, epochs, sigma):
    """`privbench privacy epsilon` given N, B, epochs and a sampler equals a trial plan's epsilon_certified
    (the same sampler object and parts); Poisson stated as --sample-rate/--steps agrees too."""
    b = data.draw(st.integers(1, n), label="batch_size")
    expected = plan_epsilon(sigma, sampler, n, b, epochs)
    geometry = ["--sampler", sampler, "--dataset-size", str(n), "--batch-size", str(b), "--epochs", str(epochs)]
    assert cli_epsilon(sigma, *geometry) == expected
    if sampler == "poisson":
        steps = epochs * max(1, round(n / b))
        assert cli_epsilon(sigma, "--sample-rate", repr(b / n), "--steps", str(steps)) == expected
