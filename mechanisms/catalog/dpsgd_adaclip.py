"""DP-SGD with adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021, arXiv 1905.03871): the clip
follows a private estimate of a quantile of the examples' gradient norms.

Each step releases two things on the same Poisson sample: the clipped gradient sum with noise
sigma * C_t (the bound in force), and the centred count of examples the clip left unchanged,
sum_i (b_i - 1/2), with noise `count_std`. The next bound is C_{t+1} = C_t exp(-lr (b~ - q)), kept within
[min_clip, max_clip], where b~ = released count / B + 1/2 is the noised unclipped fraction (B the
expected batch size) and q the target quantile: computed from released values only, it is post-processing.

Certified: one example moves the gradient sum by at most C_t and the centred count by 1/2, so the step is
one Gaussian at multiplier (sigma^-2 + (2 count_std)^-2)^-1/2 whatever the bound (Theorem 1 of the paper),
Poisson-subsampled and composed over the run. Calibration picks sigma for the gradient so that this
combined multiplier meets the target.

Opacus' `AdaClipDPOptimizer` (1.6) runs the same update but releases the plain count sum_i b_i, whose
sensitivity is 1, while accounting it at 1/2, and divides by the realised batch size, which Poisson sampling
keeps private. Given the same noise draws and a batch of the expected size the two clip trajectories are
equal (tested); otherwise privbench's is the one whose accounting holds.

Options (`mechanism_options: {dpsgd-adaclip: {...}}`; the grid's `clip` is the initial bound):
  target_quantile   q, the fraction of examples the clip should leave unclipped (default 0.5)
  clip_lr           the geometric learning rate of the bound (default 0.2)
  count_std         the unclipped count's noise std, in examples (default: expected batch size / 20)
  min_clip, max_clip  the bound's range (defaults 1e-3 and 1e3)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from mechanisms.framework.mechanism import Mechanism
from mechanisms.parts.clipping import AdaptiveClipping

if TYPE_CHECKING:
    import torch

    from mechanisms.parts.plan import Parts, PrivacyPlan, PrivacySpec
    from mechanisms.parts.releases import Released

ID = "dpsgd-adaclip"
COUNT_STD_PER_BATCH = 1 / 20  # Andrew et al.'s suggestion: sigma_b = expected batch size / 20


@dataclasses.dataclass(frozen=True)
class Options:
    target_quantile: float = 0.5
    clip_lr: float = 0.2
    count_std: float | None = None
    min_clip: float = 1e-3
    max_clip: float = 1e3

    def __post_init__(self) -> None:
        if not 0 < self.target_quantile < 1:
            raise ValueError(f"target_quantile must lie in (0, 1), got {self.target_quantile}")
        if not self.clip_lr >= 0:
            raise ValueError(f"clip_lr must be >= 0, got {self.clip_lr}")
        if self.count_std is not None and not self.count_std > 0:
            raise ValueError(f"count_std must be > 0, got {self.count_std}")
        if not 0 < self.min_clip < self.max_clip:
            raise ValueError(f"need 0 < min_clip < max_clip, got {self.min_clip}, {self.max_clip}")


class AdaClipDpSgd(Mechanism):
    ID = ID
    references = ("arXiv:1905.03871",)
    Options = Options

    def parts(self, spec: PrivacySpec, options: Options) -> Parts:
        """The sampler, the state-set flat clip (starting at the grid's clip), noise that follows it, and the
        centred unclipped count."""
        from mechanisms.parts.noise_addition import GaussianNoise  # lazy: keeps the registries light
        from mechanisms.parts.plan import Parts  # lazy: keeps the registries light
        from mechanisms.parts.releases import UnclippedCount  # lazy: keeps the registries light

        if not options.min_clip <= spec.clip <= options.max_clip:
            raise ValueError(f"{ID}: the initial clip {spec.clip} must lie in [min_clip, max_clip] = "
                             f"[{options.min_clip}, {options.max_clip}]")
        selection = spec.batch_selection
        count_std = options.count_std if options.count_std is not None else COUNT_STD_PER_BATCH * selection.batch_size
        clipper = AdaptiveClipping(spec.clip, options.min_clip, options.max_clip)
        return Parts(selection, clipper, GaussianNoise(spec.clip, follows_bound=True),
                     releases=(UnclippedCount(count_std),))

    def update_state(self, state: Mapping[str, torch.Tensor], released: Released, plan: PrivacyPlan,
                     options: Options) -> Mapping[str, torch.Tensor]:
        """C <- clamp(C exp(-clip_lr (b~ - target_quantile))), b~ = released centred count / B + 1/2."""
        import torch  # lazy: heavy (torch)

        unclipped = released["unclipped"].reshape(()) / plan.parts.sampler.batch_size + 0.5
        clip = state["clip"] * torch.exp(-options.clip_lr * (unclipped - options.target_quantile))
        return {"clip": clip.clamp(options.min_clip, options.max_clip)}


def combined_multiplier(sigma: float, count_std: float) -> float:
    """Theorem 1 of Andrew et al.: the one Gaussian multiplier of a step releasing the gradient at `sigma` and
    the centred count (sensitivity 1/2) with noise `count_std`."""
    return 1.0 / math.sqrt(sigma**-2 + (2 * count_std) ** -2)


mechanism = AdaClipDpSgd()

__all__ = ["ID", "AdaClipDpSgd", "Options", "combined_multiplier", "mechanism"]
