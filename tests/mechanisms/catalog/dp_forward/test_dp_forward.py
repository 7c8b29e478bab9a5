"""mechanisms/catalog/dp_forward/__init__.py: DP-Forward's plan (calibration equals aMGM, certified epsilons,
honest verdicts), make_private (frozen or leaking pre-noise layers, labels randomised once), the audit hooks and
a trial end to end. The noise layer and the label RR have their own files (test_forward_noise.py,
test_label_rr.py)."""

from __future__ import annotations

import json
import math

import dp_accounting
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from transformers import BertForSequenceClassification

import mechanisms
from mechanisms.accounting.analytic_gaussian import agm_epsilon, amgm_sigma
from mechanisms.catalog import dp_forward
from mechanisms.catalog.dp_forward import label_rr
from mechanisms.catalog.dp_forward.forward_noise import install, parse_position
from mechanisms.framework.claims import claim_status
from tests.mechanisms.catalog.dp_forward.dp_forward_setting import DELTA, LN9, spec, tiny_config

# ---- calibration: the paper's analysis --------------------------------------------------------------

@pytest.mark.parametrize(("eps", "sensitivity", "expected"), [
    (8.0, "2C", 1.200458), (8.0, "C", 0.600229), (1.0, "2C", 7.461263), (1.0, "C", 3.730632),
    (0.5, "2C", 14.06365), (16.0, "C", 0.344177),
])
def test_local_per_release_sigma_is_the_amgm_calibration(eps, sensitivity, expected):
    """the DP-Forward paper's Table (arXiv 2309.06746): sigma = S / B(eps, delta) (C = 1), no labels."""
    p = dp_forward.mechanism.plan(spec(eps, accounting="local", local_composition="per-release",
                                       sensitivity=sensitivity, epsilon_labels=None))
    s = 2.0 if sensitivity == "2C" else 1.0
    assert p.sigma == pytest.approx(amgm_sigma(eps, DELTA, s), rel=1e-12)
    assert p.sigma == pytest.approx(expected, rel=2e-6)
    assert p.epsilon_claimed == pytest.approx(eps, rel=1e-9)


def test_composition_over_epochs_is_explicit():
    """k releases of the same example compose exactly: sigma grows by sqrt(k); labels are paid once."""
    per = dp_forward.mechanism.plan(spec(8.0, epochs=3, accounting="local", local_composition="per-release"))
    tot = dp_forward.mechanism.plan(spec(8.0, epochs=3, accounting="local"))
    assert per.sigma == pytest.approx(amgm_sigma(8.0 - LN9, DELTA, 2.0), rel=1e-12)
    assert tot.sigma == pytest.approx(math.sqrt(3) * per.sigma, rel=1e-9)  # e.g. 2.079 at eps 8 without labels
    assert tot.extra["epsilon_local_epochs"] + LN9 == pytest.approx(8.0, rel=1e-9)
    assert per.extra["epsilon_local_epochs"] > per.extra["epsilon_local_per_release"] * 1.5  # code's gap


def test_gm_calibrator_is_the_classical_formula():
    p = dp_forward.mechanism.plan(spec(8.0, accounting="local", local_composition="per-release", sensitivity="C",
                             calibrator="gm", epsilon_labels=None))
    assert p.sigma == pytest.approx(0.605601, rel=2e-6)  # research table, GM sigma (S=1)


def test_central_claim_is_the_papers_translation():
    """q = 1/N, T = kN Poisson-subsampled Gaussian at sensitivity S: 2C at 2 sigma equals C at sigma."""
    n = 2000
    c = dp_forward.central_events(n, 3, dp_forward.Options(sensitivity="C"))
    two_c = dp_forward.central_events(n, 3, dp_forward.Options())
    assert repr(c(0.5)) == repr(two_c(1.0))
    p = dp_forward.mechanism.plan(spec(3.0, n=n))
    assert p.epsilon_claimed == pytest.approx(3.0, rel=2e-3) and p.epsilon_claimed <= 3.0
    assert p.extra["epsilon_central_labels"] == pytest.approx(label_rr.shuffled_rr_epsilon(LN9, 2, n, DELTA))
    # the same noise, read as local releases, is far weaker: the amplification is the whole claim
    assert p.extra["epsilon_local_per_release"] > 3 * p.epsilon_claimed


