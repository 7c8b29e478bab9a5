"""Grid parsing: every bad-grid case is refused with a reason before anything runs or is written."""

from __future__ import annotations

import itertools
import json

import pytest
import yaml

from orchestrator import grid
from tests.conftest import TINY
from workers.config import TrainConfig, TrialConfig


def parse(overrides: dict) -> grid.GridSpec:
    return grid.parse(yaml.safe_dump(TINY | overrides))


def test_expansion_nonprivate_ignores_epsilon_and_keys_are_stable():
    spec = parse({"sigma": None, "seeds": [0, 1], "grid": TINY["grid"] | {"epsilon": [1, 8]}})
    by_mech = [t.mechanism for t in spec.trials]
    assert by_mech.count("nonprivate") == 2 and by_mech.count("dpsgd") == 4
    assert all(t.epsilon is None for t in spec.trials if t.mechanism == "nonprivate")
    keys = [t.trial_key for t in spec.trials]
    assert len(set(keys)) == len(keys)
    again = parse({"sigma": None, "seeds": [0, 1], "grid": TINY["grid"] | {"epsilon": [1, 8]}})
    assert keys == [t.trial_key for t in again.trials]
    other = parse({"sigma": None, "seeds": [0, 1], "grid": TINY["grid"] | {"epsilon": [1, 4]}})
    assert set(keys) != {t.trial_key for t in other.trials}


def test_mechanism_train_overrides_only_that_mechanism():
    spec = parse({"mechanism_train": {"nonprivate": {"lr": 0.01}}})
    lrs = {t.mechanism: t.train.lr for t in spec.trials}
    assert lrs == {"nonprivate": 0.01, "dpsgd": 0.5}


def test_model_train_overrides_that_model_and_mechanism_train_wins():
    spec = parse({"grid": TINY["grid"] | {"model": ["mlp", "cnn-small"]},
                  "model_train": {"cnn-small": {"lr": 0.05, "epochs": 3}},
                  "mechanism_train": {"dpsgd": {"lr": 0.2}}})
    got = {(t.model, t.mechanism): (t.train.lr, t.train.epochs) for t in spec.trials}
    assert got == {("mlp", "nonprivate"): (0.5, 1), ("mlp", "dpsgd"): (0.2, 1),
                   ("cnn-small", "nonprivate"): (0.05, 3), ("cnn-small", "dpsgd"): (0.2, 3)}


@pytest.mark.parametrize("overrides, fragment", [
    ({"grid": TINY["grid"] | {"dataset": ["cifar-99"]}}, "unknown dataset 'cifar-99'"),
    ({"grid": TINY["grid"] | {"model": ["resnet-9000"]}}, "unknown model 'resnet-9000'"),
    ({"grid": TINY["grid"] | {"mechanism": ["magic-dp"]}}, "unknown mechanism 'magic-dp'"),
    ({"grid": TINY["grid"] | {"epsilon": [0]}}, "grid.epsilon must be > 0"),
    ({"grid": TINY["grid"] | {"epsilon": [-1]}}, "grid.epsilon must be > 0"),
    ({"delta": 0}, "delta must lie in (0, 1), got 0"),  # require_delta's message: the one range check
    ({"delta": 1.5}, "delta must lie in (0, 1), got 1.5"),
    ({"delta": None}, "delta must be '1/(2N)' or a number, got None"),
    ({"delta": "1/(3N)"}, "delta must be '1/(2N)' or a number, got '1/(3N)'"),
    ({"train": {"epochs": 1, "batch_size": 64, "lr": 0.5, "bogus": 1}}, "train: unknown option(s) bogus"),
    ({"resources": {"cpus": 1, "gpus": "many"}}, "resources: gpus must be"),
    ({"colour": "blue"}, "unknown top-level keys"),
    ({"model_train": {"mlp": {"lr": -1}}}, "model_train.mlp: lr must be > 0"),
    ({"model_train": ["mlp"]}, "model_train: must map a model"),
])
def test_bad_grids_name_the_problem(overrides, fragment):
    with pytest.raises(grid.GridError) as e:
        parse(overrides)
    assert any(fragment in p for p in e.value.problems), e.value.problems


def test_unknown_name_lists_what_exists():
    with pytest.raises(grid.GridError) as e:
        parse({"grid": TINY["grid"] | {"mechanism": ["magic-dp"]}})
    assert "dpsgd" in str(e.value) and "nonprivate" in str(e.value)


