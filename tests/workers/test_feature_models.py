"""The models of Tramèr & Boneh's benchmark and the tabular ones: architectures and parameter counts as in
their code, the scattering features equal to kymatio's transform and cached on disk (hit, never stale,
one computation when trials race), the private-normalisation seam, and a short trial of each model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from workers import datasets, models
from workers.models import scatternet

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PRIVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "scattering"


@pytest.fixture(scope="module")
def images():
    return datasets.load("synthetic", {"side": 28, "n_train": 16, "n_test": 8, "num_classes": 10})


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def test_cnn_tanh_is_their_end_to_end_cnn(images):
    module = models.build("cnn-tanh", images).module
    convs = [m for m in module if isinstance(m, nn.Conv2d)]
    pools = [m for m in module if isinstance(m, nn.MaxPool2d)]
    assert [(c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs] == [
        (16, (8, 8), (2, 2), (2, 2)), (32, (4, 4), (2, 2), (0, 0))]
    assert [(p.kernel_size, p.stride) for p in pools] == [(2, 1), (2, 1)]
    assert [m.out_features for m in module if isinstance(m, nn.Linear)] == [32, 10]
    assert sum(isinstance(m, nn.Tanh) for m in module) == 3
    assert n_params(module) == 26_010  # 1,040 + 8,224 + 16,416 + 330


@pytest.mark.parametrize(("name", "count"), [("scatternet-linear", 39_700), ("scatternet-cnn", 33_066)])
def test_scatternet_parameters_and_groupnorm(images, name, count):
    bundle = models.build(name, images)
    assert n_params(bundle.module) == count
    norm = bundle.module[0]
    assert isinstance(norm, nn.GroupNorm) and norm.num_groups == 27 and norm.num_channels == 81 and not norm.affine
    (features,) = bundle.encode(images.test)
    assert features.shape == (8, 81, 7, 7) and bundle.module(features).shape == (8, 10)
    plain = models.build(name, images, {"norm": "none"}).module
    assert not any(isinstance(m, nn.GroupNorm) for m in plain)
    with pytest.raises(ValueError, match="groups must divide the 81 scattering channels"):
        models.build(name, images, {"groups": 10})


def test_features_are_kymatios_scattering_transform(images):
    from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D

    x = images.test.inputs
    expected = ScatteringTorch2D(J=2, shape=(28, 28), L=8)(torch.from_numpy(x)).reshape(len(x), 81, 7, 7)
    assert np.allclose(scatternet.scattering_features(x), expected.numpy(), atol=1e-6)


def _counting(monkeypatch) -> list[int]:
    calls: list[int] = []
    original = scatternet._transform

    def transform(images):
        calls.append(len(images))
        return original(images)

    monkeypatch.setattr(scatternet, "_transform", transform)
    return calls


def test_features_are_computed_once_then_read_from_disk(images, cache, monkeypatch):
    calls = _counting(monkeypatch)
    first = scatternet.scattering_features(images.train.inputs)
    again = scatternet.scattering_features(images.train.inputs.copy())
    assert calls == [16] and np.array_equal(first, again)
    assert [p.suffix for p in cache.iterdir() if p.suffix != ".lock"] == [".npy"]  # no temporary file left
    changed = images.train.inputs.copy()
    changed[3, 0, 5, 5] += 0.5  # one pixel of one image: another key, never the stale file
    assert not np.array_equal(scatternet.scattering_features(changed)[3], first[3])
    assert calls == [16, 16]


@pytest.mark.parametrize("damage", ["shape", "truncated"])
def test_a_file_that_does_not_fit_its_key_is_recomputed(images, cache, monkeypatch, damage):
    x = images.test.inputs
    path = cache / f"{scatternet.feature_key(x)}.npy"
    cache.mkdir(parents=True)
    np.save(path, np.zeros((8, 81, 7, 6 if damage == "shape" else 7), np.float32))
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:1000])
    calls = _counting(monkeypatch)
    assert scatternet.scattering_features(x).shape == (8, 81, 7, 7) and calls == [8]
    assert np.load(path).shape == (8, 81, 7, 7)


RACER = """
import sys, numpy as np
from pathlib import Path
from workers.models import scatternet
folder = Path(sys.argv[1])
original = scatternet._transform
def transform(images):
    (folder / f"computed-{sys.argv[2]}").touch()
    return original(images)
scatternet._transform = transform
(folder / f"ready-{sys.argv[2]}").touch()
while not all((folder / f"ready-{i}").exists() for i in range(3)):  # a barrier: all start together
    pass
