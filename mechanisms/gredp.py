"""GReDP (Wang et al., arXiv 2409.11663): gradients privatised in the frequency domain.

Per step: the sum of clipped per-sample gradients V of each parameter tensor is transformed (FFT of the
flattened tensor), complex Gaussian noise is added there, the inverse FFT is taken and its real part kept.
Since F^-1(F(V) + tau) = V + F^-1(tau), the release is V + n with n = Re(F^-1 tau): a Gaussian mechanism
whose covariance decides its privacy (research/seed_004_gredp.md section 5). With the paper's circular
complex noise (each part of variance sigma^2 C^2 / 2) n is i.i.d. N(0, sigma^2 C^2 / 2): GReDP at sigma
*is* DP-SGD at sigma / sqrt(2). The paper accounts it at sigma; we certify the effective sigma.

Switches for the paper's ambiguous choices (mechanism_options):
  noise:     complex (Theorem 1: parts a = b = 1/sqrt 2) | real (Corollary 1: b = 0) |
             complex-full (each part variance sigma^2 C^2: a = b = 1); or noise_parts: [a, b]
  fft:       unitary (1/sqrt N both ways, the paper's Eq. 9) | unnormalised (torch's default; clipping in
             the frequency domain then means a time-domain clip of C / sqrt(N))
  clipping:  flat (one norm over all parameters) | per-layer (Algorithm 2: each parameter tensor clipped to
             C and noised with std sigma C on its own: sensitivity C sqrt(L) for L tensors)
Effective noise multiplier (what we certify): sigma * min(|a|, |b|) / sqrt(L_eff), L_eff = L for per-layer
clipping, else 1; the FFT normalisation cancels out. min(|a|, |b|) = 0 leaves the odd-symmetric subspace of
every tensor noiseless: no epsilon is finite, so the plan is `uncertified`.
"""

from __future__ import annotations

import math
from typing import Any

import dp_accounting
import numpy as np
import torch

from mechanisms import dpsgd
from mechanisms.accountants import DpsgdEvents, calibrate_sigma, epsilon
from mechanisms.auditing import tradeoff
from mechanisms.plan import PrivacyPlan, PrivacySpec

ID = "gredp"


def claimed_step_tradeoff(sigma: float, **_: Any) -> tradeoff.TradeOff:
    """The paper's claim: sigma is DP-SGD's sigma, so one step is G_{1/sigma} (Theorems 1 and 3)."""
    return tradeoff.Gaussian(mu=1.0 / sigma)
NOISE_PARTS = {"complex": (1 / math.sqrt(2), 1 / math.sqrt(2)), "real": (1.0, 0.0), "complex-full": (1.0, 1.0)}
FFTS = ("unitary", "unnormalised")
CLIPPINGS = ("flat", "per-layer")


def noise_parts(options: dict[str, Any]) -> tuple[float, float]:
    if "noise_parts" in options:
        a, b = (float(x) for x in options["noise_parts"])
        return a, b
    name = options.get("noise", "complex")
    if name not in NOISE_PARTS:
        raise ValueError(f"gredp noise must be one of {sorted(NOISE_PARTS)}, got {name!r}")
    return NOISE_PARTS[name]


def _check(options: dict[str, Any]) -> None:
    if options.get("fft", "unitary") not in FFTS:
        raise ValueError(f"gredp fft must be one of {FFTS}, got {options.get('fft')!r}")
    if options.get("clipping", "flat") not in CLIPPINGS:
        raise ValueError(f"gredp clipping must be one of {CLIPPINGS}, got {options.get('clipping')!r}")


def effective_scale(options: dict[str, Any], n_tensors: int = 1) -> float:
    """sigma_eff / sigma for these switches (see the module docstring); 0 means no finite epsilon."""
    _check(options)
    a, b = noise_parts(options)
    per_layer = options.get("clipping", "flat") == "per-layer"
    return min(abs(a), abs(b)) / (math.sqrt(n_tensors) if per_layer else 1.0)


def effective_event(sigma: float, sample_rate: float, steps: int, options: dict[str, Any] | None = None,
                    n_tensors: int = 1, sampler: str = "poisson",
                    dataset_size: int | None = None) -> dp_accounting.DpEvent:
    """What the code really adds, as DP-SGD noise; `UnsupportedDpEvent` where a subspace is noiseless."""
    scale = effective_scale(dict(options or {}), n_tensors)
    if scale == 0:
        return dp_accounting.UnsupportedDpEvent()
    return DpsgdEvents(sample_rate, steps, sampler, dataset_size, scale)(sigma)


