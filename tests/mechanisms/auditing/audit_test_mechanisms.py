"""Mechanisms that exist only to test the auditor (never registered): one broken on purpose, and
reference models of the GReDP noise (arXiv 2409.11663; docs/mechanisms.md)."""

from __future__ import annotations

import math
import types
from typing import Any

import numpy as np

from mechanisms import dpsgd
from mechanisms.auditing import AuditCase, Gaussian


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.ID = name
    module.plan = dpsgd.plan  # the claim: DP-SGD's analysis at the configured sigma
    module.audit_options = dpsgd.mechanism.audit_options  # the options DP-SGD's plan declares
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def _half_noise(sums: np.ndarray, sigma: float, clip: float, rng: np.random.Generator, **_: Any) -> np.ndarray:
    """The bug: claims sigma, adds sigma / 2."""
    return dpsgd.privatize_step(sums, sigma / 2, clip, rng)


def _claim(sigma: float, **_: Any) -> Gaussian:
    return Gaussian(mu=1.0 / sigma)


# Claims sigma but adds sigma/2, declares its hooks.
HALF_NOISE = _module("half-noise", privatize_step=_half_noise, claimed_step_tradeoff=_claim,
                     AUDIT_COORDINATEWISE=True)
# The same bug without any hook: the claim comes from plan(), the audit runs whole rows.
HALF_NOISE_BARE = _module("half-noise-bare", privatize_step=_half_noise)
# Correct DP-SGD noise but no hooks: the plan-envelope fallback must not call it violated.
DPSGD_BARE = _module("dpsgd-bare", privatize_step=dpsgd.privatize_step)


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


GREDP_REFERENCE = _module("gredp-reference", privatize_step=_gredp_step, claimed_step_tradeoff=_claim,
                          audit_cases=_gredp_cases)
