"""Six mechanisms whose privacy analysis is broken, each written through privbench's public contract as a
researcher's plugin would be. privbench must catch every one of them (tests/mechanisms/test_broken_suite.py,
the table in docs/auditing.md):

| mechanism | what is wrong | expected verdict |
|---|---|---|
| broken-half-noise | claims DP-SGD at sigma, adds half that noise | violated |
| broken-ignores-release | adaptive clipping whose claim leaves out the count it releases | overclaimed |
| broken-noise-outside | adds its noise in its own `make_private`, outside the parts | uncertified |
| broken-clip | a clipper of its own that declares C and clips at 2C | uncertified |
| broken-shuffle-as-poisson | shuffled batches accounted as Poisson sampling | overclaimed |
| broken-batch-scaled-twice | noise divided by the batch size, and the sum again by the optimizer | violated |
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mechanisms import Mechanism
from mechanisms.catalog.dpsgd_adaclip import AdaClipDpSgd
from mechanisms.framework.mechanism import Claim
from mechanisms.parts.clipping import FlatClipping


def dpsgd_parts(spec: Any, sampler: Any = None) -> Any:
    """DP-SGD's parts on the spec's sampler (or `sampler`): what these mechanisms claim to be."""
    from mechanisms.parts.noise_addition import GaussianNoise
    from mechanisms.parts.plan import Parts

    return Parts(sampler or spec.batch_selection, FlatClipping(spec.clip), GaussianNoise(spec.clip))


class ClaimsDpSgd(Mechanism):
    """A mechanism whose claim is DP-SGD's at sigma on `claimed_parts` (by default the spec's sampler)."""

    def claimed_parts(self, spec: Any) -> Any:
        return dpsgd_parts(spec)

    def claimed_sigma(self, spec: Any, options: Any, parts: Any) -> float:
        from mechanisms.accounting import calibrate_sigma

        return calibrate_sigma(self.claimed_parts(spec), spec.epsilon, spec.delta, spec.accountant).sigma

    def claim(self, sigma: float, spec: Any, options: Any, parts: Any, certified: float | None) -> Claim:
        from mechanisms.accounting import epsilon

        claimed = self.claimed_parts(spec)
        return Claim(epsilon(claimed.dp_event(sigma), spec.delta, spec.accountant, claimed.accounting_relation),
                     "dp-sgd's analysis")


class HalfNoise(ClaimsDpSgd):
    """Claims DP-SGD at sigma; its noise part adds sigma C / 2."""

    ID = "broken-half-noise"

    def parts(self, spec: Any, options: Any) -> Any:
        from mechanisms.parts.noise_addition import GaussianNoise
        from mechanisms.parts.plan import Parts

        return Parts(spec.batch_selection, FlatClipping(spec.clip), GaussianNoise(0.5 * spec.clip))


class BatchScaledTwice(ClaimsDpSgd):
    """Claims DP-SGD at sigma; its noise std is sigma C / B, which the optimizer divides by B again."""

    ID = "broken-batch-scaled-twice"

    def parts(self, spec: Any, options: Any) -> Any:
        from mechanisms.parts.noise_addition import GaussianNoise
        from mechanisms.parts.plan import Parts

        return Parts(spec.batch_selection, FlatClipping(spec.clip), GaussianNoise(spec.clip / spec.batch_size))


class ShuffleAsPoisson(ClaimsDpSgd):
    """Runs one shuffled pass per epoch; claims Poisson sampling at rate B / N over the same steps."""

    ID = "broken-shuffle-as-poisson"

    def parts(self, spec: Any, options: Any) -> Any:
        return dpsgd_parts(spec, dataclasses.replace(spec, sampler="shuffle").batch_selection)

    def claimed_parts(self, spec: Any) -> Any:
        return dpsgd_parts(spec, dataclasses.replace(spec, sampler="poisson").batch_selection)


class IgnoresRelease(AdaClipDpSgd):
    """Adaptive clipping (the built-in's parts and update) whose claim is the gradient release's alone."""

    ID = "broken-ignores-release"

    def claim(self, sigma: float, spec: Any, options: Any, parts: Any, certified: float | None) -> Claim:
        from mechanisms.accounting import epsilon

        return Claim(epsilon(dpsgd_parts(spec).dp_event(sigma), spec.delta, spec.accountant), "the gradient alone")

    def claimed_sigma(self, spec: Any, options: Any, parts: Any) -> float:
        from mechanisms.accounting import calibrate_sigma

        return calibrate_sigma(dpsgd_parts(spec), spec.epsilon, spec.delta, spec.accountant).sigma


class NoiseOutside(Mechanism):
    """Declares DP-SGD's parts at half the noise and adds the other half itself, in its own optimizer step."""

    ID = "broken-noise-outside"

    def parts(self, spec: Any, options: Any) -> Any:
        from mechanisms.parts.noise_addition import GaussianNoise
        from mechanisms.parts.plan import Parts

        return Parts(spec.batch_selection, FlatClipping(spec.clip), GaussianNoise(0.5 * spec.clip))

    def make_private(self, module: Any, optimizer: Any, data: Any, plan: Any, **kwargs: Any) -> Any:
        import torch

        training = super().make_private(module, optimizer, data, plan, **kwargs)
        step, std = training.optimizer.step, 0.5 * plan.sigma * plan.parts.clipper.bound / plan.parts.sampler.batch_size

        def noisy_step(*args: Any, **kw: Any) -> Any:
            for p in training.optimizer.params:
                if p.grad is not None:
                    p.grad.add_(torch.randn_like(p.grad) * std)
            return step(*args, **kw)

        training.optimizer.step = noisy_step
        return training


@dataclasses.dataclass(frozen=True)
class DeclaredClip(FlatClipping):
    """Declares flat clipping at C; tells the engine to clip at 2C."""

    @property
    def max_grad_norm(self) -> float:
        return 2 * self.clip


class WrongClip(ClaimsDpSgd):
    """Claims DP-SGD; its noise is DP-SGD's, its clipper its own, whose declared bound is half the one it applies."""

    ID = "broken-clip"

    def parts(self, spec: Any, options: Any) -> Any:
        from mechanisms.parts.noise_addition import GaussianNoise
        from mechanisms.parts.plan import Parts

        return Parts(spec.batch_selection, DeclaredClip(spec.clip), GaussianNoise(spec.clip))


half_noise = HalfNoise()
ignores_release = IgnoresRelease()
noise_outside = NoiseOutside()
wrong_clip = WrongClip()
shuffle_as_poisson = ShuffleAsPoisson()
batch_scaled_twice = BatchScaledTwice()