def plan(spec: PrivacySpec) -> PrivacyPlan:
    """Calibration `claimed` picks sigma as the paper does (as DP-SGD's sigma), `certified` so that the
    effective sigma meets the target. Per-layer clipping needs `spec.n_tensors` (the model's)."""
    options = dict(spec.options)
    if options.get("clipping", "flat") == "per-layer" and spec.n_tensors is None:
        raise ValueError("gredp per-layer clipping needs the model's number of parameter tensors (n_tensors)")
    n_tensors = spec.n_tensors or 1
    scale = effective_scale(options, n_tensors)
    claimed_events = DpsgdEvents(spec.sample_rate, spec.steps, spec.sampler, spec.dataset_size)
    if spec.sigma is not None:
        sigma = spec.sigma
    elif spec.calibration == "claimed":
        sigma = calibrate_sigma(claimed_events, spec.epsilon, spec.delta, spec.accountant).sigma
    elif scale == 0:
        raise ValueError("gredp with real-valued noise leaves a noiseless subspace: it cannot be calibrated "
                         "to a certified epsilon (calibration: certified skips it)")
    else:
        sigma = calibrate_sigma(DpsgdEvents(spec.sample_rate, spec.steps, spec.sampler, spec.dataset_size, scale),
                                spec.epsilon, spec.delta, spec.accountant).sigma
    event = effective_event(sigma, spec.sample_rate, spec.steps, options, n_tensors, spec.sampler, spec.dataset_size)
    return PrivacyPlan(
        mechanism=ID, sigma=sigma, sample_rate=spec.sample_rate, steps=spec.steps, delta=spec.delta,
        sampler=spec.sampler, accountant=spec.accountant, claimed_by=f"gredp-paper ({spec.accountant} at sigma)",
        epsilon_claimed=epsilon(claimed_events(sigma), spec.delta, spec.accountant),
        epsilon_certified=epsilon(event, spec.delta, "pld"),
        effective_event=event,
        notes=("real-valued noise leaves the odd-symmetric subspace noiseless: not DP for any finite epsilon"
               if scale == 0 else f"certified at the effective noise multiplier sigma * {scale:.4f}"),
        extra={"sigma_effective": sigma * scale, "noise_parts": noise_parts(options),
               "fft": options.get("fft", "unitary"), "clipping": options.get("clipping", "flat"),
               "n_tensors": n_tensors},
    )


def frequency_noise(shape: tuple[int, ...], std: float, parts: tuple[float, float], fft: str,
                    generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """n = Re(F^-1 tau) for tau with real part N(0, (a std)^2) and imaginary part N(0, (b std)^2)."""
    a, b = parts
    n = math.prod(shape)
    real = torch.randn(n, generator=generator, dtype=dtype) * (a * std)
    imag = torch.randn(n, generator=generator, dtype=dtype) * (b * std)
    tau = torch.complex(real, imag)
    return torch.fft.ifft(tau, norm="ortho" if fft == "unitary" else "backward").real.reshape(shape)


def privatize(summed: torch.Tensor, std: float, parts: tuple[float, float], fft: str,
              generator: torch.Generator | None = None) -> torch.Tensor:
    """The paper's four steps on one tensor: FFT, add tau, inverse FFT, real part."""
    norm = "ortho" if fft == "unitary" else "backward"
    spectrum = torch.fft.fft(summed.reshape(-1).to(torch.float64), norm=norm)
    noise = frequency_noise(spectrum.shape, std, parts, fft, generator, torch.float64)
    # F^-1(F(V) + tau) = V + F^-1(tau): adding the noise after the inverse transform is the same release.
    released = torch.fft.ifft(spectrum, norm=norm).real + noise
    return released.to(summed.dtype).reshape(summed.shape)


def make_private(model: Any, optimizer: Any, loader: Any, plan: PrivacyPlan, *, criterion: Any, clip: float = 1.0,
                 grad_sample_mode: str = "hooks", noise: str = "complex", noise_parts: Any = None,
                 fft: str = "unitary", clipping: str = "flat", **options: Any) -> tuple[Any, Any, Any, Any]:
    """DP-SGD through Opacus with GReDP's frequency-domain noise step in place of Gaussian noise.

    Clipping happens on per-sample gradients in the time domain: for the unitary FFT that equals clipping
    in the frequency domain (Parseval); for the unnormalised FFT a frequency-domain clip C is a time-domain
    clip C / sqrt(N) of the flattened gradient (N = number of trainable parameters under flat clipping).
    """
    opts = {"noise": noise, "fft": fft, "clipping": clipping} | ({"noise_parts": noise_parts} if noise_parts else {})
    _check(opts)
    parts = globals()["noise_parts"](opts)
    params = [p for p in model.parameters() if p.requires_grad]
    spectral_clip = clip
    if fft == "unnormalised":
        n = sum(p.numel() for p in params)
        clip = clip / math.sqrt(n) if clipping == "flat" else clip
    per_layer = clipping == "per-layer"
    if per_layer and fft == "unnormalised":
        norms = [spectral_clip / math.sqrt(p.numel()) for p in params]
    else:
        norms = [clip] * len(params)

    def add_noise(self: Any) -> None:
        std = self.noise_multiplier * spectral_clip  # in the frequency domain, for every tensor
        for p in self.params:
            p.grad = privatize(p.summed_grad, std, parts, fft, self.generator).view_as(p)

    return dpsgd.make_private(model, optimizer, loader, plan, criterion=criterion,
                              clip=norms if per_layer else clip, grad_sample_mode=grad_sample_mode,
                              add_noise=add_noise, clipping="per_layer" if per_layer else "flat")


def privatize_step(sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator, *,
                   noise: str = "complex", noise_parts: Any = None, fft: str = "unitary", **_: Any) -> np.ndarray:
    """One release per row (a flat clipped-gradient sum), for the auditor: Re(F^-1(F(v) + tau))."""
    opts = {"noise": noise} | ({"noise_parts": noise_parts} if noise_parts else {})
    a, b = globals()["noise_parts"](opts)
    sums = np.asarray(sums, dtype=np.float64)
    norm = "ortho" if fft == "unitary" else "backward"
    scale = sigma * clip * (math.sqrt(sums.shape[-1]) if fft == "unnormalised" else 1.0)
    tau = rng.standard_normal(sums.shape) * (a * scale) + 1j * rng.standard_normal(sums.shape) * (b * scale)
    return np.fft.ifft(np.fft.fft(sums, axis=-1, norm=norm) + tau, axis=-1, norm=norm).real
