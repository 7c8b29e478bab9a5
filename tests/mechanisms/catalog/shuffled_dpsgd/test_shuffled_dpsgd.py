"""shuffled-dpsgd: the paper's claimed accounting, a certified epsilon that is never below the truth,
training that equals its unshuffled twin, and the audit hooks (arXiv 2407.15414)."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import TensorDataset

import mechanisms
from mechanisms.accounting import fenton_wilkinson as fw
from mechanisms.catalog import dpsgd
from mechanisms.catalog import shuffled_dpsgd as sd
from mechanisms.framework import private_training
from mechanisms.parts.plan import PrivacySpec

SD = sd.mechanism  # the ShuffledDpSgd instance the registry holds

VIT = dict(delta=5e-6, dataset_size=50_000, batch_size=1000, epochs=10)  # paper Table I; |B| assumed
VIT_D = 85_800_000



def spec(**kw) -> PrivacySpec:
    base = dict(epsilon=None, delta=1e-5, dataset_size=1000, batch_size=50, epochs=1, options={"num_params": 10_000})
    return PrivacySpec(**(base | kw))


# ---- plan: claimed (paper) and certified (reference) ----------------------------------------------

@pytest.mark.parametrize(("ratio", "sigma_expected"), [(1, 0.274), (16, 0.942)])
def test_plan_reproduces_the_papers_sigma_and_exposes_the_gap(ratio, sigma_expected):
    """ViT/CIFAR-100 at epsilon 0.5: the paper (sigma_0 = 20.72; shuffled 0.274 / 0.942)."""
    plan = SD.plan(PrivacySpec(epsilon=0.5, **VIT, options={"num_params": VIT_D, "batch_clip_ratio": ratio}))
    assert plan.mechanism == "shuffled-dpsgd" and plan.extra["shuffled"]
    assert plan.sigma == pytest.approx(sigma_expected, rel=2e-3)
    assert plan.extra["sigma_unshuffled"] == pytest.approx(20.72, rel=2e-3)
    assert plan.epsilon_claimed == pytest.approx(0.5, rel=1e-6) and plan.epsilon_claimed <= 0.5 + 1e-9
    assert plan.epsilon_certified > 6 * plan.epsilon_claimed  # PLD: 3.3 (c'=16c) and 108 (c'=c)
    assert plan.extra["sigma_certified_for_target"] > 3 * plan.sigma
    assert mechanisms.framework.claims.claim_status(plan.epsilon_claimed, plan.epsilon_certified) == "overclaimed"


def test_alg1_falls_back_to_plain_dpsgd_when_shuffling_does_not_lower_sigma():
    s = spec(epsilon=1.0, options={"num_params": 3, "batch_clip_ratio": 1000})
    plan = SD.plan(s)
    assert not plan.extra["shuffled"] and plan.extra["batch_clip_ratio"] is None
    assert plan.sigma == plan.extra["sigma_unshuffled"] <= plan.extra["sigma_shuffled"]  # c' >> c: FW -> Gaussian
    reference = dpsgd.mechanism.plan(dataclasses.replace(s, sigma=plan.sigma, options={}))
    assert plan.effective_event == reference.effective_event
    assert plan.epsilon_claimed == pytest.approx(1.0, rel=1e-6)
    assert plan.epsilon_certified <= plan.epsilon_claimed  # the d = 1 pipeline (aGM + advanced composition) is sound


@pytest.mark.parametrize(("ratio", "noise_scale"), [(16, 1.0), (0.5, 1.0), (0.25, 2.0), (0.1, 5.0)])
def test_certified_epsilon_is_dpsgd_at_sigma_over_the_sensitivity(ratio, noise_scale):
    """Sensitivity of the batch-clipped sum is min(c, 2c'): only c'/c < 1/2 buys certified privacy."""
    s = spec(sigma=1.0, epochs=2, options={"num_params": 10_000, "batch_clip_ratio": ratio})
    plan = SD.plan(s)
    reference = dpsgd.mechanism.plan(spec(sigma=noise_scale, epochs=2, options={}))
    assert plan.epsilon_certified == pytest.approx(reference.epsilon_certified, rel=1e-9)
    assert plan.extra["sensitivity"] == pytest.approx(1 / noise_scale)


@settings(max_examples=200, deadline=None)
@given(ratio=st.floats(0.05, 4.0), c=st.floats(0.1, 3.0), seed=st.integers(0, 2**31 - 1))
def test_projection_sensitivity_bound(ratio, c, seed):
    """|P(S + v) - P(S)| <= min(c, 2c') for the projection P onto the c'-ball and any |v| <= c."""
    rng = np.random.default_rng(seed)
    bound = ratio * c

    s = rng.standard_normal(6) * rng.uniform(0, 3 * (bound + c))
    v = rng.standard_normal(6)
    v *= c * rng.uniform(0, 1) / np.linalg.norm(v)
    gap = np.linalg.norm(_project(s + v, bound) - _project(s, bound))
    assert gap <= sd.sensitivity(ratio) * c * (1 + 1e-9) + 1e-12


def _project(x: np.ndarray, bound: float) -> np.ndarray:
    return x * min(1.0, bound / max(float(np.linalg.norm(x)), 1e-300))


@pytest.mark.parametrize("ratio", [0.1, 0.3, 0.5, 0.8, 3.0])
def test_projection_sensitivity_bound_is_tight(ratio):
    """c' >= c/2: S = -(c/2)u, S + v = (c/2)u stay inside the ball (gap c); c >= 2c': S = c'u, S + v is
    projected to -c'u (gap 2c')."""
    c, u = 1.0, np.eye(3)[0]
    bound = ratio * c
    s, v = (-(c / 2) * u, c * u) if 2 * bound >= c else (bound * u, -c * u)
    gap = np.linalg.norm(_project(s + v, bound) - _project(s, bound))
    assert gap == pytest.approx(sd.sensitivity(ratio) * c)


def test_certified_calibration_hits_the_target_with_the_reference_accountant():
    plan = SD.plan(spec(epsilon=2.0, calibration="certified", epochs=2,
                        options={"num_params": 10_000, "batch_clip_ratio": 1.0}))
    assert 0.97 * 2.0 <= plan.epsilon_certified <= 2.0 + 1e-9
    assert plan.effective_event == dpsgd.mechanism.plan(spec(epochs=2, sigma=plan.sigma, options={})).effective_event
    # above the Thm-6 cliff the paper claims far less than the certificate
    assert plan.extra["shuffled"] and plan.epsilon_claimed < plan.epsilon_certified / 10


def test_shuffle_off_claims_the_gaussian_and_is_never_below_the_certificate():
    plan = SD.plan(spec(epsilon=1.0, options={"num_params": 10_000, "shuffle": False}))
    assert plan.extra["claim_dim"] == 1 and not plan.extra["shuffled"]
    assert plan.epsilon_certified <= plan.epsilon_claimed + 1e-9


def test_claim_dimension_comes_from_the_model_then_the_option_then_the_audit_default():
    assert SD.plan(spec(sigma=1.0, model_dim=4321, options={})).extra["claim_dim"] == 4321
    assert SD.plan(spec(sigma=1.0, model_dim=4321, options={"num_params": 4321})).extra["claim_dim"] == 4321
    with pytest.raises(ValueError, match="contradicts"):
        SD.plan(spec(sigma=1.0, model_dim=4321, options={"num_params": 10}))
    assert SD.plan(spec(sigma=1.0, options={"num_params": 77})).extra["claim_dim"] == 77
    default = SD.plan(spec(sigma=1.0, options={}))
    assert default.extra["claim_dim"] == sd.AUDIT_DIM and default.extra["num_params_source"] == "audit default"
    claimed_at = [SD.plan(spec(sigma=1.0, model_dim=d, options={})).epsilon_claimed for d in (100, 10**4, 10**6)]
    assert claimed_at[0] > claimed_at[1] > claimed_at[2]  # Thm 6 claims more privacy as d grows


def test_options_are_validated():
    with pytest.raises(ValueError, match="shuffled-dpsgd: unknown option"):  # parsed as every mechanism's are
        SD.plan(spec(sigma=1.0, options={"num_params": 10, "batch_clip_raito": 2}))
    with pytest.raises(ValueError, match="batch_clip_ratio"):
        SD.plan(spec(sigma=1.0, options={"num_params": 10, "batch_clip_ratio": 0}))
    assert mechanisms.get("shuffled-dpsgd") is sd.mechanism


# ---- audit hooks -----------------------------------------------------------------------------------

def test_privatize_step_clips_the_sum_adds_declared_noise_and_permutes_rows():
    rng = np.random.default_rng(0)
    sums = np.tile(np.arange(1.0, 51.0), (4, 1))  # norm ~ 208 >> c' = 2
    clipped_norm = np.linalg.norm(SD.privatize_step(sums, 1e-12, 1.0, rng, batch_clip_ratio=2.0,
                                                    flat_permutation="none"), axis=1)
    assert np.allclose(clipped_norm, 2.0)
    released = SD.privatize_step(sums, 1e-12, 1.0, rng, batch_clip_ratio=2.0)
    expected = np.sort(sums[0] * 2.0 / np.linalg.norm(sums[0]))
    assert np.allclose(np.sort(released, axis=1), expected) and not np.allclose(released[0], released[1])
    noise = SD.privatize_step(np.zeros((200, 1000)), 1.5, 0.5, rng, batch_clip_ratio=16.0)
    plan = SD.plan(spec(sigma=1.5, options={"num_params": 1000, "batch_clip_ratio": 16.0}))
    declared = plan.parts.noise_multiplier(1.5)
    assert noise.std() == pytest.approx(declared * 0.5, rel=0.01)


def test_claimed_step_curve_is_the_gaussian_at_d1_and_claims_more_than_the_truth_for_large_d():
    from mechanisms.auditing import tradeoff

    sigma = 1.2
    gaussian = SD.claimed_step_tradeoff(sigma, {"shuffle": False})
    for curve in gaussian.curves:
        assert curve.epsilon == pytest.approx(tradeoff.gaussian_epsilon(1 / sigma, curve.delta), rel=1e-6, abs=1e-9)
    shuffled = SD.claimed_step_tradeoff(sigma, {"num_params": 10**6, "batch_clip_ratio": 1.0})
    alpha = np.linspace(1e-4, 0.5, 200)
    truth = tradeoff.Gaussian(1 / sigma)(alpha)  # one step: the certified curve
    assert np.max(shuffled(alpha) - truth) > 0.05  # the claim says tests this good cannot exist; they do


def test_audit_refutes_the_per_step_claim():
    """The step audit at the paper's per-step sigma (epsilon_s = 0.198, d = dim = 1000, c' = 16c)."""
    from mechanisms.auditing import audit_step, step_spec

    options = {"num_params": 1000, "batch_clip_ratio": 16}
    sigma = fw.per_step_sigma(0.1976, 2.5e-7, 1000, 16)
    result = audit_step(SD, step_spec(sigma, 1e-5, options=options), samples=4000, dim=1000, workers=1)
    assert result.epsilon_claimed == pytest.approx(0.197, abs=2e-3)
    assert result.epsilon_certified > 10 * result.epsilon_claimed
    assert result.claim_status == "violated"
    assert {c.case for c in result.cases} == {"dirac", "lemma2-max"}
    assert next(c for c in result.cases if c.case == "lemma2-max").violated


# ---- make_private: batch clip, noise, permutation on a real Opacus run -----------------------------

class TinyBert(nn.Module):
    """A 2-block HF BERT classifier with Opacus-friendly (B, L) position and token-type ids."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel
        from transformers.utils import logging

        logging.set_verbosity_error()
        self.bert = BertModel(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, max_position_embeddings=16), add_pooling_layer=False)
        self.head = nn.Linear(32, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1]).expand(ids.shape[0], -1).contiguous()
        hidden = self.bert(input_ids=ids, position_ids=positions, token_type_ids=torch.zeros_like(ids))
        return self.head(hidden.last_hidden_state[:, 0])


