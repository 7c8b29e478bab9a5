"""Shuffled DP-SGD (Yang, Ji, Xiang 2024; seeds 000/001, research/seed_000_shuffling.md).

DP-SGD plus two parts, composed onto `dpsgd.make_private` rather than copied:

- noise (`batch_clip_noise`): the sum of per-sample-clipped gradients is clipped again, as one flat
  vector, to c' = `batch_clip_ratio` * c (Alg. 1 line 12), then N(0, (sigma c)^2) is added;
- after every update (`Shuffler`): a fresh coupled random permutation of every trainable transformer
  block's permutation-invariant weights, applied to the optimizer state too (`permutation.py`).

Claimed epsilon: the paper's Fenton-Wilkinson condition (Thm 6) per step, advanced composition and
amplification by subsampling across steps (`accountants/fenton_wilkinson.py`), with d = the model's
trainable parameter count (`spec.model_dim`, which the worker fills, or option `num_params`). When that
sigma is not below the same pipeline's unshuffled sigma_0, Alg. 1 falls back to plain DP-SGD at sigma_0
(no batch clip, no permutation).

Certified epsilon: a permutation drawn independently of the data is post-processing of the noisy
update, so it proves nothing; the reference accountant composes plain subsampled Gaussian steps.
The batch clip enters through the sensitivity. For add/remove neighbours the clipped sums differ by
v with |v| <= c; projection onto the ball of radius c' is 1-Lipschitz, so the projected sums differ
by at most c, and both lie in that ball, so by at most 2c' (tight: S = c'u, S' = (c' - c)u with
c >= 2c'). Sensitivity = min(c, 2c') and the effective noise multiplier is
sigma / min(1, 2 batch_clip_ratio): batch clipping with ratio >= 1/2 gives no certified gain.
With fixed-size batches (replace-one neighbours) the true factor relative to plain DP-SGD is
min(1, ratio) <= min(1, 2 ratio), so using the add/remove factor there is conservative.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from mechanisms import dpsgd
from mechanisms.accountants import DpsgdEvents, calibrate_sigma, epsilon
from mechanisms.accountants import fenton_wilkinson as fw
from mechanisms.auditing import tradeoff
from mechanisms.auditing.cases import AuditCase
from mechanisms.permutation import BlockLayout, CanonicalFrame, permute_
from mechanisms.permutation_flat import FLAT_PERMUTATIONS, FlatBlock, permute_rows
from mechanisms.permutation_hf import find_blocks
from mechanisms.plan import PrivacyPlan, PrivacySpec

ID = "shuffled-dpsgd"
CLAIMED_BY = "fenton-wilkinson (Thm 6 + advanced composition + subsampling)"
DEFAULT_BATCH_CLIP_RATIO = 16.0  # not reported by the paper; fits its Fig. 3 for ViT/GPT-2 (digest 3.6)
AUDIT_DIM = 1000  # = `privbench audit --dim` and the trial audit's default dimension
CLAIM_DELTAS = (0.5, 0.2, 0.1, 0.05, 0.02, 1e-2, 5e-3, 2e-3, *(10.0 ** -k for k in range(3, 13)))


@dataclasses.dataclass(frozen=True)
class Options:
    """The grid's `mechanism_options[shuffled-dpsgd]`, validated once (unknown keys are errors).

    num_params: d of Thm 6, the number of trainable parameters (the paper's choice). Only needed when
        the spec has no `model_dim` (a standalone plan, or a one-step audit of a vector of that many
        coordinates; default AUDIT_DIM); `make_private` checks it against the model it wraps.
    batch_clip_ratio: c'/c of the batch clip (the paper never reports c').
    delta_split: share of delta given to advanced composition's slack (the paper does not say).
    shuffle: False runs Alg. 1's unshuffled branch: plain DP-SGD claimed at d = 1.
    canonical_noise: draw noise in the unpermuted frame so a run equals its unshuffled twin step
        for step (same law either way: the permutation is independent of the i.i.d. noise).
    permutation_seed: seed of the permutation generator; None draws one from the OS (secrets).
    shared_value_permutation: the paper's P_2 shared by all heads (False: one per head, also valid).
    flat_permutation, flat_block: the group `privatize_step` applies to flat vectors (audit only).
    """

    num_params: int | None = None
    batch_clip_ratio: float = DEFAULT_BATCH_CLIP_RATIO
    delta_split: float = 0.5
    shuffle: bool = True
    canonical_noise: bool = True
    permutation_seed: int | None = None
    shared_value_permutation: bool = True
    flat_permutation: str = "full"
    flat_block: tuple[int, int, int] = (2, 4, 16)  # heads, head_dim, ffn of FlatBlock

    def __post_init__(self) -> None:
        if self.num_params is not None and (isinstance(self.num_params, bool) or int(self.num_params) < 1):
            raise ValueError(f"num_params must be an integer >= 1, got {self.num_params}")
        if not (isinstance(self.batch_clip_ratio, (int, float)) and self.batch_clip_ratio > 0
                and math.isfinite(self.batch_clip_ratio)):
            raise ValueError(f"batch_clip_ratio must be a positive finite number, got {self.batch_clip_ratio}")
        if not 0 < self.delta_split < 1:
            raise ValueError(f"delta_split must lie in (0, 1), got {self.delta_split}")
        if self.flat_permutation not in FLAT_PERMUTATIONS:
            raise ValueError(f"flat_permutation must be one of {FLAT_PERMUTATIONS}, got {self.flat_permutation!r}")
        if len(tuple(self.flat_block)) != 3:
            raise ValueError(f"flat_block must be [heads, head_dim, ffn], got {self.flat_block}")

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None) -> Options:
        options = dict(options or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown {ID} option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "flat_block" in options:
            options["flat_block"] = tuple(int(x) for x in options["flat_block"])
        if options.get("num_params") is not None:
            options["num_params"] = int(options["num_params"])
        return cls(**options)

    def claim_dim(self, model_dim: int | None = None) -> tuple[int, str]:
        """(d in Thm 6, where it came from): 1 without shuffling (the Gaussian), else the model's size.

        Precedence: the spec's `model_dim` (counted from the model by the worker), option `num_params`
        (which must agree with it when both are given), else AUDIT_DIM, the auditor's default dimension:
        a one-step audit releases an AUDIT_DIM-coordinate vector, and Thm 6 at that d is the paper's
        claim for it. `make_private` refuses a d that differs from the model's trainable parameters.
        """
        if not self.shuffle:
            return 1, "no shuffle"
        if model_dim is not None:
            if self.num_params is not None and self.num_params != model_dim:
                raise ValueError(f"option num_params={self.num_params} contradicts the model's {model_dim} "
                                 "trainable parameters; drop the option")
            return int(model_dim), "model_dim"
        if self.num_params is not None:
            return self.num_params, "num_params"
        return AUDIT_DIM, "audit default"


def sensitivity(batch_clip_ratio: float | None) -> float:
    """Add/remove L2 sensitivity of the released sum in units of c: min(1, 2 c'/c) (module docstring)."""
    return 1.0 if batch_clip_ratio is None else min(1.0, 2.0 * batch_clip_ratio)


def certified_events(spec: PrivacySpec, batch_clip_ratio: float | None) -> DpsgdEvents:
    """The noise really added: subsampled Gaussian steps at sigma / sensitivity (no credit for shuffling)."""
    return DpsgdEvents(spec.sample_rate, spec.steps, spec.sampler, spec.dataset_size,
                       sigma_scale=1.0 / sensitivity(batch_clip_ratio))


def _claimed_epsilon(sigma: float, spec: PrivacySpec, opts: Options, dim: int) -> float:
    return fw.epsilon(sigma, spec.sample_rate, spec.steps, spec.delta, dim,
                      batch_clip_ratio=opts.batch_clip_ratio, delta_split=opts.delta_split)


def plan(spec: PrivacySpec) -> PrivacyPlan:
    """Sigma (explicit, or for the target under `claimed` / `certified`), and the two epsilons."""
    opts = Options.parse(spec.options)
    dim, source = opts.claim_dim(spec.model_dim)
    extra: dict[str, Any] = {"num_params": dim if dim > 1 else opts.num_params, "num_params_source": source,
                             "delta_split": opts.delta_split}
    if spec.sigma is not None:
        sigma, shuffled = spec.sigma, opts.shuffle
    elif spec.calibration == "claimed":
        cal = fw.calibrate(spec.epsilon, spec.delta, spec.sample_rate, spec.steps, dim,
                           batch_clip_ratio=opts.batch_clip_ratio, delta_split=opts.delta_split)
        sigma, shuffled = cal.sigma, cal.shuffled
        extra |= {"sigma_shuffled": cal.sigma_shuffled, "sigma_unshuffled": cal.sigma_unshuffled}
    else:
        sigma = calibrate_sigma(certified_events(spec, opts.batch_clip_ratio if opts.shuffle else None),
                                spec.epsilon, spec.delta, spec.accountant).sigma
        shuffled = opts.shuffle
    ratio = opts.batch_clip_ratio if shuffled else None  # the fallback branch does not batch-clip
    events = certified_events(spec, ratio)
    claimed = _claimed_epsilon(sigma, spec, opts, dim if shuffled else 1)
    certified = epsilon(events(sigma), spec.delta, spec.accountant)
    extra |= {"shuffled": shuffled, "batch_clip_ratio": ratio, "sensitivity": sensitivity(ratio),
              "claim_dim": dim if shuffled else 1}
    if spec.epsilon is not None and spec.calibration == "claimed" and spec.sigma is None:
        sound = calibrate_sigma(events, spec.epsilon, spec.delta, spec.accountant).sigma
        extra |= {"sigma_certified_for_target": sound, "sigma_ratio_certified_to_claimed": sound / sigma}
    notes = ("Alg. 1 fallback: shuffled sigma not below sigma_0, plain DP-SGD" if not shuffled else
             "claimed epsilon is the paper's Fenton-Wilkinson approximation; no proven privacy from the shuffle")
    return PrivacyPlan(
        mechanism=ID, sigma=sigma, sample_rate=spec.sample_rate, steps=spec.steps, delta=spec.delta,
        sampler=spec.sampler, accountant=spec.accountant, claimed_by=CLAIMED_BY, epsilon_claimed=claimed,
        epsilon_certified=certified, effective_event=events(sigma), notes=notes, extra=extra,
    )


# ---- training: the two parts composed onto dpsgd.make_private ------------------------------------

def batch_clip_noise(batch_clip_ratio: float | None, frame: CanonicalFrame | None = None) -> dpsgd.NoiseAdder:
    """Opacus `add_noise` replacement: clip the flat summed gradient to c' = ratio * c, add N(0, (sigma c)^2).

    Bound to the DPOptimizer (`self`): reads `p.summed_grad`, writes `p.grad`; the std is
    `noise_multiplier * max_grad_norm` and the draw is Opacus' own `_generate_noise` (same generator,
    same order, secure mode honoured), mapped through `frame` when noise is drawn canonically.
    """
    from opacus.optimizers.optimizer import _check_processed_flag, _generate_noise, _mark_as_processed

    def add_noise(self: Any) -> None:
        params = self.params
        sums = [p.summed_grad for p in params]
        for s in sums:
            _check_processed_flag(s)
        scale: torch.Tensor | None = None
        if batch_clip_ratio is not None and sums:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(s) for s in sums]))
            scale = (batch_clip_ratio * self.max_grad_norm / (norm + 1e-6)).clamp(max=1.0)
        std = self.noise_multiplier * self.max_grad_norm
        for p, s in zip(params, sums, strict=True):
            noise = _generate_noise(std=std, reference=s, generator=self.generator, secure_mode=self.secure_mode)
            if frame is not None:
                noise = frame.to_current(p, noise)
            # in place on the fresh noise tensor: no gradient-sized temporary (peak memory as Opacus')
            grad = noise.add_(s) if scale is None else noise.addcmul_(s, scale)
            p.grad = grad.view_as(p)
            _mark_as_processed(s)

    return add_noise


