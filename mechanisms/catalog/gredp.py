"""GReDP (Wang et al., arXiv 2409.11663): gradients privatised in the frequency domain.

Per step: the sum of clipped per-sample gradients V of each parameter tensor is transformed (FFT of the
flattened tensor), complex Gaussian noise tau is added there, the inverse FFT is taken and its real part
kept. Since F^-1(F(V) + tau) = V + F^-1(tau), the release is V plus a real Gaussian whose covariance
decides its privacy (`noise_addition.FrequencyNoise`). With the paper's circular complex noise (each part
of variance sigma^2 C^2 / 2) that Gaussian is i.i.d. N(0, sigma^2 C^2 / 2): GReDP at sigma *is* DP-SGD at
sigma / sqrt(2). The paper accounts it at sigma; the plan certifies what the noise part declares.

Options (`mechanism_options: {gredp: {...}}`):
  noise:     complex (Theorem 1: parts a = b = 1/sqrt 2, default) | real (Corollary 1: b = 0) |
             complex-full (each part variance sigma^2 C^2: a = b = 1); or noise_parts: [a, b]
  fft:       unitary (1/sqrt N both ways, the paper's Eq. 9, default) | unnormalised (torch's default;
             clipping at C in the frequency domain then means a time-domain clip of C / sqrt(N))
  clipping:  flat (one norm over all parameters, default) | per-layer (Algorithm 2: each tensor clipped
             to C and noised with std sigma C on its own: sensitivity C sqrt(L) for L tensors)
Real-valued noise (b = 0) leaves the odd-symmetric subspace of every tensor without noise: no finite
epsilon holds, so the plan certifies infinity (and the claim is `overclaimed`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mechanisms.framework.mechanism import CLIPPINGS, Claim, Mechanism
from mechanisms.parts.clipping import Clipping, FlatClipping, PerLayerClipping

if TYPE_CHECKING:
    from mechanisms.parts.plan import Parts, PrivacySpec

ID = "gredp"
NOISE_PARTS = {"complex": (1 / math.sqrt(2), 1 / math.sqrt(2)), "real": (1.0, 0.0), "complex-full": (1.0, 1.0)}


@dataclasses.dataclass(frozen=True)
class Options:
    noise: str = "complex"
    noise_parts: tuple[float, float] | None = None
    fft: str = "unitary"
    clipping: str = "flat"

    def __post_init__(self) -> None:
        if self.noise not in NOISE_PARTS:
            raise ValueError(f"noise must be one of {', '.join(NOISE_PARTS)}, got {self.noise!r}")
        if self.noise_parts is not None and not all(math.isfinite(x) for x in self.noise_parts):
            raise ValueError(f"noise_parts must be two finite numbers, got {self.noise_parts}")
        from mechanisms.parts.noise_addition import FFT_NORMS  # lazy: keeps the registries light

        if self.fft not in FFT_NORMS:
            raise ValueError(f"fft must be one of {', '.join(FFT_NORMS)}, got {self.fft!r}")
        if self.clipping not in CLIPPINGS:
            raise ValueError(f"clipping must be one of {', '.join(CLIPPINGS)}, got {self.clipping!r}")

    @property
    def parts(self) -> tuple[float, float]:
        return tuple(self.noise_parts) if self.noise_parts is not None else NOISE_PARTS[self.noise]  # type: ignore[return-value]


def time_domain_clipper(options: Options, clip: float, tensor_sizes: Sequence[int] | None,
                        n_tensors: int | None, model_dim: int | None) -> Clipping:
    """The per-sample clipping that runs (in the time domain, where per-sample gradients live).

    Unitary FFT: Parseval makes a frequency-domain clip C a time-domain clip C. Unnormalised: ||F v|| =
    sqrt(n) ||v||, so the clip is C / sqrt(N) over all N coordinates (flat) or C / sqrt(n_i) per tensor.
    """
    unitary = options.fft == "unitary"
    if options.clipping == "flat":
        if unitary:
            return FlatClipping(clip)
        if model_dim is None:
            raise ValueError("gredp with fft: unnormalised needs the model's number of trainable parameters")
        return FlatClipping(clip / math.sqrt(model_dim))
    if unitary:
        if n_tensors is None:
            raise ValueError("gredp per-layer clipping needs the model's number of parameter tensors (n_tensors)")
        return PerLayerClipping((clip,) * n_tensors)
    if tensor_sizes is None:
        raise ValueError("gredp per-layer clipping with fft: unnormalised needs the model's tensor sizes")
    return PerLayerClipping(tuple(clip / math.sqrt(n) for n in tensor_sizes))


class Gredp(Mechanism):
    ID = ID
    references = ("arXiv:2409.11663",)
    Options = Options
    audit_coordinatewise = False  # the FFT mixes coordinates
    audit_per_tensor = True  # the transform runs per parameter tensor

    def parts(self, spec: PrivacySpec, options: Any) -> Parts:
        from mechanisms.parts.noise_addition import FrequencyNoise  # lazy: keeps the registries light
        from mechanisms.parts.plan import Parts  # lazy: keeps the registries light

        clipper = time_domain_clipper(options, spec.clip, spec.tensor_sizes, spec.n_tensors, spec.model_dim)
        return Parts(spec.batch_selection, clipper, FrequencyNoise(spec.clip, options.parts, options.fft))

    def paper_parts(self, spec: PrivacySpec) -> Parts:
        """What the paper analyses: DP-SGD's Gaussian at sigma (Theorems 1 and 3)."""
        from mechanisms.parts.noise_addition import GaussianNoise  # lazy: keeps the registries light
        from mechanisms.parts.plan import Parts  # lazy: keeps the registries light

        return Parts(spec.batch_selection, FlatClipping(spec.clip), GaussianNoise(spec.clip))

    def claimed_sigma(self, spec: PrivacySpec, options: Any, parts: Parts) -> float:
        from mechanisms.accounting import calibrate_sigma  # lazy: heavy (dp_accounting, numpy, scipy)

        return calibrate_sigma(self.paper_parts(spec), spec.epsilon, spec.delta, spec.accountant).sigma

    def claim(self, sigma: float, spec: PrivacySpec, options: Any, parts: Parts, certified: float | None) -> Claim:
        from mechanisms.accounting import epsilon  # lazy: heavy (dp_accounting, numpy, scipy)

        claimed = epsilon(self.paper_parts(spec).dp_event(sigma), spec.delta, spec.accountant)
        scale = parts.noise_multiplier(sigma) / self.paper_parts(spec).noise_multiplier(sigma)
        notes = ("real-valued noise leaves the odd-symmetric subspace noiseless: not DP for any finite epsilon"
                 if scale == 0 else f"certified at the effective noise multiplier sigma * {scale:.4f}")
        extra = {"sigma_effective": sigma * scale, "noise_parts": options.parts, "fft": options.fft,
                 "clipping": options.clipping, "n_tensors": spec.n_tensors}
        return Claim(claimed, f"gredp-paper ({spec.accountant} at sigma)", extra, notes)

    def claimed_step_tradeoff(self, sigma: float, options: Mapping[str, Any]) -> Any:
        """The paper's claim for one step: DP-SGD's Gaussian at sigma, G_{1/sigma} (Theorems 1 and 3)."""
        from mechanisms.auditing import tradeoff  # lazy: keeps the registries light

        return tradeoff.Gaussian(mu=1.0 / sigma)


mechanism = Gredp()

__all__ = ["ID", "NOISE_PARTS", "Gredp", "Options", "mechanism", "time_domain_clipper"]
