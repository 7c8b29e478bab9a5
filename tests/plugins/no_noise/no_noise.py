"""Pipelines that add almost no noise, written through privbench's public contract as a researcher's plugin
would be. `broken-no-noise` claims DP-SGD at the calibrated sigma and its noise part adds 3% of it (noise that
small still has a certificate computable in a second); `broken-unclipped`, the non-private reference under the
same claim, also clips nothing. The input-canary audit must find both `violated` on its own
(tests/workers/test_input_canary_trials.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from mechanisms import Mechanism
from mechanisms.framework.mechanism import Claim
from mechanisms.parts.clipping import FlatClipping


class NoNoise(Mechanism):
    """Claims DP-SGD at sigma on the spec's sampler; its noise part adds 0.03 sigma C."""

    ID = "broken-no-noise"

    def parts(self, spec: Any, options: Any) -> Any:
        from mechanisms.parts.noise_addition import GaussianNoise
        from mechanisms.parts.plan import Parts

        return Parts(spec.batch_selection, FlatClipping(spec.clip), GaussianNoise(0.03 * spec.clip))

    def claimed_sigma(self, spec: Any, options: Any, parts: Any) -> float:
        from mechanisms.accounting import calibrate_sigma

        return calibrate_sigma(self._claimed(spec), spec.epsilon, spec.delta, spec.accountant).sigma

    def claim(self, sigma: float, spec: Any, options: Any, parts: Any, certified: float | None) -> Claim:
        from mechanisms.accounting import epsilon

        claimed = self._claimed(spec)
        return Claim(epsilon(claimed.dp_event(sigma), spec.delta, spec.accountant, claimed.accounting_relation),
                     "dp-sgd's analysis")

    @staticmethod
    def _claimed(spec: Any) -> Any:
        from mechanisms.parts.noise_addition import GaussianNoise
        from mechanisms.parts.plan import Parts

        return Parts(spec.batch_selection, FlatClipping(spec.clip), GaussianNoise(spec.clip))


no_noise = NoNoise()



@dataclasses.dataclass(frozen=True)
class NoClip(FlatClipping):
    """Declares flat clipping at C; tells the engine to clip at 10^6 C (nothing is clipped)."""

    @property
    def max_grad_norm(self) -> float:
        return 1e6 * self.clip


class Unclipped(NoNoise):
    """The non-private reference under DP-SGD's claim: it clips nothing (its clipper is its own, so the plan is
    uncertified, and no certificate is computed) and adds 3% of sigma C."""

    ID = "broken-unclipped"

    def parts(self, spec: Any, options: Any) -> Any:
        from mechanisms.parts.noise_addition import GaussianNoise
        from mechanisms.parts.plan import Parts

        return Parts(spec.batch_selection, NoClip(spec.clip), GaussianNoise(0.03 * spec.clip))


unclipped = Unclipped()