class Shuffler:
    """`after_step`: one fresh coupled permutation of every block per update; counts its own time."""

    def __init__(self, layouts: list[BlockLayout], generator: torch.Generator, *,
                 frame: CanonicalFrame | None = None, shared_value: bool = True) -> None:
        self.layouts, self.generator, self.frame, self.shared_value = layouts, generator, frame, shared_value
        self.shuffles, self.seconds = 0, 0.0

    def __call__(self, module: Any, optimizer: Any) -> None:
        start = time.perf_counter()
        permute_(self.layouts, self.generator, optimizer=optimizer, frame=self.frame,
                 shared_value=self.shared_value)
        self.seconds += time.perf_counter() - start
        self.shuffles += 1


def trainable_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def make_private(model: Any, optimizer: Any, loader: Any, plan: PrivacyPlan, *, criterion: Any,
                 clip: float = 1.0, grad_sample_mode: str = "hooks", noise_generator: Any = None,
                 permute: bool | None = None, **options: Any) -> tuple[Any, Any, Any, Any]:
    """Wrap like `dpsgd.make_private`, with the batch clip and the per-update permutation.

    `options` are the grid's mechanism options (checked against the plan, which already used them);
    other keywords (e.g. Opacus `clipping`) pass through to dpsgd. `permute=False` keeps everything but
    the permutation: the unshuffled twin for equality tests and overhead measurements. The returned
    optimizer carries the `Shuffler` as `optimizer.shuffler` (None in the fallback branch).
    """
    mine = {k: v for k, v in options.items() if k in {f.name for f in dataclasses.fields(Options)}}
    passthrough = {k: v for k, v in options.items() if k not in mine}
    opts = Options.parse(mine)
    extra = plan.extra
    if "batch_clip_ratio" in mine and extra.get("shuffled") and opts.batch_clip_ratio != extra["batch_clip_ratio"]:
        raise ValueError(f"batch_clip_ratio {opts.batch_clip_ratio} differs from the plan's "
                         f"{extra['batch_clip_ratio']}")
    claimed_d = extra.get("claim_dim", 1)
    if claimed_d > 1 and claimed_d != trainable_params(model):
        raise ValueError(f"the plan claims epsilon for num_params={claimed_d} ({extra.get('num_params_source')}), "
                         f"but the model trains {trainable_params(model)} parameters: plan with "
                         "PrivacySpec(model_dim=...) or option num_params")
    common = dict(criterion=criterion, clip=clip, grad_sample_mode=grad_sample_mode,
                  noise_generator=noise_generator, **passthrough)
    if not extra.get("shuffled", False):  # Alg. 1 fallback (or shuffle: false): plain DP-SGD
        wrapped = dpsgd.make_private(model, optimizer, loader, plan, **common)
        wrapped[1].shuffler = None
        return wrapped
    layouts = find_blocks(model)
    do_permute = opts.shuffle if permute is None else permute
    if do_permute and not layouts:
        raise ValueError(f"{ID}: no trainable BERT/RoBERTa/ViT/GPT-2 block in {type(model).__name__} "
                         "(supported: mechanisms.permutation_hf.LAYOUTS)")
    frame = CanonicalFrame() if opts.canonical_noise else None
    shuffler = None
    if do_permute:
        seed = opts.permutation_seed if opts.permutation_seed is not None else secrets.randbits(63)
        shuffler = Shuffler(layouts, torch.Generator().manual_seed(seed), frame=frame,
                            shared_value=opts.shared_value_permutation)
    wrapped = dpsgd.make_private(model, optimizer, loader, plan, add_noise=batch_clip_noise(
        extra["batch_clip_ratio"], frame), after_step=shuffler, **common)
    wrapped[1].shuffler = shuffler
    return wrapped


