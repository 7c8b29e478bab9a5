"""DP-Forward: calibration equals aMGM, hooks reach the intended sub-layer, noise at inference, honest epsilons."""

from __future__ import annotations

import itertools
import json
import math

import dp_accounting
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from transformers import BertConfig, BertForSequenceClassification, BertModel

import mechanisms
from mechanisms import PrivacySpec
from mechanisms.accounting.analytic_gaussian import agm_epsilon, amgm_sigma
from mechanisms.catalog import dp_forward
from mechanisms.catalog.dp_forward import label_rr
from mechanisms.catalog.dp_forward.forward_noise import bound_norm, install, parse_position
from mechanisms.framework.claims import claim_status
from workers.models.transformers import TextClassifier

DELTA = 1e-5
LN9 = math.log(9)


def spec(epsilon: float | None = 8.0, *, n: int = 512, epochs: int = 3, sigma: float | None = None,
         calibration: str = "claimed", clip: float = 1.0, batch_size: int = 32, **options) -> PrivacySpec:
    return PrivacySpec(epsilon=epsilon, delta=DELTA, dataset_size=n, batch_size=batch_size, epochs=epochs, clip=clip,
                       sigma=sigma, calibration=calibration, options=options)


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


def test_label_rr_costs_the_papers_point_03_on_sst2():
    """Table 5's 'RR costs only 0.03' (SST-2, keep 0.9) is RR on a size-one subsample, q = 1/N, N releases."""
    assert 0.025 < label_rr.shuffled_rr_epsilon(LN9, 2, 67_349, DELTA) < 0.032
    assert label_rr.shuffled_rr_epsilon(LN9, 2, 1, DELTA) == pytest.approx(LN9)


@pytest.mark.parametrize(("classes", "n", "eps"), [(2, 4, 0.3), (3, 5, 0.8), (4, 3, 0.1)])
def test_shuffled_rr_delta_matches_brute_force(classes, n, eps):
    """The binomial sums equal a full enumeration of every output sequence (both directions)."""
    q = 1 / n
    keep = 1 / (1 + (classes - 1) * math.exp(-1.5))
    a, b = keep, (1 - keep) / (classes - 1)
    mix = np.array([(1 - q) * b + q * a, (1 - q) * a + q * b] + [b] * (classes - 2))
    plain = np.array([b, a] + [b] * (classes - 2))
    worst = 0.0
    for up, lo in ((mix, plain), (plain, mix)):
        total = 0.0
        for seq in itertools.product(range(classes), repeat=n):
            pu, pl = np.prod(up[list(seq)]), np.prod(lo[list(seq)])
            total += max(0.0, pu - math.exp(eps) * pl)
        worst = max(worst, total)
    assert label_rr.shuffled_rr_delta(eps, 1.5, classes, n) == pytest.approx(worst, rel=1e-9, abs=1e-14)


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


# ---- the noise layer on real Hugging Face models --------------------------------------------------------

