"""The certified rounding margin, checked on a device: every clipped per-example gradient under bf16, recomputed
in fp64 from the very tensors the engine sums, has norm <= the bound.

    python benchmarks/rounding_margin.py [--device cuda]

Why a device matters: on CUDA the norms' products run in cuBLAS' bf16 kernels with fp32 accumulation
(`mechanisms.clipping_engine.norms.wide_bmm`), on the CPU in fp32 from upcast copies; the margin must hold for
the kernels that ran. The inputs are adversarial (docs/clipping.md, "Certified rounding margin"): entries over
1e-30..1e15 (squares overflow fp32), long sequences of tiny cancelling terms, norms right at the bound (within
2^-8 on either side), and random ones. The same inputs clipped with the plain factor min(1, C / (|G_i| + 1e-6))
exceed the bound, which shows the set is adversarial enough. `benchmarks/gpu_check.py --parts margin` runs it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # privbench from this checkout

from mechanisms.clipping_engine.norms import (
    certified_factors,
    clip_factors,
    gamma,
    inflate,
    outer_sum,
    wide_bmm,
)

BOUND = 1.0
LOW = torch.bfloat16
SHAPES = ((1, 24, 16), (12, 16, 40), (12, 40, 16), (64, 8, 8))  # (positions T, fan-in p, fan-out d)


def cases(device: torch.device, seed: int = 0) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, a, g) in bf16 on `device`, drawn on the CPU (the same set on every device)."""
    gen = torch.Generator().manual_seed(seed)

    def wide(shape: tuple[int, ...]) -> torch.Tensor:  # sign * 10^U(-30, 15)
        exps = torch.empty(shape).uniform_(-30, 15, generator=gen)
        return torch.randn(shape, generator=gen).sign() * torch.pow(10.0, exps)

    out = []
    for positions, fan_in, fan_out in SHAPES:
        shape_a, shape_g = (32, positions, fan_in), (32, positions, fan_out)
        out.append(("random", torch.randn(shape_a, generator=gen), torch.randn(shape_g, generator=gen)))
        out.append(("dynamic range", wide(shape_a), wide(shape_g)))
        # one row of size 1 and many tiny ones whose output gradients alternate in sign: the ghost identity
        # sums T^2 terms of both signs that nearly cancel
        a = torch.randn(shape_a, generator=gen) * 1e-3
        a[:, 0] = torch.randn(shape_a[0], fan_in, generator=gen)
        g = torch.ones(shape_g) * (torch.arange(positions) % 2 * 2 - 1).view(1, -1, 1).float()
        g = g + 1e-3 * torch.randn(shape_g, generator=gen)
        out.append(("tiny cancelling", a, g))
    return [(name, a.to(device, LOW), g.to(device, LOW)) for name, a, g in out]


def at_bound(a: torch.Tensor, g: torch.Tensor, ghost: bool, rel: float) -> torch.Tensor:
    """a rescaled so that each example's computed norm is BOUND (1 + rel)."""
    norm2, _, _ = outer_sum(a, g, ghost)
    scale = BOUND * (1 + rel) / norm2.double().clamp_min(1e-300).sqrt()
    scale = torch.where(torch.isfinite(scale), scale, torch.ones_like(scale))
    return (a.double() * scale.view(-1, 1, 1)).to(LOW)


def summed_norms(a: torch.Tensor, g: torch.Tensor, ghost: bool, c: torch.Tensor) -> torch.Tensor:
    """fp64 norms of the per-example terms the clipped sum adds, from the same rounded tensors it sums (outer_sum's
    recipes: g * c or a * c rounded to bf16, or c_i times the stored fp32 G_i made by the same kernel)."""
    positions, fan_in, fan_out = a.shape[1], a.shape[2], g.shape[2]
    if positions == 1:
        gs = g[:, 0] * c.to(LOW).unsqueeze(1)
        return gs.double().norm(dim=1) * a[:, 0].double().norm(dim=1)
    if ghost:
        c3 = c.to(LOW).view(-1, 1, 1)
        if fan_out <= fan_in:
            terms = torch.bmm((g * c3).double().transpose(1, 2), a.double())
        else:
            terms = torch.bmm(g.double().transpose(1, 2), (a * c3).double())
        return terms.flatten(1).norm(dim=1)
    per_sample = wide_bmm(g.transpose(1, 2), a)
    return (c.double().view(-1, 1, 1) * per_sample.double()).flatten(1).norm(dim=1)


def factors(norm2: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(plain, certified) flat factors for one tensor, as the engine combines them."""
    plain = clip_factors(norm2.clamp_min(0).sqrt(), BOUND)
    return plain, certified_factors(inflate(up, 2 * gamma(2, up.dtype)), BOUND)


def worst(device: torch.device) -> dict[str, float]:
    """The largest fp64 norm / bound over the set, with the plain factor and with the certified one."""
    out = {"plain": 0.0, "certified": 0.0}
    for _name, a0, g in cases(device):
        for ghost in (True, False):
            for a in [a0] + [at_bound(a0, g, ghost, rel) for rel in (-2**-8, -2**-10, 0.0, 2**-10, 2**-8)]:
                norm2, _, up = outer_sum(a, g, ghost)
                if up is None:
                    raise AssertionError("a bf16 recipe reported no certified bound")
                for which, c in zip(("plain", "certified"), factors(norm2, up), strict=True):
                    norms = summed_norms(a, g, ghost, c)
                    if which == "certified" and torch.isnan(norms).any():
                        raise AssertionError("a certified clipped term is NaN")
                    out[which] = max(out[which], float(torch.nan_to_num(norms, nan=0.0).max()) / BOUND)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    res = worst(torch.device(ap.parse_args(argv).device))
    print(f"max fp64 norm / bound: plain factor {res['plain']!r}, certified {res['certified']!r}")
    return 0 if res["certified"] <= 1.0 < res["plain"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
