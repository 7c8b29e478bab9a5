"""A grid's `tune:` block: bad blocks exit 2 before anything is written, and each cell expands into its
drawn candidates, the same on every parse (a resumed sweep keeps its draws)."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from mechanisms.accounting.tuning_cost import candidate_seed
from orchestrator import grid
from workers.config import TrialConfig
from workers.tuning_candidates import TuningSetting

TUNED = {
    "name": "tuned", "seeds": [0, 1], "delta": 1e-5,
    "grid": {"dataset": ["digits"], "model": ["mlp"], "mechanism": ["dpsgd", "dpsgd-gdp"], "epsilon": [1, 4]},
    "dataset_options": {"digits": {"val_fraction": 0.1}},
    "train": {"epochs": 1, "batch_size": 64, "lr": 0.5},
    "audit": {"mode": "off"},
    "tune": {"space": {"lr": {"log": [0.1, 2.0]}, "clip": [0.5, 1.0]},
             "runs": {"distribution": "geometric", "mean": 3}, "budget": "total"},
}


def parse(overrides: dict | None = None, tune: dict | None = None) -> grid.GridSpec:
    raw = TUNED | (overrides or {})
    if tune is not None:
        raw = raw | {"tune": TUNED["tune"] | tune}
    return grid.parse(yaml.safe_dump(raw))


def test_each_cell_becomes_its_drawn_candidates():
    spec = parse()
    untuned = grid.parse(yaml.safe_dump({k: v for k, v in TUNED.items() if k != "tune"}))
    cells = {t.trial_key: t for t in untuned.trials}
    from workers.tuning_candidates import spec_from_dict

    tune = spec_from_dict(spec.trials[0].tuning["spec"])
    expected = sum(len(tune.draw(c.seed)) for c in cells.values())
    assert len(spec.trials) == expected > len(cells)
    for trial in spec.trials:
        setting = TuningSetting.from_dict(trial.tuning)
        cell = cells[setting.cell]
        drawn = tune.draw(cell.seed)[setting.candidate].as_dict()
        assert setting.params == drawn and setting.runs == len(tune.draw(cell.seed))
        assert trial.train.lr == drawn["lr"] and trial.train.clip == drawn["clip"]
        assert trial.train.epochs == cell.train.epochs and trial.train.batch_size == cell.train.batch_size
        assert trial.seed == candidate_seed(cell.seed, setting.candidate) != cell.seed
        assert (trial.mechanism, trial.epsilon) == (cell.mechanism, cell.epsilon)
    assert len({t.trial_key for t in spec.trials}) == len(spec.trials)


def test_a_resumed_sweep_expands_to_the_same_trials():
    first, second = parse(), parse()
    assert [t.trial_key for t in first.trials] == [t.trial_key for t in second.trials]
    assert [t.tuning for t in first.trials] == [t.tuning for t in second.trials]
    stored = [TrialConfig.from_dict(t.to_dict()) for t in first.trials]  # as the ledger reads it back
    assert [t.trial_key for t in stored] == [t.trial_key for t in first.trials]


def test_an_untuned_trial_keeps_its_key():
    """`tuning` is only part of a candidate's key: the stores of untuned grids stay valid."""
    trial = grid.parse(yaml.safe_dump({k: v for k, v in TUNED.items() if k != "tune"})).trials[0]
    assert "tuning" not in trial.to_dict()
    assert dataclasses.replace(trial, tuning={"x": 1}).trial_key != trial.trial_key


def test_candidates_share_a_plan_only_with_their_cell_spec():
    spec = parse()
    trial = spec.trials[0]
    plain = dataclasses.replace(trial, tuning={})
    assert plain.plan_key != trial.plan_key
    other = next(t for t in spec.trials[1:] if (t.train.clip, t.mechanism, t.epsilon)
                 == (trial.train.clip, trial.mechanism, trial.epsilon))
    assert other.plan_key == trial.plan_key  # lr and the seed do not change the plan


@pytest.mark.parametrize("tune, fragment", [
    ({"runs": {"distribution": "poisson", "mean": -2}}, "tune.runs.mean: must be >= 1"),
    ({"runs": {"distribution": "uniform", "mean": 8}}, "tune.runs.distribution: unknown 'uniform'"),
    ({"select": "test_accuracy"}, "tune.select: 'test_accuracy' is a test-set metric"),
    ({"space": {}}, "tune.space: empty"),
    ({"space": {"mu_rounding": [1, 2]}}, "tune.space.mu_rounding: mechanisms dpsgd, dpsgd-gdp do not take"),
    ({"space": {"batch_size": {"log": [16.0, 4096.0]}}}, "distinct privacy settings (at most 512)"),
    ({"val_noise": 5}, "tune.val_noise: sweeps do not noise the validation score yet"),
])
def test_bad_blocks_are_grid_errors(tune, fragment):
    with pytest.raises(grid.GridError) as e:
        parse(tune=tune)
    assert any(fragment in p for p in e.value.problems), e.value.problems


def test_a_tuned_dataset_needs_a_validation_split():
    with pytest.raises(grid.GridError) as e:
        parse({"dataset_options": {}})
    assert any("dataset 'digits' has no validation split" in p for p in e.value.problems)


def test_tuning_needs_target_epsilons():
    with pytest.raises(grid.GridError) as e:
        parse({"grid": TUNED["grid"] | {"epsilon": []}, "sigma": 1.0})
    assert any("tune: needs grid.epsilon targets" in p for p in e.value.problems)


@pytest.mark.parametrize("tune", [{"runs": {"distribution": "poisson", "mean": -2}}, {"select": "test"},
                                  {"space": {}}, {"space": {"noise_scale": [1, 2]}},
                                  {"runs": {"distribution": "zipf", "mean": 8}}])
def test_bad_block_exits_2_before_anything_is_written(cli, tmp_path, tune):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(TUNED | {"tune": TUNED["tune"] | tune}))
    store = tmp_path / "store"
    result = cli("sweep", "run", path, "--store", store)
    assert result.exit_code == 2
    assert "error:" in result.output and "tune" in result.output
    assert not store.exists()