N = 128


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 50, (N, 8), generator=gen), torch.randint(0, 2, (N,), generator=gen)


def run(steps: int = 20, *, mode: str = "hooks", ratio: float = 4.0, use_dpsgd: bool = False,
        permute: bool = True, **kw) -> tuple[torch.Tensor, nn.Module, object]:
    """`steps` DP-Adam steps (sigma 0.5, c 0.1, Poisson q = 1/8) from fixed seeds; logits on 32 inputs.

    `permute=False` runs the same plan without its post-processing: the unshuffled twin (the generic
    `private_training.make_private` with the plan's parts and no after-step)."""
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    model = TinyBert()
    ids, labels = _data()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    options = {"num_params": sd.trainable_params(model), "batch_clip_ratio": ratio, "permutation_seed": 3} | kw
    base = dict(sigma=0.5, dataset_size=N, batch_size=16, epochs=3, clip=0.1)
    common = dict(criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(2), grad_sample_mode=mode,
                  noise_generator=torch.Generator().manual_seed(4))
    data = TensorDataset(ids, labels)
    if use_dpsgd:
        reference = dpsgd.mechanism
        training = reference.make_private(model, optimizer, data, reference.plan(spec(**base, options={})), **common)
    elif permute:
        training = SD.make_private(model, optimizer, data, SD.plan(spec(**base, options=options)), **common)
    else:
        training = private_training.make_private(model, optimizer, data, SD.plan(spec(**base, options=options)),
                                                 **common)
    module, dp_optimizer, dp_loader, criterion = training
    done = 0
    while done < steps:
        for xb, yb in dp_loader:
            dp_optimizer.zero_grad(set_to_none=True)
            criterion(module(xb), yb).backward()
            dp_optimizer.step()
            done += 1
            if done == steps:
                break
    model.eval()
    with torch.no_grad():
        return model(ids[:32]), model, dp_optimizer


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_shuffled_run_equals_its_unshuffled_twin_with_canonical_noise(mode):
    from mechanisms.framework import integrity

    shuffled, model, optimizer = run(mode=mode)
    twin, twin_model, twin_optimizer = run(mode=mode, permute=False)
    assert optimizer.post_processing.shuffles == 20 and twin_optimizer.after_step is None
    # every step's checks pass although each permutation gives the weights new storage (the shadow re-reads them)
    assert integrity.certify(optimizer.guard.findings()) is None
    assert (shuffled - twin).abs().max().item() <= 1e-5
    w, w_twin = (m.bert.encoder.layer[0].intermediate.dense.weight for m in (model, twin_model))
    assert (w - w_twin).abs().max().item() > 0.05  # same function, different (permuted) weights