# ---- certification ------------------------------------------------------------------------------------

STRICT = {"freeze_pre_noise": True, "position": "pooled"}


def test_certified_is_k_gaussians_at_2c_composed_with_rr():
    options = dp_forward.Options(**STRICT, epsilon_labels=None)
    exact = agm_epsilon(1.3 / math.sqrt(3), DELTA, sensitivity=2.0)  # k releases at ratio 2/sigma, exactly
    pld = dp_forward.certified_epsilon(1.3, 3, DELTA, options)
    assert exact <= pld <= exact * 1.01  # PLD is pessimistic, never below the exact curve
    with_labels = dp_forward.certified_epsilon(1.3, 3, DELTA, dp_forward.Options(**STRICT))
    assert exact < with_labels <= exact + LN9 + 0.01  # at most basic composition


def test_certification_gaps_are_uncertified():
    default = dp_forward.mechanism.plan(spec(8.0, sigma=1.0))
    assert default.epsilon_certified is None
    assert isinstance(default.effective_event, dp_accounting.UnsupportedDpEvent)
    assert "trained" in default.uncertified_reason
    assert claim_status(default.epsilon_claimed, default.epsilon_certified) == "uncertified"
    seq = dp_forward.mechanism.plan(spec(8.0, sigma=1.0, freeze_pre_noise=True, position="last-encoder"))
    assert seq.epsilon_certified is None and "mask" in seq.notes
    clean = dp_forward.mechanism.plan(spec(8.0, sigma=1.0, freeze_pre_noise=True, epsilon_labels=None))
    assert clean.epsilon_certified is None and "labels" in clean.notes
    strict = dp_forward.mechanism.plan(spec(8.0, **STRICT))
    assert strict.epsilon_certified == pytest.approx(
        dp_forward.certified_epsilon(strict.sigma, 3, DELTA, dp_forward.Options(**STRICT)))
    # central claim at eps 8 is amplified; the sound, un-amplified bound is far larger: overclaimed
    assert strict.epsilon_certified > 2 * strict.epsilon_claimed
    assert claim_status(strict.epsilon_claimed, strict.epsilon_certified) == "overclaimed"
    # the event never lets an add/remove accountant under-report: RR makes it unsupported there
    assert mechanisms.accounting.epsilon(strict.effective_event, DELTA) is None


def test_certified_calibration_meets_the_target():
    p = dp_forward.mechanism.plan(spec(6.0, calibration="certified", **STRICT))
    assert 6.0 * (1 - 3e-3) <= p.epsilon_certified <= 6.0
    with pytest.raises(ValueError, match="certified"):
        dp_forward.mechanism.plan(spec(6.0, calibration="certified"))


def test_local_claim_at_2c_is_ok_and_at_c_is_overclaimed():
    ok = dp_forward.mechanism.plan(spec(8.0, accounting="local", **STRICT))
    assert claim_status(ok.epsilon_claimed, ok.epsilon_certified) == "ok"
    code = dp_forward.mechanism.plan(spec(8.0, epochs=3, accounting="local", sensitivity="C",
                                local_composition="per-release", **STRICT))
    assert code.epsilon_claimed == pytest.approx(8.0)
    assert code.epsilon_certified > 2.5 * code.epsilon_claimed  # half the noise, and 3 uncomposed epochs
    assert claim_status(code.epsilon_claimed, code.epsilon_certified) == "overclaimed"


def test_options_are_validated():
    with pytest.raises(ValueError, match="dp-forward: unknown option"):
        dp_forward.mechanism.plan(spec(8.0, postion="pooled"))
    with pytest.raises(ValueError, match="position"):
        dp_forward.mechanism.plan(spec(8.0, position="encoder-0"))
    with pytest.raises(ValueError, match="whole target"):
        dp_forward.mechanism.plan(spec(2.0, accounting="local"))
    assert parse_position("encoder-3").name == "encoder-3-add-norm-2"
    assert parse_position("output").name == "pooled"
    assert mechanisms.get("dp-forward") is dp_forward.mechanism
    with pytest.raises(ValueError, match="BERT-family"):
        install(nn.Sequential(nn.Linear(4, 2)), "pooled", sigma=1.0)


# ---- make_private: frozen f, leaking f, labels ----------------------------------------------------------

