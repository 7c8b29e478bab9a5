"""Shuffled DP-SGD (Yang, Ji, Xiang 2024; arXiv 2407.15414).

DP-SGD plus two parts, a post-processing mechanism (`PostProcessingMechanism`: the template runs DP-SGD's
step from the parts, then the declared post-processing):

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
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from mechanisms.accounting.validation import require_fraction
from mechanisms.catalog.shuffled_dpsgd.permutation_flat import FLAT_PERMUTATIONS, FlatBlock, permute_rows
from mechanisms.framework.mechanism import AfterStepPart, Calibrated, Claim, PostProcessingMechanism
from mechanisms.parts.clipping import FlatClipping

if TYPE_CHECKING:
    import torch

    from mechanisms.auditing.cases import AuditCase
    from mechanisms.auditing.tradeoff import TradeOff
    from mechanisms.catalog.shuffled_dpsgd.permutation import BlockLayout, CanonicalFrame
    from mechanisms.parts.noise_addition import NoiseAddition, NoiseMap
    from mechanisms.parts.plan import Parts, PrivacyPlan, PrivacySpec

ID = "shuffled-dpsgd"
CLAIMED_BY = "fenton-wilkinson (Thm 6 + advanced composition + subsampling)"
DEFAULT_BATCH_CLIP_RATIO = 16.0  # not reported by the paper; fits its Fig. 3 for ViT/GPT-2
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
        require_fraction("delta_split", self.delta_split)
        if self.flat_permutation not in FLAT_PERMUTATIONS:
            raise ValueError(f"flat_permutation must be one of {FLAT_PERMUTATIONS}, got {self.flat_permutation!r}")
        if len(tuple(self.flat_block)) != 3:
            raise ValueError(f"flat_block must be [heads, head_dim, ffn], got {self.flat_block}")

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
    """Add/remove L2 sensitivity of the released sum in units of c, as the noise part declares it."""
    from dp_accounting import NeighboringRelation  # lazy: heavy (dp_accounting)

    return noise_part(1.0, batch_clip_ratio).sensitivity(FlatClipping(1.0), NeighboringRelation.ADD_OR_REMOVE_ONE)


def noise_part(clip: float, batch_clip_ratio: float | None) -> NoiseAddition:
    """The release: batch clip to c' = ratio * c then Gaussian noise, or plain Gaussian noise (fallback)."""
    from mechanisms.parts.noise_addition import BatchClippedGaussian, GaussianNoise  # lazy: keeps the registries light

    if batch_clip_ratio is None:
        return GaussianNoise(clip)
    return BatchClippedGaussian(clip, batch_clip_ratio * clip)


def _claimed_epsilon(sigma: float, spec: PrivacySpec, opts: Options, dim: int) -> float:
    from mechanisms.accounting import fenton_wilkinson as fw  # lazy: keeps the registries light

    return fw.epsilon(sigma, spec.sample_rate, spec.steps, spec.delta, dim,
                      batch_clip_ratio=opts.batch_clip_ratio, delta_split=opts.delta_split)