def test_fresh_noise_agrees_only_in_distribution_and_the_clip_binds():
    twin, _, _ = run(steps=10, permute=False)
    fresh, _, _ = run(steps=10, canonical_noise=False)
    assert (fresh - twin).abs().max().item() > 1e-4
    unclipped, _, _ = run(steps=10, permute=False, ratio=1e9)
    assert (unclipped - twin).abs().max().item() > 1e-4  # c' = 4c binds on these sums


def test_noise_and_clip_reduce_to_dpsgd_when_the_batch_clip_never_binds():
    ours, _, _ = run(steps=10, permute=False, ratio=1e9)
    plain, _, _ = run(steps=10, ratio=1e9, use_dpsgd=True)
    assert torch.allclose(ours, plain, atol=1e-6)


def test_batch_clip_noise_clips_the_flat_summed_gradient():
    sums = [torch.full((1, 3, 4), 2.0), torch.full((1, 5), -3.0)]
    released = sd.noise_part(0.5, 4.0).release(sums, 0.0, None)
    norm = math.sqrt(sum(float(r.pow(2).sum()) for r in released))
    assert norm == pytest.approx(2.0, rel=1e-5)  # c' = 4 x 0.5
    scales = torch.cat([(r / s).reshape(-1) for r, s in zip(released, sums, strict=True)])
    assert torch.allclose(scales, scales[0]) and 0 < scales[0] < 1  # one factor for the whole flat vector


