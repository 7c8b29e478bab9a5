"""DP-SGD as many papers run it (Tramèr & Boneh, ICLR 2021, arXiv 2011.11660, among them): shuffled
fixed-size batches executed, privacy claimed as if the batches were Poisson samples.

What runs: one random permutation of the training set per epoch, cut into round(N / B) batches of (nearly)
B examples; per-example clipping at C and Gaussian noise sigma C on the sum, as DP-SGD. That is what
`torch.utils.data.DataLoader(shuffle=True)` with gradient accumulation to B executes.

What is claimed (`claim`): the moments accountant of the Opacus release those papers used (0.x): RDP of the
Poisson-subsampled Gaussian at rate q = B / N over the executed steps, at TF-Privacy's orders, converted
with the classic rule epsilon = min_a [RDP(a) + log(1/delta) / (a - 1)] (`accountants.moments_accountant`,
the `ma_classic` accountant). Under `calibration: claimed` sigma is the one this analysis gives the target:
at epsilon 3 it is their published multiplier (2.15 for Fashion-MNIST's CNN at batch 2048, 4.05 for its
ScatterNet at 8192, 1.23 for MNIST's CNN at 512, each over 40 epochs).

What is certified: the executed sampler. With one pass over a shuffled permutation per epoch every
example is in exactly one batch per epoch, so each epoch is one Gaussian release of it under replace-one
neighbours, composed over the epochs; no amplification by shuffling is known to be sound (Chua et al.,
arXiv 2403.17673, show Poisson accounting under-reports it). The certified epsilon is therefore far above
the claim and the verdict is `overclaimed`; a run that meets the target soundly is `dpsgd` with Poisson
sampling executed (`sampler: poisson`), which `examples/tramer_boneh.yaml` runs beside it.

The grid's `sampler` does not apply: the shuffled batches are what this mechanism is (its plan records
the sampler that runs).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from mechanisms.framework.mechanism import Claim, Mechanism
from mechanisms.framework.registry import ACCOUNTANTS
from mechanisms.parts.clipping import FlatClipping

if TYPE_CHECKING:
    from mechanisms.parts.plan import Parts, PrivacySpec

ID = "dpsgd-shuffle-rdp"
CLAIMED_BY = "ma_classic: rdp under poisson sampling at q = B/N, classic conversion (opacus 0.x)"
EXECUTED_SAMPLER = "shuffle"
CLAIMED_SAMPLER = "poisson"


CLAIMED_ACCOUNTANT = "ma_classic"  # the registered claimed accountant that states their analysis


def claimed_run(sigma: float, spec: PrivacySpec) -> Any:
    """The run their analysis reads: Poisson sampling at q = B / N over the steps the shuffled loader executes,
    and each row of the model's one-time statistics as its own Gaussian (their code's 2 x RDP of the noised
    mean and mean square)."""
    # lazy: keeps the registries light
    from mechanisms.accounting.compare import DpsgdSetting  # the accounting package, loaded when claimed

    return DpsgdSetting.of_spec(dataclasses.replace(spec, sampler=CLAIMED_SAMPLER)).run(sigma)


def claimed_epsilon(sigma: float, spec: PrivacySpec) -> float:
    """Their epsilon for `sigma` on the run `spec` describes (the `ma_classic` accountant on `claimed_run`)."""
    return ACCOUNTANTS.get(CLAIMED_ACCOUNTANT).report(claimed_run(sigma, spec), spec.delta).epsilon


def _selection(spec: PrivacySpec, sampler: str) -> Any:
    return dataclasses.replace(spec, sampler=sampler).batch_selection


class ShuffleRdpDpSgd(Mechanism):
    ID = ID
    references = ("arXiv:2011.11660", "arXiv:1607.00133")

    def parts(self, spec: PrivacySpec, options: Any) -> Parts:
        """DP-SGD's clipping and noise on shuffled batches, whatever the grid's sampler."""
        from mechanisms.parts.noise_addition import GaussianNoise  # lazy: keeps the registries light
        from mechanisms.parts.plan import Parts  # lazy: keeps the registries light

        return Parts(_selection(spec, EXECUTED_SAMPLER), FlatClipping(spec.clip), GaussianNoise(spec.clip))

    def claimed_sigma(self, spec: PrivacySpec, options: Any, parts: Parts) -> float:
        """The smallest sigma whose claimed epsilon meets the target (their `get_noise_mul`)."""
        from mechanisms.accounting.calibration import calibrate  # lazy: keeps the registries light

        guess = ACCOUNTANTS.get(CLAIMED_ACCOUNTANT).sigma_guess(claimed_run(1.0, spec), spec.epsilon, spec.delta)
        return calibrate(lambda sigma: claimed_epsilon(sigma, spec), spec.epsilon, guess=guess).sigma

    def claim(self, sigma: float, spec: PrivacySpec, options: Any, parts: Parts, certified: float | None) -> Claim:
        """Their epsilon for `sigma`, with what Poisson sampling would have certified (PLD) beside it: the
        accountant's looseness and the sampler's gap, told apart."""
        from mechanisms.accounting import epsilon  # lazy: heavy (dp_accounting, numpy, scipy)

        poisson = dataclasses.replace(parts, sampler=_selection(spec, CLAIMED_SAMPLER))
        claimed = _selection(spec, CLAIMED_SAMPLER)
        extra = {"claimed_sampler": CLAIMED_SAMPLER, "claimed_sample_rate": claimed.sample_rate,
                 "claimed_steps": claimed.steps,
                 "epsilon_if_poisson_pld": epsilon(poisson.dp_event(sigma), spec.delta, "pld")}
        return Claim(claimed_epsilon(sigma, spec), CLAIMED_BY, extra,
                     "claimed as Poisson sampling; shuffled batches run, which no sound analysis amplifies")


mechanism = ShuffleRdpDpSgd()

__all__ = ["CLAIMED_ACCOUNTANT", "CLAIMED_BY", "ID", "ShuffleRdpDpSgd", "claimed_epsilon", "claimed_run", "mechanism"]
