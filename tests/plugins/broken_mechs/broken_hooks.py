"""Seven mechanisms that break privacy through the public hooks, with privbench's own parts only: no template
method is overridden and every part is privbench's. The hooks get copies of the released values, so each
reaches the private step the way a plugin's code still can (Python cannot be sandboxed): by finding the
private optimizer among the live objects. privbench's checks from the outside must catch every one of them
(tests/mechanisms/test_broken_suite.py, the table in docs/auditing.md):

| mechanism | what is wrong | caught by |
|---|---|---|
| broken-reused-noise | rewinds the noise generator after each step: the same noise vector every step | noise_stream |
| broken-hidden-state | adaptive clip from the true unclipped fraction (the optimizer's norms) | state_replay |
| broken-bound-after-plan | sets the engine's clip bound to 2C after planning | plan_parameters |
| broken-scaled-sum | a release observer doubles the clipped sum before the noise | observers |
| broken-state-bound | an adaptive clip declared on [C, C] whose state sets 2C | clip_range |
| broken-model-update | adds the un-noised clipped sum to the model after each update | model_update |
| broken-correlated-noise | cancels half the previous step's noise in the model (tree-like noise) | model_update |
"""

from __future__ import annotations

import gc
from typing import Any

from mechanisms import Mechanism
from mechanisms.catalog.dpsgd_adaclip import AdaClipDpSgd

_FOUND: dict[str, Any] = {}


def private_optimizer(released: Any) -> Any:
    """The private optimizer that made `released` (the hook's copy), found among the live objects: the hooks do
    not get it. None outside training (the replay's process)."""
    from mechanisms.framework.private_training import PrivateOptimizerMixin

    def made(o: Any) -> bool:
        return getattr(o, "_hook_copy", None) is released

    if _FOUND.get("optimizer") is None or not made(_FOUND["optimizer"]):
        found = [o for o in gc.get_objects() if type(o).__module__ == PrivateOptimizerMixin.__module__
                 and isinstance(o, PrivateOptimizerMixin) and made(o)]
        _FOUND.clear()
        _FOUND["optimizer"] = found[0] if found else None
    return _FOUND["optimizer"]


class ReusedNoise(Mechanism):
    """DP-SGD whose noise generator is set back after every step: each step adds the same noise vector."""

    ID = "broken-reused-noise"

    def after_step(self, released: Any, state: Any, plan: Any, options: Any) -> None:
        optimizer = private_optimizer(released)
        if "generator_state" not in _FOUND:
            _FOUND["generator_state"] = optimizer.generator.get_state()
        optimizer.generator.set_state(_FOUND["generator_state"])


class HiddenState(AdaClipDpSgd):
    """Adaptive clipping whose bound follows the true fraction of unclipped examples (the optimizer's
    per-example norms), not the released noised count; without the optimizer it falls back to the release."""

    ID = "broken-hidden-state"

    def update_state(self, state: Any, released: Any, plan: Any, options: Any) -> Any:
        import torch

        optimizer = private_optimizer(released)
        if optimizer is None:
            return super().update_state(state, released, plan, options)
        norms = optimizer.example_norms()
        unclipped = (norms <= state["clip"]).to(norms.dtype).mean()
        clip = state["clip"] * torch.exp(-options.clip_lr * (unclipped - options.target_quantile))
        return {"clip": clip.clamp(options.min_clip, options.max_clip)}


class BoundAfterPlan(Mechanism):
    """DP-SGD planned at C; after the first step the clipping engine clips at 2C."""

    ID = "broken-bound-after-plan"

    def after_step(self, released: Any, state: Any, plan: Any, options: Any) -> None:
        optimizer = private_optimizer(released)
        target = getattr(optimizer, "engine", None) or optimizer
        target.max_grad_norm = 2 * plan.parts.clipper.bound


class Doubler:
    """A release observer that doubles the clipped sum before the noise is added."""

    def before_noise(self, optimizer: Any) -> None:
        for p in optimizer.params:
            p.summed_grad.mul_(2)

    def after_noise(self, optimizer: Any) -> None:
        pass


class ScaledSum(Mechanism):
    """DP-SGD whose clipped sum is doubled before the noise, by an observer it registers."""

    ID = "broken-scaled-sum"

    def after_step(self, released: Any, state: Any, plan: Any, options: Any) -> None:
        optimizer = private_optimizer(released)
        if not any(isinstance(o, Doubler) for o in optimizer.observers):
            optimizer.observe_releases(Doubler())


class StateBound(Mechanism):
    """An adaptive clip declared on [C, C] (so accounted at C), whose state sets the bound to 2C."""

    ID = "broken-state-bound"

    def parts(self, spec: Any, options: Any) -> Any:
        from mechanisms.parts.clipping import AdaptiveClipping
        from mechanisms.parts.noise_addition import GaussianNoise
        from mechanisms.parts.plan import Parts

        return Parts(spec.batch_selection, AdaptiveClipping(spec.clip, spec.clip, spec.clip),
                     GaussianNoise(spec.clip))

    def update_state(self, state: Any, released: Any, plan: Any, options: Any) -> Any:
        return {"clip": state["clip"] * 0 + 2 * plan.parts.clipper.bound}


class ModelUpdate(Mechanism):
    """DP-SGD that also takes an un-noised step: the clipped sum, scaled like the update, after each update."""

    ID = "broken-model-update"

    def after_step(self, released: Any, state: Any, plan: Any, options: Any) -> None:
        optimizer = private_optimizer(released)
        lr = optimizer.param_groups[0]["lr"]
        for p in optimizer.params:
            p.data.add_(p.summed_grad.view_as(p), alpha=-lr / plan.parts.sampler.batch_size)


class CorrelatedNoise(Mechanism):
    """DP-SGD whose model cancels half of the previous step's noise (noise correlated across steps, as tree
    aggregation does when it merges nodes), reading the clipped sums to recover the noise."""

    ID = "broken-correlated-noise"

    def after_step(self, released: Any, state: Any, plan: Any, options: Any) -> None:
        optimizer = private_optimizer(released)
        lr, batch = optimizer.param_groups[0]["lr"], plan.parts.sampler.batch_size
        noises = [g.view_as(p) - p.summed_grad.view_as(p) for g, p in zip(released.gradient, optimizer.params,
                                                                          strict=True)]
        for p, previous in zip(optimizer.params, _FOUND.get("noise", ()), strict=False):
            p.data.add_(previous, alpha=0.5 * lr / batch)
        _FOUND["noise"] = noises


reused_noise = ReusedNoise()
hidden_state = HiddenState()
bound_after_plan = BoundAfterPlan()
scaled_sum = ScaledSum()
state_bound = StateBound()
model_update = ModelUpdate()
correlated_noise = CorrelatedNoise()