def test_make_private_refuses_what_it_cannot_honour():
    model = TinyBert()
    data = TensorDataset(*_data())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kw = dict(criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0))
    plan = SD.plan(spec(sigma=1.0, dataset_size=N, batch_size=16, options={"num_params": 123}))
    with pytest.raises(ValueError, match="num_params=123"):
        SD.make_private(model, optimizer, data, plan, **kw)
    mlp = nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2))
    plan = SD.plan(spec(sigma=1.0, dataset_size=N, batch_size=16, options={"num_params": 46}))
    with pytest.raises(ValueError, match="no trainable BERT"):
        SD.make_private(mlp, torch.optim.SGD(mlp.parameters(), lr=0.1), data, plan, **kw)
    plan = SD.plan(spec(sigma=1.0, dataset_size=N, batch_size=16, options={"num_params": sd.trainable_params(model)}))
    with pytest.raises(ValueError, match="accounts for 128 examples"):
        SD.make_private(model, optimizer, TensorDataset(*(t[:100] for t in _data())), plan, **kw)


def test_fallback_trains_as_plain_dpsgd_without_a_shuffler():
    mlp = nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2))
    plan = SD.plan(spec(epsilon=1.0, dataset_size=N, batch_size=16, options={"num_params": 3, "batch_clip_ratio": 1e3}))
    assert not plan.extra["shuffled"] and plan.parts.post_processing is None
    data = TensorDataset(torch.randn(N, 8), torch.randint(0, 2, (N,)))
    training = SD.make_private(mlp, torch.optim.SGD(mlp.parameters(), lr=0.1), data, plan,
                               criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0))
    assert training.optimizer.post_processing is None and training.optimizer.noise_multiplier == plan.sigma


def test_run_trial_end_to_end_through_the_worker():
    """As `privbench sweep run` runs it: d from the worker, calibrated by the paper, certified by PLD, audited."""
    from workers.trial import run_trial

    warnings.filterwarnings("ignore")
    record = run_trial(dict(
        sweep="t", trial_key="k", dataset="digits", model="vit-tiny", mechanism="shuffled-dpsgd", epsilon=1.0,
        delta=1e-5, seed=0, train=dict(epochs=1, batch_size=32, lr=1e-3, optimizer="adam", max_train_examples=128),
        mechanism_options={"batch_clip_ratio": 16}, audit={"mode": "step", "samples": 2000},
        resources={"cpus": 1}))
    assert record["status"] == "finished", record.get("traceback")
    privacy = record["privacy"]
    assert privacy["extra"]["num_params_source"] == "model_dim" and privacy["extra"]["claim_dim"] > 500_000
    assert privacy["epsilon_claimed"] == pytest.approx(1.0, rel=1e-6)
    assert privacy["epsilon_certified"] > privacy["epsilon_claimed"]
    assert privacy["claim_status"] in ("overclaimed", "violated") and privacy["extra"]["shuffled"]