STRICT = [  # messages of the one checker: workers/config.py's bounds, mechanisms/framework/options.py's types
    ({"seeds": [0, 0, 1, 1]}, "seeds: duplicated values 0, 1"),
    ({"seeds": [-1]}, "seeds must be >= 0"),
    ({"seeds": [2**32]}, "seeds must be at most 4294967295, got 4294967296"),  # integers as integers (#21)
    ({"seeds": [1.5]}, "seeds must be an integer"),
    ({"seeds": [True]}, "seeds must be a number, got True"),
    ({"grid": TINY["grid"] | {"epsilon": [True]}}, "grid.epsilon must be a number, got True"),
    ({"grid": TINY["grid"] | {"epsilon": [1, 1.0]}}, "grid.epsilon: duplicated values"),
    ({"grid": TINY["grid"] | {"mechanism": ["dpsgd", "dpsgd"]}}, "grid.mechanism: duplicated values 'dpsgd'"),
    ({"grid": TINY["grid"] | {"epsilon": [float("inf")]}}, "grid.epsilon must be finite"),
    ({"train": {"lr": float("inf")}}, "train: option lr must be float, got inf"),
    ({"train": {"lr": float("nan")}}, "train: option lr must be float, got nan"),
    ({"train": {"max_train_examples": -5}}, "train: max_train_examples must be >= 1"),
    ({"train": {"epochs": 1.5}}, "train: option epochs must be int"),
    ({"train": {"epochs": True}}, "train: option epochs must be int"),
    ({"train": {"batch_size": 1e9}}, "train: batch_size must be at most 1000000"),
    ({"train": {"momentum": -0.5}}, "train: momentum must be >= 0"),
    ({"train": {"grad_sample_mode": "turbo"}}, "train: grad_sample_mode must be one of"),
    ({"train": {"precision": "fp8"}}, "train: precision must be one of ['fp32', 'bf16', 'fp16']"),
    ({"resources": {"cpus": 1, "gpu": 1}}, "resources: unknown option(s) gpu"),
    ({"resources": [1]}, "resources: must be a mapping"),
    ({"resources": {"cpus": True}}, "resources: option cpus must be"),
    ({"audit": {"samples": 100, "colour": 1}}, "audit: unknown option(s) colour"),
    ({"audit": {"samples": 2}}, "audit: samples must be >= 4"),  # one bound (the grid said >= 1, the worker >= 4)
    ({"sigma": float("nan")}, "sigma must be finite"),
    ({"delta": True}, "delta must be '1/(2N)' or a number"),
    ({"name": "sweep\n"}, "name:"),
    ({"name": 12}, "name:"),
    ({"mechanism_options": {"magic-dp": {}}}, "mechanism_options: unknown mechanism 'magic-dp'"),
    ({"model_options": {"mlp": [1]}}, "model_options.mlp: must map a model"),
    ({"max_trials": -1}, "max_trials must be >= 0"),
]


@pytest.mark.parametrize("overrides, fragment", STRICT)
def test_strict_input_names_every_problem(overrides, fragment):
    with pytest.raises(grid.GridError) as e:
        parse(overrides)
    assert any(fragment in p for p in e.value.problems), e.value.problems


def test_resources_do_not_change_trial_keys():
    keys = {t.trial_key for t in parse({}).trials}
    assert keys == {t.trial_key for t in parse({"resources": {"cpus": 2, "gpus": 0}}).trials}


def test_integral_floats_are_integers_in_trial_keys():
    assert [t.trial_key for t in parse({"train": TINY["train"] | {"epochs": 1.0}}).trials] == \
        [t.trial_key for t in parse({}).trials]


# ---- typed trials (issue 20) and the grid defects of issue 23 ------------------------------------------
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_trials_are_typed_configs_that_round_trip_through_the_ledger_form():
    import pickle

    from workers.config import AuditConfig

    spec = parse({"seeds": [0, 1], "audit": {"mode": "step", "samples": 100}})
    for t in spec.trials:
        assert isinstance(t, TrialConfig) and isinstance(t.train, TrainConfig) and isinstance(t.audit, AuditConfig)
        assert t.audit.samples == 100 and t.train.precision == "fp32"
        back = TrialConfig.from_dict(t.to_dict())
        assert back == t and back.trial_key == t.trial_key == grid.stored_key(t.to_dict())
        assert pickle.loads(pickle.dumps(t)).trial_key == t.trial_key  # it crosses Ray as this object
    # a setting made in Python (not written in a grid) is never left out of the key
    base = TrialConfig(dataset="digits", model="mlp", mechanism="dpsgd", epsilon=1.0)
    other = TrialConfig(dataset="digits", model="mlp", mechanism="dpsgd", epsilon=1.0, train=TrainConfig(lr=0.2))
    assert base.trial_key != other.trial_key
    assert TrialConfig(dataset="digits", model="mlp", mechanism="dpsgd", epsilon=1).trial_key == base.trial_key