x = np.random.default_rng(0).standard_normal((64, 1, 28, 28)).astype(np.float32)
np.save(folder / f"out-{sys.argv[2]}.npy", scatternet.scattering_features(x))
"""


def test_concurrent_trials_compute_a_key_once_and_read_the_same_features(tmp_path, cache):
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path), str(i)], env=env) for i in range(3)]
    assert [p.wait(timeout=600) for p in racers] == [0, 0, 0]
    assert len(list(tmp_path.glob("computed-*"))) == 1
    outs = [np.load(tmp_path / f"out-{i}.npy") for i in range(3)]
    assert all(np.array_equal(outs[0], o) for o in outs[1:]) and outs[0].shape == (64, 81, 7, 7)
    assert not list(cache.glob("*.tmp")) and not list(cache.glob(".*"))


def test_standardize_refuses_to_run_until_statistics_are_released():
    x = torch.randn(5, 81, 7, 7) * 3 + 1
    layer = scatternet.Standardize(81)
    with pytest.raises(RuntimeError, match="no statistics were released"):
        layer(x)
    moments = scatternet.channel_moments(x)
    assert moments.shape == (5, 2, 81)
    mean = moments[:, 0].mean(0)
    var = moments[:, 1].mean(0) - mean**2
    var[0] = 0.0  # a channel whose released variance is 0 is zeroed, as in the paper's code
    layer.set_statistics(mean, var)
    out = layer(x)
    assert torch.all(out[:, 0] == 0)
    assert torch.allclose(out[:, 1], (x[:, 1] - mean[1]) / torch.sqrt(var[1] + 1e-5))


def test_private_standardisation_is_a_statistic_the_model_declares(images):
    bundle = models.build("scatternet-linear", images, {"norm": "private", "norm_noise_multiplier": 6.0,
                                                         "norm_bounds": [0.5, 0.25]})
    assert isinstance(bundle.module[0], scatternet.Standardize)
    (use,) = bundle.statistics
    assert (use.release.name, use.release.bounds, use.release.noise_multiplier) == ("channel_moments", (0.5, 0.25), 6.0)
    (features,) = bundle.encode(images.train)
    rows = use.per_example((features,))
    assert rows.shape == (16, 2, 81)
    changed = features.clone()
    changed[3] += 1.0
    moved = (use.per_example((changed,)) != rows).flatten(1).any(1)
    assert moved.tolist() == [i == 3 for i in range(16)]  # row i depends on example i alone
    use.receive(rows.double().sum(0), 16)  # the exact sums: the layer standardises with the exact moments
    out = bundle.module[0](features)
    assert torch.allclose(out.mean((0, 2, 3)), torch.zeros(81), atol=1e-3)


@pytest.mark.parametrize("mechanism", ["dpsgd", "nonprivate"])
def test_a_trial_releases_the_statistics_its_plan_accounts(mechanism):
    from workers.trial import run_trial

    record = run_trial({"sweep": "t", "dataset": "synthetic", "model": "scatternet-linear", "mechanism": mechanism,
                        "sigma": 1.0 if mechanism == "dpsgd" else None, "model_options": {"norm": "private"},
                        "dataset_options": {"side": 28, "n_train": 128, "n_test": 32},
                        "audit": {"mode": "off", "mia": "off"},
                        "train": {"epochs": 1, "batch_size": 32, "lr": 0.5, "clip": 0.1}})
    assert record["status"] == "finished", record.get("error")
    if mechanism == "dpsgd":
        assert record["privacy"]["parts"]["dataset_releases"] == [
            {"statistic": "channel_moments", "bounds": [0.3, 0.15], "noise_multiplier": 8.0}]
        assert "GaussianDpEvent(noise_multiplier=5.65" in record["privacy"]["effective_event"]


def test_a_statistic_the_plan_did_not_account_stops_the_trial(images):
    import mechanisms
    from mechanisms.parts.plan import PrivacySpec
    from workers.train import release_statistics

    bundle = models.build("scatternet-linear", images, {"norm": "private"})
    plan = mechanisms.get("dpsgd").plan(PrivacySpec(epsilon=None, sigma=1.0, delta=1e-5, dataset_size=16,
                                                    batch_size=4, epochs=1))
    with pytest.raises(RuntimeError, match=r"accounts the statistics \[\] but the model releases \['channel_mom"):
        release_statistics(bundle, images.train, plan, None)
    with pytest.raises(RuntimeError, match="no statistics were released"):
        bundle.module(*bundle.encode(images.test))


def test_tabular_models_take_feature_vectors():
    splits = datasets.load("breast-cancer")
    for name, count in (("linear", 30 * 2 + 2), ("mlp", 30 * 128 + 128 + 128 * 2 + 2)):
        bundle = models.build(name, splits)
        assert n_params(bundle.module) == count
        assert bundle.module(*bundle.encode(splits.test)).shape == (114, 2)
    with pytest.raises(ValueError, match="takes image data, dataset 'breast-cancer' is tabular"):
        models.build("cnn-tanh", splits)


@pytest.mark.parametrize(("dataset", "model", "options"), [
    ("synthetic", "cnn-tanh", {"side": 28, "n_train": 128, "n_test": 32}),
    ("synthetic", "scatternet-linear", {"side": 28, "n_train": 128, "n_test": 32}),
    ("synthetic", "scatternet-cnn", {"side": 28, "n_train": 128, "n_test": 32}),
    ("breast-cancer", "linear", {}),
])
def test_a_private_trial_of_each_model_runs_with_the_bookkeeping_engine(dataset, model, options):
    from workers.trial import run_trial

    record = run_trial({"sweep": "t", "dataset": dataset, "model": model, "mechanism": "dpsgd", "sigma": 1.0,
                        "dataset_options": options, "audit": {"mode": "off", "mia": "off"},
                        "train": {"epochs": 2, "batch_size": 32, "lr": 0.5, "clip": 0.1}})
    assert record["status"] == "finished", record.get("error")
    assert record["privacy"]["grad_sample_mode"] == "bk" and record["privacy"]["bk_fallback"] is None
    assert len(record["curves"]["test_accuracy"]) == 2


@pytest.mark.parametrize("optimizer", [{"momentum": 0.9}, {"optimizer": "adam", "lr": 0.01}])
def test_their_optimizer_with_state_trains_privately(optimizer):
    """Tramèr & Boneh train with SGD and momentum 0.9: an optimizer that keeps per-parameter state (momentum
    buffers, Adam's moments) must run under DP-SGD as it does without it."""
    from workers.trial import run_trial

    record = run_trial({"sweep": "t", "dataset": "breast-cancer", "model": "linear", "mechanism": "dpsgd",
                        "sigma": 1.0, "audit": {"mode": "off", "mia": "off"},
                        "train": {"epochs": 1, "batch_size": 32, "lr": 0.5, "clip": 0.1} | optimizer})
    assert record["status"] == "finished", record.get("error")