class ShuffledDpSgd(PostProcessingMechanism):
    ID = ID
    references = ("arXiv:2407.15414",)
    Options = Options
    audit_coordinatewise = False  # the permutation mixes coordinates

    def parts(self, spec: PrivacySpec, options: Options) -> Parts:
        from mechanisms.parts.plan import Parts  # lazy: keeps the registries light

        ratio = options.batch_clip_ratio if options.shuffle else None
        return Parts(spec.batch_selection, FlatClipping(spec.clip), noise_part(spec.clip, ratio),
                     post_processing="coupled random permutation of transformer blocks" if options.shuffle else None)

    def claimed_sigma(self, spec: PrivacySpec, options: Options, parts: Parts) -> Calibrated:
        """The paper's sigma for the target (Thm 6 + advanced composition + subsampling). Alg. 1 falls back to
        plain DP-SGD at sigma_0 when the shuffled sigma is not below it: the plan then runs with
        `shuffle: false` (no batch clip, no permutation), which is what its parts describe. The certified
        sigma for the same target is recorded beside it."""
        from mechanisms.accounting import fenton_wilkinson as fw  # lazy: keeps the registries light

        dim, _ = options.claim_dim(spec.model_dim)
        cal = fw.calibrate(spec.epsilon, spec.delta, spec.sample_rate, spec.steps, dim,
                           batch_clip_ratio=options.batch_clip_ratio, delta_split=options.delta_split)
        runs = dataclasses.replace(options, shuffle=options.shuffle and cal.shuffled)
        sound = self.certified_sigma(spec, self.parts(spec, runs))
        return Calibrated(cal.sigma, runs, {"sigma_shuffled": cal.sigma_shuffled,
                                            "sigma_unshuffled": cal.sigma_unshuffled,
                                            "sigma_certified_for_target": sound,
                                            "sigma_ratio_certified_to_claimed": sound / cal.sigma})

    def claim(self, sigma: float, spec: PrivacySpec, options: Options, parts: Parts, certified: float | None) -> Claim:
        """The paper's epsilon for `sigma`: Thm 6 at d = the model's trainable parameters when shuffling, at
        d = 1 (the Gaussian) on Alg. 1's unshuffled branch."""
        dim, source = options.claim_dim(spec.model_dim)
        ratio = options.batch_clip_ratio if options.shuffle else None
        claim_dim = dim if options.shuffle else 1
        extra = {"num_params": dim if dim > 1 else options.num_params, "num_params_source": source,
                 "delta_split": options.delta_split, "shuffled": options.shuffle, "batch_clip_ratio": ratio,
                 "sensitivity": sensitivity(ratio), "claim_dim": claim_dim}
        notes = ("Alg. 1 fallback: shuffled sigma not below sigma_0, plain DP-SGD" if not options.shuffle else
                 "claimed epsilon is the paper's Fenton-Wilkinson approximation; no proven privacy from the shuffle")
        return Claim(_claimed_epsilon(sigma, spec, options, claim_dim), CLAIMED_BY, extra, notes)

    def post_processing_part(self, module: torch.nn.Module, plan: PrivacyPlan, options: Options,
                             generator: torch.Generator) -> AfterStepPart:
        """The coupled permutation after each update (post-processing), its generator seeded from the trial's
        unless `permutation_seed` is set; with `canonical_noise` the noise is drawn in the unpermuted frame."""
        claimed_d = plan.extra.get("claim_dim", 1)
        if claimed_d > 1 and claimed_d != trainable_params(module):
            source = plan.extra.get("num_params_source")
            raise ValueError(f"the plan claims epsilon for num_params={claimed_d} ({source}), but the model "
                             f"trains {trainable_params(module)} parameters: plan with PrivacySpec(model_dim=...) "
                             "or option num_params")
        if not options.shuffle:
            return AfterStepPart()
        import torch  # lazy: heavy (torch)

        from mechanisms.catalog.shuffled_dpsgd.permutation import CanonicalFrame  # lazy: keeps the registries light
        from mechanisms.catalog.shuffled_dpsgd.permutation_hf import find_blocks  # lazy: keeps the registries light

        layouts = find_blocks(module)
        if not layouts:
            raise ValueError(f"{ID}: no trainable BERT/RoBERTa/ViT/GPT-2 block in {type(module).__name__} "
                             "(supported: mechanisms.catalog.shuffled_dpsgd.permutation_hf.LAYOUTS)")
        frame = CanonicalFrame() if options.canonical_noise else None
        seed = options.permutation_seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
        shuffler = Shuffler(layouts, torch.Generator().manual_seed(seed), frame=frame,
                            shared_value=options.shared_value_permutation)

        def noise_map_for(params: list[torch.nn.Parameter]) -> NoiseMap | None:
            if frame is None:
                return None
            return lambda i, z: frame.to_current(params[i], z.reshape(params[i].shape)).reshape(z.shape)

        return AfterStepPart(shuffler, noise_map_for, shuffler)

    def post_process_release(self, released: np.ndarray, rng: np.random.Generator, options: Options) -> np.ndarray:
        """The audit's release (the training release: batch clip to c', add N(0, (sigma clip)^2)), then a
        permutation (P(y + z), as Alg. 1).

        The permutation acting on a flat vector is option `flat_permutation`: `full` (S_d, the analysis'
        idealisation, default), `blocks` (the real coupled group of synthetic blocks, `FlatBlock`), `none`.
        """
        if not options.shuffle:
            return released
        return permute_rows(released, rng, options.flat_permutation, FlatBlock(*options.flat_block))

    # ---- auditing hooks ---------------------------------------------------------------------------------

    def claimed_step_tradeoff(self, sigma: float, options: Mapping[str, Any]) -> TradeOff | None:
        """The paper's per-step claim: f_{eps(delta), delta} from Thm 6 at each delta, as one envelope.

        d is option `num_params`, default AUDIT_DIM (= the auditor's default --dim): the claim for the
        audited d-coordinate vector. Auditing another dimension, pass num_params = that dimension.
        """
        from mechanisms.accounting import fenton_wilkinson as fw  # lazy: keeps the registries light
        from mechanisms.auditing import tradeoff  # lazy: keeps the registries light

        opts = self.options(self.audit_options(options))
        dim, _ = opts.claim_dim()
        curves = []
        for delta in CLAIM_DELTAS:
            eps = fw.per_step_epsilon(sigma, delta, dim, opts.batch_clip_ratio)
            if math.isfinite(eps):
                curves.append(tradeoff.ApproxDP(eps, delta))
        return tradeoff.Envelope(tuple(curves)) if curves else None

    def audit_cases(self, dim: int, clip: float, rng: np.random.Generator,
                    options: Mapping[str, Any]) -> list[AuditCase]:
        """Lemma 2's worst case, attacked with the permutation-invariant max statistic.

        u = [(d-1), -1, ..., -1] / sqrt(d (d-1)); side A releases (c' - c) u, side B c' u (one extra example
        with clipped gradient c u); both lie inside the batch-clip ball, so the clip keeps their gap c.
        """
        from mechanisms.auditing.cases import AuditCase  # lazy: keeps the registries light

        opts = self.options(self.audit_options(options))
        if dim < 2:
            return []
        u = np.full(dim, -1.0)
        u[0] = dim - 1.0
        u /= math.sqrt(dim * (dim - 1.0))
        bound = opts.batch_clip_ratio * clip
        return [AuditCase("lemma2-max", canary=clip * u, base=(bound - clip) * u,
                          statistic=lambda released: np.max(released, axis=1),
                          note="paper's worst-case pair (Lemma 2), max over coordinates: invariant to any permutation")]


class Shuffler:
    """The post-processing part: one fresh coupled permutation of every block per update; counts its own time."""

    def __init__(self, layouts: list[BlockLayout], generator: torch.Generator, *,
                 frame: CanonicalFrame | None = None, shared_value: bool = True) -> None:
        self.layouts, self.generator, self.frame, self.shared_value = layouts, generator, frame, shared_value
        self.shuffles, self.seconds = 0, 0.0

    def __call__(self, optimizer: Any) -> None:
        from mechanisms.catalog.shuffled_dpsgd.permutation import permute_  # lazy: keeps the registries light

        start = time.perf_counter()
        permute_(self.layouts, self.generator, optimizer=optimizer, frame=self.frame,
                 shared_value=self.shared_value)
        self.seconds += time.perf_counter() - start
        self.shuffles += 1


def trainable_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


mechanism = ShuffledDpSgd()

__all__ = ["ID", "Options", "ShuffledDpSgd", "Shuffler", "mechanism", "noise_part", "sensitivity"]