def test_trial_keys_are_canonical():
    """Issue 31 #9: the key is the hash of the typed, normalised config: `lr: 1` is `lr: 1.0`, a default
    written out is the default left out, an option `1.0` is the option `1`."""
    def key(**extra) -> str:
        return parse({"sigma": None, "grid": TINY["grid"] | {"epsilon": [1]}} | extra).trials[-1].trial_key

    train = {"epochs": 1, "batch_size": 64}
    assert key(train=train | {"lr": 1}) == key(train=train | {"lr": 1.0}) != key(train=train)
    assert key(train=train) == key(train=train | {"lr": 0.1, "momentum": 0, "optimizer": "sgd",
                                                   "max_train_examples": None})
    assert key(audit={"samples": 20000}) == key() == key(audit={"mode": "step"}) != key(audit={"samples": 100})
    from workers.config import TrialConfig

    def option(value) -> str:
        return TrialConfig(dataset="digits", model="mlp", mechanism="shuffled-dpsgd", epsilon=1.0,
                           mechanism_options={"batch_clip_ratio": value}).trial_key

    assert option(16) == option(16.0) != option(16.5)
    assert key(sigma=1, grid=TINY["grid"]) == key(sigma=1.0, grid=TINY["grid"])


def test_a_store_keyed_by_an_older_formula_is_renamed_not_run_again(tmp_path):
    """Changing how keys are made must not orphan recorded trials: the ledger re-derives each stored
    config's key (`grid.stored_key`) and renames the row, and its MLflow run's tag, in place."""
    from storage.location import resolve
    from storage.store import Store

    spec = parse({"seeds": [0, 1]})
    old = [t.to_dict() | {"trial_key": f"old{i}"} for i, t in enumerate(spec.trials)]
    st = Store(resolve(tmp_path / "s"), create=True)
    st.open_sweep(spec.name, spec.text, old)
    for cfg in old:
        assert st.claim(spec.name, cfg["trial_key"])
        st.record({"sweep": spec.name, "trial_key": cfg["trial_key"], "status": "finished", "config": cfg,
                   "metrics": {"accuracy": 0.5}})
    st.release(spec.name)
    st.open_sweep(spec.name, spec.text, [t.to_dict() for t in spec.trials], key_of=grid.stored_key)
    assert st.pending(spec.name) == [] and {t.trial_key for t in st.trials(spec.name)} == {
        t.trial_key for t in spec.trials}
    for row in st.trials(spec.name):  # the record and its config carry the new key too (a rerun reads them)
        assert row.record["trial_key"] == row.trial_key == row.record["config"]["trial_key"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 's' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(spec.name).experiment_id])
    assert sorted(r.data.tags["privbench.trial_key"] for r in runs if "privbench.trial_key" in r.data.tags) == sorted(
        t.trial_key for t in spec.trials)


def test_a_failed_row_whose_config_kept_an_older_key_is_retried(tmp_path):
    """A store renamed by an older privbench kept the old key inside the failed row's config: the row's key is the
    one a rerun retries (it was counted as finished and never run again)."""
    import sqlalchemy as sa

    from storage.location import resolve
    from storage.store import Store

    spec = parse({"seeds": [0], "grid": TINY["grid"] | {"mechanism": ["nonprivate"]}})
    (trial,) = spec.trials
    st = Store(resolve(tmp_path / "s"), create=True)
    st.open_sweep(spec.name, spec.text, [trial.to_dict()], key_of=grid.stored_key)
    assert st.claim(spec.name, trial.trial_key)
    st.record({"sweep": spec.name, "trial_key": trial.trial_key, "status": "failed", "config": trial.to_dict(),
               "error": "boom"})
    st.release(spec.name)
    stale = json.dumps(trial.to_dict() | {"trial_key": "0123456789abcdef"})
    with st._ledger.engine.begin() as db:
        db.execute(sa.text("UPDATE privbench_trials SET config_json = :c"), {"c": stale})
    assert [c["trial_key"] for c in st.pending(spec.name)] == [trial.trial_key]