def tiny_config(**kw) -> BertConfig:
    return BertConfig(**{"vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                         "intermediate_size": 32, "max_position_embeddings": 32, "num_labels": 2} | kw)


@pytest.fixture
def bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(tiny_config()).eval()


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 60, (4, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    mask[2, 4:] = 0
    return ids, mask


def manual_layer(layer: nn.Module, h: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """An independent eval-mode BERT layer: the tensor at every sub-position (from the weights alone)."""
    sa = layer.attention.self
    b, n, d = h.shape
    heads, hd = sa.num_attention_heads, sa.attention_head_size

    def split(x: torch.Tensor) -> torch.Tensor:
        return x.view(b, n, heads, hd).transpose(1, 2)

    scores = split(sa.query(h)) @ split(sa.key(h)).transpose(-1, -2) / math.sqrt(hd)
    scores = scores + (1 - mask[:, None, None, :].float()) * torch.finfo(h.dtype).min
    ctx = (scores.softmax(-1) @ split(sa.value(h))).transpose(1, 2).reshape(b, n, d)
    mha = layer.attention.output.dense(ctx)
    add_norm_1 = layer.attention.output.LayerNorm(mha + h)
    ffn = layer.output.dense(layer.intermediate(add_norm_1))
    return {"mha": mha, "add-norm-1": add_norm_1, "ffn": ffn, "add-norm-2": layer.output.LayerNorm(ffn + add_norm_1)}


def observe(model: nn.Module, position: str, ids: torch.Tensor, mask: torch.Tensor, **kw) -> tuple[list, torch.Tensor]:
    seen: list[torch.Tensor] = []
    kw = {"sigma": 0.0, "clip": 1e9, "normalization": "clip"} | kw
    noise = install(model, position, observer=lambda bounded, released: seen.append(released), **kw)
    logits = model(input_ids=ids, attention_mask=mask).logits
    noise.remove()
    return seen, logits


@pytest.mark.parametrize("position", ["embedding", "encoder-1-mha", "encoder-1-add-norm-1", "encoder-1-ffn",
                                      "encoder-1", "encoder-2-mha", "encoder-2-ffn", "last-encoder", "pooled"])
def test_hook_reaches_the_intended_sublayer(bert, batch, position):
    """Shapes and values: with zero noise and no bound the hooked tensor is the reference tensor."""
    ids, mask = batch
    ref = bert(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    seen, _ = observe(bert, position, ids, mask)
    assert len(seen) == 1
    pos = parse_position(position).resolve(2)
    if pos.kind == "embedding":
        expected = ref.hidden_states[0]
    elif pos.kind == "pooled":
        expected = bert.bert.pooler(ref.hidden_states[-1])
    else:
        expected = manual_layer(bert.bert.encoder.layer[pos.layer - 1], ref.hidden_states[pos.layer - 1],
                                mask)[pos.sublayer]
    assert seen[0].shape == ((4, 16) if pos.kind == "pooled" else (4, 9, 16))
    torch.testing.assert_close(seen[0], expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("position", ["embedding", "encoder-1-add-norm-1", "encoder-2", "pooled"])
def test_zero_noise_unbounded_is_the_plain_model(bert, batch, position):
    ids, mask = batch
    plain = bert(input_ids=ids, attention_mask=mask).logits
    _, hooked = observe(bert, position, ids, mask)
    torch.testing.assert_close(hooked, plain, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(bert(input_ids=ids, attention_mask=mask).logits, plain)  # removed cleanly


@pytest.mark.parametrize("sub", ["mha", "ffn"])
def test_residual_is_dropped_after_mha_and_ffn(bert, batch, sub):
    """The post-noise Add&Norm sees only the noisy tensor, never the clean input X."""
    ids, mask = batch
    ref = bert(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    layer = bert.bert.encoder.layer[0]
    expected = manual_layer(layer, ref.hidden_states[0], mask)
    add_norm = layer.attention.output if sub == "mha" else layer.output
    got: list[torch.Tensor] = []
    handle = add_norm.register_forward_hook(lambda m, a, out: got.append(out))
    observe(bert, f"encoder-1-{sub}", ids, mask)
    handle.remove()
    norm = add_norm.LayerNorm
    torch.testing.assert_close(got[0], norm(expected[sub]), atol=2e-5, rtol=1e-4)
    assert not torch.allclose(got[0], expected["add-norm-1" if sub == "mha" else "add-norm-2"], atol=1e-3)


def test_normalised_zero_noise_equals_manual_pipeline(bert, batch):
    """Encoder-2 output normalised to C per example, then pooler and classifier: the hooked logits."""
    ids, mask = batch
    ref = bert(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    h = ref.hidden_states[2]
    normed = h * (0.7 / h.reshape(4, -1).norm(dim=1)).view(4, 1, 1)
    expected = bert.classifier(bert.bert.pooler(normed))
    _, hooked = observe(bert, "encoder-2", ids, mask, clip=0.7, normalization="normalize")
    torch.testing.assert_close(hooked, expected, atol=2e-5, rtol=1e-4)


def test_mean_pooling_adapter_noises_the_head_input(batch):
    """MiniLM-style TextClassifier (mean pooling, no BertPooler): `pooled` is the head's input vector."""
    torch.manual_seed(0)
    model = TextClassifier(BertModel(tiny_config(), add_pooling_layer=False), num_classes=2, pooling="mean").eval()
    ids, mask = batch
    seen: list[torch.Tensor] = []
    noise = install(model, "pooled", sigma=0.0, clip=1e9, normalization="clip",
                    observer=lambda b, r: seen.append(r))
    model(ids, mask)
    noise.remove()
    length = int(mask.sum(1).max())
    hidden = model.model(input_ids=ids[:, :length], attention_mask=mask[:, :length]).last_hidden_state
    m = mask[:, :length, None].float()
    torch.testing.assert_close(seen[0], (hidden * m).sum(1) / m.sum(1), atol=2e-5, rtol=1e-4)


def test_noise_is_present_at_inference_with_the_planned_std(bert, batch):
    ids, mask = batch
    p = dp_forward.mechanism.plan(spec(8.0, accounting="local", local_composition="per-release", epsilon_labels=None,
                             clip=0.5))
    assert p.sigma == pytest.approx(amgm_sigma(8.0, DELTA, 2.0))
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    noise = install(bert, "encoder-2", sigma=p.sigma, clip=0.5, seed=3, observer=lambda b, r: pairs.append((b, r)))
    bert.eval()
    with torch.no_grad():
        first, second = bert(input_ids=ids, attention_mask=mask).logits, bert(input_ids=ids, attention_mask=mask).logits
        for _ in range(10):
            bert(input_ids=ids, attention_mask=mask)
    assert not torch.allclose(first, second)
    bounded = torch.cat([b for b, _ in pairs])
    residual = torch.cat([r - b for b, r in pairs])
    torch.testing.assert_close(bounded.reshape(bounded.shape[0], -1).norm(dim=1),
                               torch.full((bounded.shape[0],), 0.5), atol=1e-5, rtol=1e-5)
    assert residual.std().item() == pytest.approx(p.sigma * 0.5, rel=0.03)
    assert abs(residual.mean().item()) < 0.02 * p.sigma
    noise.remove()
    off = install(bert, "encoder-2", sigma=p.sigma, clip=0.5, inference_noise=False)
    with torch.no_grad():
        assert torch.equal(bert(input_ids=ids, attention_mask=mask).logits,
                           bert(input_ids=ids, attention_mask=mask).logits)
        bert.train()
        assert not torch.equal(bert(input_ids=ids, attention_mask=mask).logits,
                               bert(input_ids=ids, attention_mask=mask).logits)
    off.remove()


def test_bound_norm_modes():
    h = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    torch.testing.assert_close(bound_norm(h, 1.0, "normalize"), torch.tensor([[0.6, 0.8], [0.6, 0.8], [0.0, 0.0]]))
    torch.testing.assert_close(bound_norm(h, 1.0, "clip"), torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]]))


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


def test_randomized_response_is_k_ary_rr():
    rng = np.random.default_rng(0)
    labels = np.zeros(300_000, dtype=np.int64)
    out = label_rr.randomized_response(labels, 1.0, 4, rng)
    keep = math.e / (math.e + 3)
    assert (out == 0).mean() == pytest.approx(keep, abs=0.003)
    for other in (1, 2, 3):
        assert (out == other).mean() == pytest.approx((1 - keep) / 3, abs=0.003)


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
