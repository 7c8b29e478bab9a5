"""Mechanisms that exist only to test the auditor (never registered): one broken on purpose, and
reference models of the GReDP noise (arXiv 2409.11663; docs/mechanisms.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from mechanisms.auditing import AuditCase, Gaussian, profile
from mechanisms.catalog.dpsgd import DpSgd


class HalfNoise(DpSgd):
    """The bug: claims sigma (DP-SGD's analysis at the configured sigma), adds sigma / 2."""

    ID = "half-noise"

    def privatize_step(self, sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator,
                       **options: Any) -> np.ndarray:
        return super().privatize_step(sums, sigma / 2, clip, rng, **options)


class HalfNoiseBare(HalfNoise):
    """The same bug; its claim read from its own plan (`profile.claimed_profile`), whole rows audited."""

    ID = "half-noise-bare"
    audit_coordinatewise = False

    def claimed_step_tradeoff(self, sigma: float, options: Mapping[str, Any]) -> Any:
        return profile.claimed_profile(self, sigma, options=options)


class DpSgdBare(DpSgd):
    """Correct DP-SGD noise, claim read from its plan: the plan-envelope claim must not be called violated."""

    ID = "dpsgd-bare"
    audit_coordinatewise = False

    def claimed_step_tradeoff(self, sigma: float, options: Mapping[str, Any]) -> Any:
        return profile.claimed_profile(self, sigma, options=options)


def _claim(sigma: float, **_: Any) -> Gaussian:
    return Gaussian(mu=1.0 / sigma)


HALF_NOISE = HalfNoise()
HALF_NOISE_BARE = HalfNoiseBare()
DPSGD_BARE = DpSgdBare()


def _gredp_step(sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator, *,
                noise: str = "complex", **_: Any) -> np.ndarray:
    """Re(F^-1(F(V) + tau)), unitary FFT over each row. complex: tau_x, tau_y ~ N(0, sigma^2 C^2 / 2)
    (Theorem 1); real: tau ~ N(0, sigma^2 C^2) real-valued (Corollary 1)."""
    spectrum = np.fft.fft(np.asarray(sums, dtype=np.float64), axis=1, norm="ortho")
    if noise == "complex":
        tau = (rng.standard_normal(spectrum.shape) + 1j * rng.standard_normal(spectrum.shape)) * (
            sigma * clip / math.sqrt(2))
    elif noise == "real":
        tau = rng.standard_normal(spectrum.shape) * (sigma * clip)
    else:
        raise ValueError(f"unknown noise {noise!r}")
    return np.fft.ifft(spectrum + tau, axis=1, norm="ortho").real


def _gredp_cases(dim: int, clip: float, rng: np.random.Generator, **_: Any) -> list[AuditCase]:
    """The worst case for real noise: an odd-symmetric canary (e_k - e_{-k}) C / sqrt(2)."""
    k = int(rng.integers(1, dim // 2))
    canary = np.zeros(dim)
    canary[k], canary[dim - k] = clip / math.sqrt(2), -clip / math.sqrt(2)
    return [AuditCase("odd-symmetric", canary, np.zeros(dim), note="seed_004 5.4")]


class GredpReference(DpSgd):
    """A reference model of the GReDP noise written with numpy's FFT (its claim: G_{1/sigma})."""

    ID = "gredp-reference"
    audit_coordinatewise = False

    def privatize_step(self, sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator, *,
                       noise: str = "complex", **_: Any) -> np.ndarray:
        return _gredp_step(sums, sigma, clip, rng, noise=noise)

    def audit_cases(self, dim: int, clip: float, rng: np.random.Generator,
                    options: Mapping[str, Any]) -> list[AuditCase]:
        return _gredp_cases(dim, clip, rng, **options)


GREDP_REFERENCE = GredpReference()