def test_only_selects_by_axes_values_of_one_axis_are_alternatives():
    spec = parse({"sigma": None, "seeds": [0, 1], "grid": TINY["grid"] | {"epsilon": [1, 8]}})
    picked = grid.select(spec, ["seed=1", "mechanism=dpsgd", "epsilon=8.0"])
    assert [(t.mechanism, t.epsilon, t.seed) for t in picked] == [("dpsgd", 8.0, 1)]
    both = grid.select(spec, ["epsilon=1", "epsilon=8", "seed=0"])
    assert [(t.mechanism, t.epsilon) for t in both] == [("dpsgd", 1.0), ("dpsgd", 8.0)]
    with pytest.raises(grid.GridError) as e:
        grid.select(spec, ["seed=0", "mechanism=nonprivate", "epsilon=8"])
    assert e.value.problems == ["--only seed=0 mechanism=nonprivate epsilon=8: no trial of the grid has all of these"]
    with pytest.raises(grid.GridError) as e:
        grid.select(spec, ["lr=1", "model=cnn"])
    assert len(e.value.problems) == 2 and "AXIS one of dataset, model, mechanism, epsilon, seed" in e.value.problems[0]


def test_sigma_with_epsilon_is_refused():
    """Issue 23 #2: both used to run calibrated to epsilon, with `sigma` silently dropped."""
    with pytest.raises(grid.GridError) as e:
        parse({"sigma": 0.5, "grid": TINY["grid"] | {"epsilon": [1, 8]}})
    assert any("sigma and grid.epsilon are exclusive" in p for p in e.value.problems), e.value.problems


def test_sigma_with_epsilon_exits_2_on_the_command_line(cli, write_grid, store):
    result = cli("sweep", "run", write_grid({"sigma": 0.5, "grid": TINY["grid"] | {"epsilon": [1]}}),
                 "--store", store, "--dry-run")
    assert result.exit_code == 2 and "exclusive" in result.output and not store.exists()


def test_a_huge_grid_is_refused_from_its_axes_without_expanding_it():
    """Issue 23 #11: 1,000 epsilons x 1,000 seeds took 18 s and 1.26 GB to parse. It is counted from the axes
    and refused with the count, using little memory (no trial is built)."""
    import tracemalloc

    text = yaml.safe_dump(TINY | {"sigma": None, "seeds": list(range(1000)),
                                  "grid": TINY["grid"] | {"epsilon": [0.5 + i for i in range(1000)]}})
    tracemalloc.start()
    try:
        with pytest.raises(grid.GridError) as e:
            grid.parse(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.problems == [f"grid: 1,001,000 trials is more than the limit of {grid.MAX_TRIALS:,}; raise it "
                                "with `max_trials: 1001000` if you mean it, or shrink the axes"]
    assert peak < 50e6, peak


def test_max_trials_sets_the_limit_both_ways():
    three = {"seeds": [0, 1, 2], "grid": TINY["grid"] | {"mechanism": ["nonprivate"]}}
    with pytest.raises(grid.GridError, match="3 trials is more than the limit of 2"):
        parse(three | {"max_trials": 2})
    assert len(parse(three | {"max_trials": 3}).trials) == 3


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16"])
def test_a_grid_file_that_is_not_utf8_gets_one_line(tmp_path, encoding):
    """Issue 23 #14: a UnicodeDecodeError traceback before."""
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(TINY) + "description: café\n", encoding=encoding)
    with pytest.raises(grid.GridError) as e:
        grid.load(path)
    assert len(e.value.problems) == 1 and "not UTF-8 text" in e.value.problems[0]


def test_a_non_utf8_grid_exits_2_without_a_traceback(cli, tmp_path, store):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(TINY) + "description: café\n", encoding="latin-1")
    result = cli("sweep", "run", path, "--store", store)
    assert result.exit_code == 2 and "not UTF-8" in result.output and "Traceback" not in result.output


def test_an_oversized_grid_file_is_refused_before_yaml_reads_it(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(TINY) + "description: " + "x" * (grid.MAX_GRID_BYTES + 10) + "\n")
    with pytest.raises(grid.GridError, match="at most 1,000,000 bytes"):
        grid.load(path)


@pytest.mark.parametrize("overrides", [
    {"grid": TINY["grid"] | {"mechanism": ["m" * 10_000]}},
    {"grid": TINY["grid"] | {"dataset": ["d" * 10_000]}},
    {"x" * 10_000: 1},
    {"name": "n" * 10_000},
    {"seeds": ["s" * 10_000]},
    {"train": {"optimizer": "o" * 10_000}},
    {"mechanism_options": {"dpsgd": {"k" * 10_000: 1}}},
])
def test_echoes_are_cut(overrides):
    """Issue 23 #21: a 10,000-character name was echoed in a 10 KB error line."""
    with pytest.raises(grid.GridError) as e:
        parse(overrides)
    assert e.value.problems and all(len(p) < 700 for p in e.value.problems), [len(p) for p in e.value.problems]


