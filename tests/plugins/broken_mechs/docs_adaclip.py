"""Adaptive clipping (Andrew et al. 2021) as a plugin, written from docs/plugins.md."""

import dataclasses

from mechanisms import Mechanism
from mechanisms.parts.clipping import AdaptiveClipping


@dataclasses.dataclass(frozen=True)
class Options:
    target_quantile: float = 0.5
    clip_lr: float = 0.2
    min_clip: float = 1e-3
    max_clip: float = 1e3


class DocsAdaClip(Mechanism):
    ID = "docs-adaclip"
    Options = Options

    def parts(self, spec, options):
        from mechanisms.parts.noise_addition import GaussianNoise
        from mechanisms.parts.plan import Parts
        from mechanisms.parts.releases import UnclippedCount

        count_std = spec.batch_selection.batch_size / 20                  # the paper's sigma_b = B / 20
        clipper = AdaptiveClipping(spec.clip, options.min_clip, options.max_clip)  # bound from state "clip"
        return Parts(spec.batch_selection, clipper, GaussianNoise(spec.clip, follows_bound=True),
                     releases=(UnclippedCount(count_std),))               # the noised centred count

    def update_state(self, state, released, plan, options):              # copies of the released values
        import torch

        unclipped = released["unclipped"].reshape(()) / plan.parts.sampler.batch_size + 0.5
        clip = state["clip"] * torch.exp(-options.clip_lr * (unclipped - options.target_quantile))
        return {"clip": clip.clamp(options.min_clip, options.max_clip)}


mechanism = DocsAdaClip()