def loader_for(n: int = 64, classes: int = 2, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 30, (n, 8), generator=g)  # tokens 30..59 never appear
    data = TensorDataset(ids, torch.ones_like(ids), torch.randint(0, classes, (n,), generator=g))
    return DataLoader(data, batch_size=16, shuffle=True, generator=g)


class Logits(nn.Module):
    """(input_ids, attention_mask) -> logits around a plain HF classifier."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask).logits


def one_step(model: nn.Module, loader: DataLoader, **options) -> tuple[nn.Module, DataLoader, dict]:
    p = dp_forward.mechanism.plan(spec(8.0, n=len(loader.dataset), epochs=1, sigma=0.5, batch_size=16, **options))
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-2, weight_decay=0.0)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    model, opt, loader, criterion = dp_forward.mechanism.make_private(
        model, opt, loader.dataset, p, criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0))
    model.train()
    ids, mask, y = next(iter(loader))
    opt.zero_grad()
    criterion(model(ids, mask), y).backward()
    opt.step()
    return model, loader, {"before": before, "ids": ids}


def test_freeze_pre_noise_trains_only_the_post_noise_layers():
    torch.manual_seed(0)
    model = Logits(BertForSequenceClassification(tiny_config()))
    model, _, info = one_step(model, loader_for(), position="encoder-1-mha", freeze_pre_noise=True)
    changed = {k for k, v in model.named_parameters() if not torch.equal(v, info["before"][k])}
    frozen = {k for k, v in model.named_parameters() if not v.requires_grad}
    assert frozen and not (changed & frozen)
    assert any("layer.0.attention.self" in k for k in frozen)
    assert any("layer.0.attention.output.dense" in k for k in frozen)
    assert not any("layer.0.attention.output.LayerNorm" in k for k in frozen)
    assert any("layer.0.attention.output.LayerNorm" in k for k in changed)
    assert any("classifier" in k for k in changed)
    assert model.dp_forward.releases == 16


def test_trainable_pre_noise_layers_leak_which_tokens_were_seen():
    """Why the default (the paper's experiments) is uncertified: f's clean gradients move exactly the
    embedding rows of the tokens in the batch, whatever the noise on the hidden state."""
    torch.manual_seed(0)
    model = Logits(BertForSequenceClassification(tiny_config()))
    model, _, info = one_step(model, loader_for(), position="embedding")
    name = "model.bert.embeddings.word_embeddings.weight"
    moved = (model.state_dict()[name] != info["before"][name]).any(dim=1)
    assert set(torch.nonzero(moved).ravel().tolist()) == set(info["ids"].unique().tolist())


def test_labels_are_randomized_once_per_example():
    base = loader_for(n=4000)
    p = dp_forward.mechanism.plan(spec(8.0, n=4000, epochs=1, sigma=0.5, seed=7))
    torch.manual_seed(0)
    model = Logits(BertForSequenceClassification(tiny_config()))
    _, _, loader, _ = dp_forward.mechanism.make_private(model, None, base.dataset, p, criterion=None,
                                              generator=torch.Generator().manual_seed(0))
    clean = base.dataset.tensors[-1]
    noisy = loader.tensors[-1]  # the training set as it lives on the device, labels randomised
    assert (noisy == clean).float().mean().item() == pytest.approx(0.9, abs=0.015)  # keep e^eps2/(e^eps2+1)
    assert torch.equal(loader.tensors[0], base.dataset.tensors[0])
    seen = {}
    for _ in range(2):  # two epochs: same noisy label for every example, new order
        for ids, _, y in loader:
            for row, label in zip(ids, y, strict=True):
                seen.setdefault(tuple(row.tolist()), set()).add(int(label))
    assert max(len(v) for v in seen.values()) == 1


def test_make_private_checks_the_classes_the_plan_accounted():
    torch.manual_seed(0)
    model = Logits(BertForSequenceClassification(tiny_config(num_labels=3)))
    p = dp_forward.mechanism.plan(spec(8.0, n=64, epochs=1, sigma=0.5))
    with pytest.raises(ValueError, match="num_classes: 3"):
        dp_forward.mechanism.make_private(model, None, loader_for(classes=3).dataset, p, criterion=None,
                                generator=torch.Generator().manual_seed(0))


# ---- auditing hooks ---------------------------------------------------------------------------------

def test_privatize_step_normalises_rows_then_adds_gaussian_noise():
    rng = np.random.default_rng(0)
    rows = np.tile(np.array([[3.0, 0.0, 4.0, 0.0]]), (200_000, 1))
    out = dp_forward.mechanism.privatize_step(rows, 0.7, 2.0, rng)
    np.testing.assert_allclose(out.mean(axis=0), [1.2, 0.0, 1.6, 0.0], atol=0.01)
    np.testing.assert_allclose(out.std(axis=0), 1.4, rtol=0.01)
    (case,) = dp_forward.mechanism.audit_cases(8, 1.0, rng, {})
    a = dp_forward.mechanism.privatize_step(case.base[None], 1e-9, 1.0, rng)[0]
    b = dp_forward.mechanism.privatize_step((case.base + case.canary)[None], 1e-9, 1.0, rng)[0]
    assert np.linalg.norm(a - b) == pytest.approx(2.0, rel=1e-6)  # the 2C worst case
    assert dp_forward.mechanism.claimed_step_tradeoff(0.5, {}).mu == pytest.approx(4.0)
    assert dp_forward.mechanism.claimed_step_tradeoff(0.5, {"sensitivity": "C"}).mu == pytest.approx(2.0)


def test_audit_refutes_the_sensitivity_c_claim():
    from mechanisms.auditing import audit_step, step_spec

    code = audit_step(dp_forward.mechanism, step_spec(1.0, DELTA, options={"sensitivity": "C"}), samples=20_000,
                      dim=16)
    paper = audit_step(dp_forward.mechanism, step_spec(1.0, DELTA), samples=20_000, dim=16)
    assert code.violated and code.claim_status == "violated"
    assert not paper.violated
    assert code.mu_audited > 1.0  # the true mu is 2 / sigma; the code claims 1 / sigma


# ---- end to end ---------------------------------------------------------------------------------------

def test_run_trial_trains_with_dp_forward_and_reports_both_epsilons():
    from workers.trial import run_trial

    config = dict(sweep="t", trial_key="k", dataset="synthetic-text", model="bert-tiny", mechanism="dp-forward",
                  epsilon=8.0, delta=1e-5, seed=0, dataset_options={"n_train": 96, "n_test": 32},
                  model_options={"layers": 1, "hidden": 32, "max_length": 16},
                  train=dict(epochs=2, batch_size=32, lr=1e-3, optimizer="adamw"),
                  mechanism_options={"position": "pooled", "epsilon_labels": 2.2, "freeze_pre_noise": True})
    record = run_trial(config)
    assert record["status"] == "finished", record.get("traceback")
    privacy = record["privacy"]
    assert privacy["epsilon_claimed"] == pytest.approx(8.0, rel=2e-3)
    assert privacy["epsilon_certified"] > privacy["epsilon_claimed"]  # no amplification is certified
    assert privacy["claim_status"] == "overclaimed"
    assert privacy["extra"]["epsilon_central_labels"] == pytest.approx(
        label_rr.shuffled_rr_epsilon(2.2, 2, 96, 1e-5))
    assert record["metrics"]["steps_run"] == 6


@pytest.mark.slow
def test_example_grid_runs_through_privbench_sweep(cli, tmp_path):
    """The shipped grid, shrunk to one epsilon and a few examples, through Ray, MLflow and the leaderboard."""
    import yaml

    grid = yaml.safe_load(open("examples/dp_forward.yaml"))
    grid["grid"]["epsilon"] = [8]
    grid["train"] |= {"epochs": 1, "max_train_examples": 64}
    grid["model_options"] = {"minilm": {"trainable": "head", "max_length": 16}}
    grid["dataset_options"] = {"rotten-tomatoes": {"test_fraction": 0.02, "val_fraction": 0.0}}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    store = tmp_path / "store"
    assert cli("sweep", "run", path, "--store", store).exit_code == 0
    rows = json.loads(cli("leaderboard", grid["name"], "--store", store, "--format", "json").output)
    by_mech = {r["mechanism"]: r for r in rows}
    assert set(by_mech) == {"nonprivate", "dpsgd", "dp-forward"}
    assert by_mech["dp-forward"]["epsilon_claimed"] == pytest.approx(8.0, rel=2e-3)