def test_config_module_imports_no_heavy_library():
    import subprocess
    import sys

    code = ("import sys, workers.config; heavy = [m for m in ('torch', 'ray', 'mlflow') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_names_that_must_agree_do():
    from workers import config, train

    assert tuple(train.OPTIMIZERS) == config.OPTIMIZERS


@pytest.mark.parametrize("example", ["quickstart", "tuning", "gdp"])
def test_validating_a_grid_imports_no_heavy_library(example):
    """Issue 23 #13: `--dry-run` took 7-8 s because validating a grid imported torch (and Ray, MLflow). A grid
    that gives model or dataset options still imports their builders, whose signatures are the schema."""
    import subprocess
    import sys

    code = (f"import sys; from orchestrator import grid; grid.load('examples/{example}.yaml'); "
            "heavy = [m for m in ('torch', 'opacus', 'transformers', 'ray', 'mlflow') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# per-dataset settings and paired axes ------------------------------------------------------------------
def _cross_product(raw: dict) -> list[TrialConfig]:
    """The trials of a grid without `pairs` or `dataset_train`, built directly as the cross product (the
    expansion before paired axes existed), to hold the new expansion to it whatever the key formula is."""
    from workers.config import AuditConfig, Resources

    base = raw.get("train", {})
    out = []
    g = raw["grid"]
    for d, m, mech, seed in itertools.product(g["dataset"], g["model"], g["mechanism"], raw["seeds"]):
        settings = base | raw.get("model_train", {}).get(m, {}) | raw.get("mechanism_train", {}).get(mech, {})
        private = mech != "nonprivate"
        for eps in g.get("epsilon", []) if private and g.get("epsilon") else [None]:
            out.append(TrialConfig(
                sweep=raw["name"], dataset=d, model=m, mechanism=mech, epsilon=eps, seed=seed,
                sigma=raw.get("sigma") if private and eps is None else None, delta=raw["delta"],
                train=TrainConfig(**settings), audit=AuditConfig(), resources=Resources(**raw["resources"])))
    return out


WIDE = {"seeds": [0, 1], "sigma": None,
        "grid": {"dataset": ["digits", "synthetic"], "model": ["mlp", "cnn-small"],
                 "mechanism": ["nonprivate", "dpsgd"], "epsilon": [1, 8]},
        "model_train": {"cnn-small": {"lr": 0.05}}, "mechanism_train": {"dpsgd": {"batch_size": 32}}}


def test_a_grid_without_the_new_keys_expands_to_the_cross_product_as_before():
    raw = TINY | WIDE
    spec = parse(WIDE)
    assert [t.trial_key for t in spec.trials] == [t.trial_key for t in _cross_product(raw)]
    assert len(spec.trials) == 2 * 2 * (1 + 2) * 2
    # an empty per-dataset table and pairs listing the whole product in its order change no key
    pairs = [{"dataset": d, "model": m} for d, m in itertools.product(WIDE["grid"]["dataset"], WIDE["grid"]["model"])]
    paired = parse(WIDE | {"dataset_train": {}, "grid": {"pairs": pairs, "mechanism": ["nonprivate", "dpsgd"],
                                                         "epsilon": [1, 8]}})
    assert [t.trial_key for t in paired.trials] == [t.trial_key for t in spec.trials]


def test_pairs_expand_only_the_listed_pairs():
    spec = parse({"grid": {"pairs": [{"dataset": "digits", "model": "cnn-small"},
                                     {"dataset": "breast-cancer", "model": "mlp"}],
                           "mechanism": ["nonprivate", "dpsgd"]}, "seeds": [0, 1]})
    got = [(t.dataset, t.model, t.mechanism, t.seed) for t in spec.trials]
    assert got == [(d, m, mech, s) for d, m in (("digits", "cnn-small"), ("breast-cancer", "mlp"))
                   for mech in ("nonprivate", "dpsgd") for s in (0, 1)]
    # options are checked against the names the pairs use
    with pytest.raises(grid.GridError, match=r"model_options: 'linear' is not in grid.model"):
        parse({"grid": {"pairs": [{"dataset": "digits", "model": "mlp"}], "mechanism": ["dpsgd"]},
               "model_options": {"linear": {}}})


def test_pairs_count_toward_max_trials_without_expanding():
    pairs = [{"dataset": "synthetic", "model": m} for m in ("mlp", "cnn-small", "linear")]
    with pytest.raises(grid.GridError, match=r"grid: 12 trials is more than the limit of 11"):
        parse({"grid": {"pairs": pairs, "mechanism": ["nonprivate", "dpsgd"]}, "seeds": [0, 1], "max_trials": 11})
    assert len(parse({"grid": {"pairs": pairs, "mechanism": ["nonprivate", "dpsgd"]}, "seeds": [0, 1],
                      "max_trials": 12}).trials) == 12


def test_train_precedence_dataset_then_model_then_pair_then_mechanism():
    """train < dataset_train < model_train < grid.pairs[i].train < mechanism_train, key by key."""
    spec = parse({
        "train": {"epochs": 1, "batch_size": 64, "lr": 0.5, "clip": 1.0, "momentum": 0.0},
        "dataset_train": {"synthetic": {"epochs": 3, "batch_size": 128, "lr": 0.4, "clip": 0.2}},
        "model_train": {"cnn-small": {"lr": 0.3, "batch_size": 256}},
        "mechanism_train": {"dpsgd": {"lr": 0.1}},
        "grid": {"pairs": [{"dataset": "digits", "model": "mlp"},
                           {"dataset": "synthetic", "model": "mlp"},
                           {"dataset": "synthetic", "model": "cnn-small", "train": {"batch_size": 512, "clip": 0.1,
                                                                                   "lr": 0.2}}],
                 "mechanism": ["nonprivate", "dpsgd"]}})
    got = {(t.dataset, t.model, t.mechanism): (t.train.epochs, t.train.batch_size, t.train.lr, t.train.clip)
           for t in spec.trials}
    assert got == {
        ("digits", "mlp", "nonprivate"): (1, 64, 0.5, 1.0), ("digits", "mlp", "dpsgd"): (1, 64, 0.1, 1.0),
        ("synthetic", "mlp", "nonprivate"): (3, 128, 0.4, 0.2), ("synthetic", "mlp", "dpsgd"): (3, 128, 0.1, 0.2),
        ("synthetic", "cnn-small", "nonprivate"): (3, 512, 0.2, 0.1),
        ("synthetic", "cnn-small", "dpsgd"): (3, 512, 0.1, 0.1)}
    # a setting made by any table enters the trial key, unless it is the default (issue 31 #9: canonical keys)
    keyed = {(t.dataset, t.model): t._key_view()["train"] for t in spec.trials if t.mechanism == "nonprivate"}
    assert keyed["synthetic", "mlp"]["clip"] == 0.2 and keyed["synthetic", "mlp"]["epochs"] == 3
    assert "clip" not in keyed["digits", "mlp"] and keyed["digits", "mlp"]["lr"] == 0.5  # clip 1.0 is the default


def test_dataset_train_changes_only_that_datasets_trials_and_their_keys():
    plain = parse({"grid": TINY["grid"] | {"dataset": ["digits", "synthetic"]}})
    tuned = parse({"grid": TINY["grid"] | {"dataset": ["digits", "synthetic"]},
                   "dataset_train": {"synthetic": {"epochs": 2}}})
    for a, b in zip(plain.trials, tuned.trials, strict=True):
        assert (a.trial_key == b.trial_key) == (a.dataset == "digits")
        assert b.train.epochs == (2 if b.dataset == "synthetic" else 1)


def test_tabular_data_goes_only_to_models_that_take_it():
    spec = parse({"grid": TINY["grid"] | {"dataset": ["breast-cancer"], "model": ["mlp", "linear"]}})
    assert {t.model for t in spec.trials} == {"mlp", "linear"}
    with pytest.raises(grid.GridError) as e:
        parse({"grid": TINY["grid"] | {"dataset": ["breast-cancer"], "model": ["cnn-tanh", "bert-tiny"]}})
    assert e.value.problems == ["grid: model 'cnn-tanh' does not take tabular data (dataset 'breast-cancer')",
                                "grid: model 'bert-tiny' does not take tabular data (dataset 'breast-cancer')"]
    with pytest.raises(grid.GridError, match=r"model 'scatternet-linear' does not take tabular data"):
        parse({"grid": {"pairs": [{"dataset": "digits", "model": "scatternet-linear"},
                                  {"dataset": "breast-cancer", "model": "scatternet-linear"}],
                        "mechanism": ["dpsgd"]}})


def test_augmult_goes_only_to_image_data():
    spec = parse({"train": TINY["train"] | {"augmult": 4}})
    assert {t.train.augmult for t in spec.trials} == {4}
    with pytest.raises(grid.GridError) as e:
        parse({"grid": TINY["grid"] | {"dataset": ["breast-cancer"], "model": ["linear"]},
               "train": TINY["train"] | {"augmult": 4}})
    assert e.value.problems[0] == ("train of linear on breast-cancer: augmult crops and flips images, dataset "
                                   "'breast-cancer' is tabular")


PAIR = {"dataset": "digits", "model": "mlp"}


@pytest.mark.parametrize("overrides, fragment", [
    ({"grid": TINY["grid"] | {"pairs": [PAIR]}}, "grid.pairs replaces grid.dataset and grid.model"),
    ({"grid": {"pairs": [], "mechanism": ["dpsgd"]}}, "grid.pairs: must be a non-empty list"),
    ({"grid": {"pairs": PAIR, "mechanism": ["dpsgd"]}}, "grid.pairs: must be a non-empty list"),
    ({"grid": {"pairs": ["digits"], "mechanism": ["dpsgd"]}}, "grid.pairs[0]: must be a mapping"),
    ({"grid": {"pairs": [{"dataset": "digits"}], "mechanism": ["dpsgd"]}}, "grid.pairs[0]: needs model"),
    ({"grid": {"pairs": [PAIR | {"seed": 1}], "mechanism": ["dpsgd"]}}, "grid.pairs[0]: unknown keys ['seed']"),
    ({"grid": {"pairs": [PAIR, {"dataset": "cifar-99", "model": "mlp"}], "mechanism": ["dpsgd"]}},
     "grid.pairs[1].dataset: unknown dataset 'cifar-99'"),
    ({"grid": {"pairs": [PAIR, PAIR], "mechanism": ["dpsgd"]}},
     "grid.pairs[1]: the pair (digits, mlp) is listed twice"),
    ({"grid": {"pairs": [PAIR | {"train": {"lr": 0}}], "mechanism": ["dpsgd"]}}, "grid.pairs[0].train: lr must be > 0"),
    ({"grid": {"pairs": [PAIR | {"train": [1]}], "mechanism": ["dpsgd"]}}, "grid.pairs[0].train: must be a mapping"),
    ({"grid": {"pairs": [PAIR | {"model_options": {"hidden": 0}}], "mechanism": ["dpsgd"]}},
     "grid.pairs[0].model_options: mlp: option hidden must be >= 1"),
    ({"dataset_train": {"cifar-99": {"lr": 1}}}, "dataset_train: unknown dataset 'cifar-99'"),
    ({"dataset_train": {"digits": {"epochs": 0}}}, "dataset_train.digits: epochs must be >= 1"),
    ({"dataset_train": {"digits": {"bogus": 1}}}, "dataset_train.digits: unknown option(s) bogus"),
])
def test_bad_pairs_and_dataset_train_name_the_problem(overrides, fragment):
    with pytest.raises(grid.GridError) as e:
        parse(overrides)
    assert any(fragment in p for p in e.value.problems), e.value.problems


@pytest.mark.parametrize("example", sorted(p.stem for p in (ROOT / "examples").glob("*.yaml")))
def test_every_example_grid_validates(example):
    assert grid.load(ROOT / "examples" / f"{example}.yaml").trials


def test_the_tramer_boneh_preset_pairs_each_dataset_with_its_models_and_their_settings():
    spec = grid.load(ROOT / "examples" / "tramer_boneh.yaml")
    got = {(t.dataset, t.model): (t.train.batch_size, t.train.lr, t.train.epochs, t.train.momentum, t.train.clip)
           for t in spec.trials}
    assert got[("fashion-mnist", "cnn-tanh")] == (2048, 4, 40, 0.9, 0.1)
    assert got[("fashion-mnist", "scatternet-linear")] == (8192, 16, 40, 0.9, 0.1)
    assert got[("fashion-mnist", "scatternet-cnn")] == (2048, 4, 40, 0.9, 0.1)
    assert got[("mnist", "cnn-tanh")] == (512, 0.5, 40, 0.9, 0.1)
    assert got[("mnist", "scatternet-linear")] == (4096, 8, 40, 0.9, 0.1)
    assert got[("mnist", "scatternet-cnn")] == (1024, 1, 40, 0.9, 0.1)
    assert len(got) == 6 and len(spec.trials) == 6 * 2 * 3
    assert {t.mechanism for t in spec.trials} == {"dpsgd", "dpsgd-shuffle-rdp"}
    assert all(t.dataset_options == {"scaling": "unit"} and t.epsilon == 3 for t in spec.trials)
    # their MNIST ScatterNets standardise with private statistics (a pair's own model options, over the model's)
    norms = {(t.dataset, t.model): dict(t.model_options) for t in spec.trials if t.model.startswith("scatternet")}
    assert norms == {("fashion-mnist", "scatternet-linear"): {"groups": 27},
                     ("fashion-mnist", "scatternet-cnn"): {"groups": 27},
                     ("mnist", "scatternet-linear"): {"groups": 27, "norm": "private"},
                     ("mnist", "scatternet-cnn"): {"groups": 27, "norm": "private"}}


@pytest.mark.parametrize("target", [{"sigma": 1.0}, {"sigma": None, "epsilon": [2]}], ids=["sigma", "epsilon"])
def test_private_is_decided_by_the_mechanism_alone(target):
    """`Mechanism.private` is the one definition of "private?": the grid's reading of it and every trial's
    `private` (which the record and the dashboards read) follow it, for every built-in mechanism."""
    import mechanisms
    from mechanisms.framework.registry import MECHANISMS

    names = list(MECHANISMS.builtins)
    spec = parse({"sigma": target["sigma"], "grid": TINY["grid"] | {"mechanism": names}
                  | ({"epsilon": target["epsilon"]} if "epsilon" in target else {})})
    declared = {n: mechanisms.get(n).private for n in names}
    assert set(declared.values()) == {True, False}  # both kinds are exercised
    assert {n: grid.mechanism_private(n) for n in names} == declared
    seen = {t.mechanism: t.private for t in spec.trials}
    assert seen == declared


# delta: a number, or the rule 1/(2N) -------------------------------------------------------------------
@pytest.mark.parametrize("written", ["1/(2N)", "1 / (2N)", " 1/( 2N ) "])
def test_the_delta_rule_is_parsed_once_and_records_its_text(written):
    """The grid's `1/(2N)` travels as the typed rule (never as text), resolves to 1/(2N) with the training set's
    N, and the record, the trial key and a stored config read back all hold the text, as before."""
    from workers.config import DELTA_PER_N, DeltaRule

    spec = parse({"delta": written})
    for trial in spec.trials:
        assert isinstance(trial.delta, DeltaRule) and trial.delta == DELTA_PER_N
        assert trial.delta_for(1_000) == 1 / 2_000 and trial.delta_for(37) == 1 / 74
        assert trial.to_dict()["delta"] == "1/(2N)" and trial.delta_written == "1/(2N)"
        back = TrialConfig.from_dict(json.loads(json.dumps(trial.to_dict())))
        assert back == trial and back.trial_key == trial.trial_key and back.delta == DELTA_PER_N
    numeric = parse({"delta": 1e-5}).trials[0]
    assert numeric.delta == 1e-5 and numeric.delta_for(1_000) == 1e-5 and numeric.to_dict()["delta"] == 1e-5


def test_a_delta_is_range_checked_by_require_delta_alone():
    """TrialConfig's delta check is `require_delta` (mechanisms.accounting.validation), not bounds of its own."""
    from mechanisms.accounting.validation import require_delta
    from workers.config import delta_problem

    for bad in (0.0, 1.0, -1e-9, float("nan"), float("inf")):
        with pytest.raises(ValueError) as raised:
            require_delta(bad)
        assert delta_problem("delta", bad) == str(raised.value)
    assert delta_problem("delta", 1e-5) is None


def test_the_spec_a_trial_makes_carries_its_config_with_delta_resolved():
    """`workers.trial.privacy_spec` is the one place a trial's `PrivacySpec` is made from its config: the same
    target, sigma, sampler, accountant and calibration, and the rule resolved with the N actually used."""
    from workers.trial import privacy_spec

    for trial in parse({"delta": "1/(2N)", "sampler": "shuffle", "accountant": "rdp"}).trials:
        spec = privacy_spec(trial, 900)
        assert spec.delta == 1 / 1_800 and spec.dataset_size == 900
        assert (spec.epsilon, spec.sigma, spec.sampler, spec.accountant, spec.calibration) == (
            trial.epsilon, trial.sigma, trial.sampler, trial.accountant, trial.calibration)
        assert (spec.batch_size, spec.epochs, spec.clip) == (trial.train.batch_size, trial.train.epochs,
                                                             trial.train.clip)
