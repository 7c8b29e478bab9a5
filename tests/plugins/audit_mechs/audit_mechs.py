"""Three mechanisms that change the private step after planning, with privbench's own parts (issue 37's table),
for the one-run audit to catch by measuring what ran (tests/mechanisms/auditing/test_audit_sweep.py). The hooks
no longer reach the optimizer (they see copies of the releases), so each reaches it as a plugin still could: by
overriding the template step `post_processing` (which the contract check reports, and the step guards see). The
audit must call each `violated` on its own measurements, whatever the other checks say:

| mechanism | what is wrong | what the audit reads |
|---|---|---|
| audit-engine-2c | the engine clips at 2C after planning | canaries pushed 2x, above ceiling |
| audit-sum-doubled | a release observer doubles the clipped sum before the noise | canaries pushed 2x, above ceiling |
| audit-reused-noise | the noise generator is reseeded after every step | noise repeats across steps |

Each declares DP-SGD's parts (privbench's classes), so its plan certifies DP-SGD; only the step differs.
"""

from __future__ import annotations

from typing import Any

from mechanisms import Mechanism
from mechanisms.framework.mechanism import AfterStepPart
from mechanisms.parts.clipping import FlatClipping


class DeclaresDpSgd(Mechanism):
    """DP-SGD's parts, planned and certified as DP-SGD."""

    def parts(self, spec: Any, options: Any) -> Any:
        from mechanisms.parts.noise_addition import GaussianNoise
        from mechanisms.parts.plan import Parts

        return Parts(spec.batch_selection, FlatClipping(spec.clip), GaussianNoise(spec.clip))


class EngineAt2C(DeclaresDpSgd):
    ID = "audit-engine-2c"

    def post_processing(self, module: Any, plan: Any, options: Any, generator: Any) -> AfterStepPart:
        bound = 2.0 * plan.parts.clipper.bound

        def clip_at_2c(optimizer: Any) -> None:
            engine = getattr(optimizer, "engine", None)
            if engine is not None:
                engine.max_grad_norm = bound
            else:
                optimizer.max_grad_norm = bound

        return AfterStepPart(after_step=clip_at_2c)


class Doubler:
    def before_noise(self, optimizer: Any) -> None:
        for p in optimizer.params:
            p.summed_grad = 2 * p.summed_grad

    def after_noise(self, optimizer: Any) -> None:
        pass


class SumDoubled(DeclaresDpSgd):
    ID = "audit-sum-doubled"

    def post_processing(self, module: Any, plan: Any, options: Any, generator: Any) -> AfterStepPart:
        def register(optimizer: Any) -> None:
            if not any(isinstance(o, Doubler) for o in optimizer.observers):
                optimizer.observe_releases(Doubler())

        return AfterStepPart(after_step=register)


class ReusedNoise(DeclaresDpSgd):
    ID = "audit-reused-noise"

    def post_processing(self, module: Any, plan: Any, options: Any, generator: Any) -> AfterStepPart:
        def reseed(optimizer: Any) -> None:
            optimizer.generator.manual_seed(1234)

        return AfterStepPart(after_step=reseed)


engine_at_2c = EngineAt2C()
sum_doubled = SumDoubled()
reused_noise = ReusedNoise()
