"""The shared frame of correlated-noise mechanisms (DP-FTRL, DP-MF): fixed-order batches, flat clipping and a
`CorrelatedNoise` part whose strategy a subclass chooses (`strategy`).

A researcher's own correlated-noise mechanism subclasses `CorrelatedNoiseMechanism` and returns one of
privbench's strategies (`mechanisms.parts.correlated_noise`: `BandedToeplitz` with any coefficients, or
`RestartedTree`) from `strategy(spec, options)`; the base class builds the parts, so the sensitivity is the
strategy's under the schema the sampler executes and the run certifies as one Gaussian (docs/mechanisms.md,
"Correlated noise"). The grid's `sampler` does not apply: the batches are `fixed-order` (cyclic), the
participation every matrix-factorization analysis is stated for.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from mechanisms.framework.mechanism import Mechanism
from mechanisms.parts.clipping import FlatClipping

if TYPE_CHECKING:
    from mechanisms.parts.batch_selection import FixedOrderSampling
    from mechanisms.parts.correlated_noise import BandedToeplitz, RestartedTree
    from mechanisms.parts.plan import Parts, PrivacySpec

EXECUTED_SAMPLER = "fixed-order"


def fixed_order(spec: PrivacySpec) -> FixedOrderSampling:
    """The cyclic batches a correlated-noise mechanism runs, whatever the grid's sampler."""
    return dataclasses.replace(spec, sampler=EXECUTED_SAMPLER).batch_selection  # type: ignore[return-value]


class CorrelatedNoiseMechanism(Mechanism):
    """Fixed-order batches, flat clipping at C, noise s C^-1 z streamed by `strategy` (s = sigma C)."""

    def strategy(self, spec: PrivacySpec, options: Any) -> BandedToeplitz | RestartedTree:
        """Hook: the strategy matrix C for this run (its sensitivity is computed under the executed schema)."""
        raise NotImplementedError

    def parts(self, spec: PrivacySpec, options: Any) -> Parts:
        from mechanisms.parts.correlated_noise import CorrelatedNoise  # lazy: keeps the registries light
        from mechanisms.parts.plan import Parts  # lazy: keeps the registries light

        sampler = fixed_order(spec)
        clipper = FlatClipping(spec.clip)
        return Parts(sampler, clipper, CorrelatedNoise(clipper.bound, self.strategy(spec, options),
                                                       sampler.participation))

    def claimed_sigma(self, spec: PrivacySpec, options: Any, parts: Parts) -> float:
        """The smallest sigma whose claimed epsilon meets the target (the paper's calibration)."""
        from mechanisms.accounting.calibration import calibrate  # lazy: keeps the registries light

        return calibrate(lambda sigma: self.claim(sigma, spec, options, parts, None).epsilon, spec.epsilon).sigma


__all__ = ["EXECUTED_SAMPLER", "CorrelatedNoiseMechanism", "fixed_order"]
