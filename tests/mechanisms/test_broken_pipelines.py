"""The broken-pipeline suite: models, datasets and plan-time hooks that leak around the mechanism, each caught,
beside correct pipelines that stay `ok`.

Each broken pipeline is a plugin written as a researcher would write it (tests/plugins/broken_pipelines/): the
mechanism is privbench's own DP-SGD (or a DP-SGD whose plan-time hook reads the data), so every integrity check of
the step passes, and what leaks goes around it: rows that mix in the model or the loss, model state computed from
the training set, several rows per person, a plan value or a claim extra computed from the data. The slow test runs
both grids as real sweeps on Ray through `plugins:` and reads the leaderboard: no broken pipeline may be `ok`, and
the correct ones (privbench's mlp, LayerNorm and GroupNorm models, a per-record transform, declared units and
augmentation multiplicity) are `ok` at the certified epsilon digits' geometry had before the checks existed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

PLUGIN = Path(__file__).parents[1] / "plugins" / "broken_pipelines"
# (dataset, model, mechanism) -> whether the pipeline is correct
CASES = {
    ("digits", "mlp", "dpsgd"): True,
    ("digits", "layernorm-mlp", "dpsgd"): True,
    ("digits", "groupnorm-cnn", "dpsgd"): True,
    ("digits-records", "mlp", "dpsgd"): True,  # records plus a per-record transform
    ("digits-units", "mlp", "dpsgd"): True,  # two rows per writer, declared as one unit
    ("digits", "cnn-small", "dpsgd"): True,  # augmentation multiplicity 4
    ("digits", "bn-mlp", "dpsgd"): False,
    ("digits", "batch-softmax-mlp", "dpsgd"): False,
    ("digits", "mean-centre-mlp", "dpsgd"): False,
    ("digits", "train-stats-mlp", "dpsgd"): False,
    ("digits", "data-init-mlp", "dpsgd"): False,
    ("digits-shifted9", "mlp", "dpsgd"): False,
    ("digits-standardised", "mlp", "dpsgd"): False,
    ("digits-pairs", "mlp", "dpsgd"): False,
    ("digits", "mlp", "median-clip"): False,
    ("digits", "mlp", "claim-extras"): False,
}
# certified epsilon of digits' geometry (1,437 records or units, batch 64, 2 epochs) before the whole-trial checks
# (4899d1d): unchanged
CERTIFIED_BEFORE = 1.998927150159882




@pytest.mark.slow
def test_every_broken_pipeline_is_caught_in_a_sweep_and_the_correct_ones_stay_ok(tmp_path, own_ray):
    from dashboards.leaderboard import rows
    from privbench import Sweep

    board, records = {}, {}
    import ray

    for grid in ("pipelines.yaml", "pipeline_hooks.yaml"):
        ray.shutdown()  # each grid's own local Ray, which ships that grid's `plugins:` (a running one keeps its own)
        sweep = Sweep(PLUGIN / grid, store=tmp_path / "store")
        sweep.run()
        for record in sweep.records():
            config = record["config"]
            records[(config["dataset"], config["model"], config["mechanism"])] = record
        board |= {(row.dataset, row.model, row.mechanism): row for row in rows(sweep.records())}
    assert set(records) == set(CASES), sorted(set(CASES) ^ set(records))
    for case, correct in CASES.items():
        record, row = records[case], board.get(case)
        if correct:
            assert record["status"] == "finished" and row.claim_status == "ok", (case, record.get("error"), row)
            assert row.epsilon_certified == pytest.approx(CERTIFIED_BEFORE, rel=1e-9), case
        else:  # refused (a failed trial, with the reason), or finished and never ok
            status = row.claim_status if record["status"] == "finished" else None
            assert status != "ok", (case, record["privacy"].get("integrity_failed"))
            reason = record.get("error") or row.uncertified_reason or ""
            assert reason, case


CORRECT = [case for case, correct in CASES.items() if correct]


@pytest.mark.slow
@pytest.mark.parametrize("case", CORRECT, ids=["/".join(c) for c in CORRECT])
def test_correct_pipelines_raise_no_alarm_over_20_seeds(case, monkeypatch):
    """The whole-trial checks' false alarms: each correct pipeline trained with 20 seeds (every check on, the
    audits off: they are not these checks), none of them failing a check."""
    import dataclasses
    import warnings

    from orchestrator.grid import parse
    from workers import plugins
    from workers.config import Resources
    from workers.trial import run_trial

    warnings.filterwarnings("ignore")
    monkeypatch.syspath_prepend(str(PLUGIN))
    plugins.load(["pipeline_models", "pipeline_datasets"])
    dataset, model, mechanism = case
    train = "{epochs: 2, batch_size: 64, lr: 0.5" + (", augmult: 4}" if model == "cnn-small" else "}")
    grid = parse(f"""
name: false-alarms
seeds: {list(range(20))}
delta: 1e-5
plugins: [pipeline_models, pipeline_datasets]
grid: {{dataset: [{dataset}], model: [{model}], mechanism: [{mechanism}], epsilon: [2]}}
train: {train}
audit: {{mode: "off"}}
""")
    alarms = []
    for config in grid.trials:
        record = run_trial(dataclasses.replace(config, resources=Resources(cpus=1, gpus=0)))
        assert record["status"] == "finished", record.get("error")
        alarms += record["privacy"]["integrity_failed"]
        assert record["privacy"]["epsilon_certified"] == pytest.approx(CERTIFIED_BEFORE, rel=1e-9)
    assert alarms == []