# ---- auditing hooks (mechanisms/auditing/hooks.py) ------------------------------------------------

def privatize_step(sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator,
                   **options: Any) -> np.ndarray:
    """One release per row: batch clip to c', add N(0, (sigma clip)^2), permute (P(y + z), as Alg. 1).

    The permutation acting on a flat vector is option `flat_permutation`: `full` (S_d, the analysis'
    idealisation, default), `blocks` (the real coupled group of synthetic blocks, `FlatBlock`), `none`.
    """
    opts = Options.parse({k: v for k, v in options.items() if k in {f.name for f in dataclasses.fields(Options)}})
    sums = np.atleast_2d(np.asarray(sums, dtype=np.float64))
    bound = opts.batch_clip_ratio * clip
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    clipped = sums * np.minimum(1.0, bound / np.maximum(norms, 1e-300))
    released = clipped + rng.standard_normal(sums.shape) * (sigma * clip)
    if not opts.shuffle:
        return released
    return permute_rows(released, rng, opts.flat_permutation, FlatBlock(*opts.flat_block))


def claimed_step_tradeoff(sigma: float, **options: Any) -> tradeoff.TradeOff | None:
    """The paper's per-step claim: f_{eps(delta), delta} from Thm 6 at each delta, as one envelope.

    d is option `num_params`, default AUDIT_DIM (= the auditor's default --dim): the claim for the
    audited d-coordinate vector. Auditing another dimension, pass num_params = that dimension.
    """
    opts = Options.parse(options)
    dim, _ = opts.claim_dim()
    curves = []
    for delta in CLAIM_DELTAS:
        eps = fw.per_step_epsilon(sigma, delta, dim, opts.batch_clip_ratio)
        if math.isfinite(eps):
            curves.append(tradeoff.ApproxDP(eps, delta))
    return tradeoff.Envelope(tuple(curves)) if curves else None


def audit_cases(dim: int, clip: float, rng: np.random.Generator, **options: Any) -> list[AuditCase]:
    """Lemma 2's worst case, attacked with the permutation-invariant max statistic (digest 4.3).

    u = [(d-1), -1, ..., -1] / sqrt(d (d-1)); side A releases (c' - c) u, side B c' u (one extra example
    with clipped gradient c u); both lie inside the batch-clip ball, so the clip keeps their gap c.
    """
    opts = Options.parse(options)
    if dim < 2:
        return []
    u = np.full(dim, -1.0)
    u[0] = dim - 1.0
    u /= math.sqrt(dim * (dim - 1.0))
    bound = opts.batch_clip_ratio * clip
    return [AuditCase("lemma2-max", canary=clip * u, base=(bound - clip) * u,
                      statistic=lambda released: np.max(released, axis=1),
                      note="paper's worst-case pair (Lemma 2), max over coordinates: invariant to any permutation")]


__all__ = ["ID", "Options", "Shuffler", "audit_cases", "batch_clip_noise", "certified_events",
           "claimed_step_tradeoff", "make_private", "plan", "privatize_step", "sensitivity"]
