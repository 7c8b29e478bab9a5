"""The certified rounding margin (norms.py, docs/clipping.md): under bf16, every clipped per-example gradient,
recomputed in fp64 from the very bf16 / fp32 tensors the engine sums, has norm <= the bound, over adversarial
inputs (a dynamic range of 1e-30..1e15 per entry, long sequences of tiny cancelling terms, norms right at the
bound, random). The same inputs clipped with the plain factor min(1, C / (|G_i| + 1e-6)) exceed the bound,
which is what the margin is for."""

from __future__ import annotations

import math

import torch

from mechanisms.clipping_engine.norms import (
    certified_factors,
    clip_factors,
    gamma,
    inflate,
    instantiated,
    outer_sum,
)

BOUND = 1.0
LOW = torch.bfloat16


def _cases(seed: int = 0) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for positions, fan_in, fan_out in ((1, 24, 16), (12, 16, 40), (12, 40, 16), (64, 8, 8)):
        shape_a, shape_g = (32, positions, fan_in), (32, positions, fan_out)
        out.append(("random", torch.randn(shape_a, generator=gen), torch.randn(shape_g, generator=gen)))
        def wide(shape):  # sign * 10^U(-30, 15): squares overflow fp32 for the largest (inf / NaN norms)
            exps = torch.empty(shape).uniform_(-30, 15, generator=gen)
            return torch.randn(shape, generator=gen).sign() * torch.pow(10.0, exps)
        out.append(("dynamic range", wide(shape_a), wide(shape_g)))
        # one row of size 1 and many tiny ones whose output gradients alternate in sign: the ghost identity
        # sums T^2 terms of both signs that nearly cancel
        a = torch.randn(shape_a, generator=gen) * 1e-3
        a[:, 0] = torch.randn(shape_a[0], fan_in, generator=gen)
        g = torch.ones(shape_g) * (torch.arange(positions) % 2 * 2 - 1).view(1, -1, 1).float()
        g = g + 1e-3 * torch.randn(shape_g, generator=gen)
        out.append(("tiny cancelling", a, g))
    return [(name, a.to(LOW), g.to(LOW)) for name, a, g in out]


def _at_bound(a: torch.Tensor, g: torch.Tensor, ghost: bool, rel: float) -> torch.Tensor:
    """Rescale a so that each example's computed norm is BOUND (1 + rel)."""
    norm2, _, _ = outer_sum(a, g, ghost)
    scale = BOUND * (1 + rel) / norm2.double().clamp_min(1e-300).sqrt()
    scale = torch.where(torch.isfinite(scale), scale, torch.ones_like(scale))
    return (a.double() * scale.view(-1, 1, 1)).to(LOW)


def _summed_norms(a: torch.Tensor, g: torch.Tensor, ghost: bool, c: torch.Tensor) -> torch.Tensor:
    """fp64 norms of the per-example terms the clipped sum adds, from the same rounded tensors it sums
    (mirrors outer_sum's recipes: g * c or a * c rounded to bf16, or c_i times the stored fp32 G_i)."""
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
    per_sample = torch.bmm(g.float().transpose(1, 2), a.float())
    return (c.double().view(-1, 1, 1) * per_sample.double()).flatten(1).norm(dim=1)


def _factors(norm2: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(plain, certified) flat factors for one tensor, as the engine combines them."""
    plain = clip_factors(norm2.clamp_min(0).sqrt(), BOUND)
    return plain, certified_factors(inflate(up, 2 * gamma(2, up.dtype)), BOUND)


def _worst() -> tuple[float, float]:
    worst_plain, worst_certified = 0.0, 0.0
    for _name, a0, g in _cases():
        for ghost in (True, False):
            for a in [a0] + [_at_bound(a0, g, ghost, rel) for rel in (-2**-8, -2**-10, 0.0, 2**-10, 2**-8)]:
                norm2, _, up = outer_sum(a, g, ghost)
                assert up is not None
                plain, certified = _factors(norm2, up)
                for c, which in ((plain, "plain"), (certified, "certified")):
                    norms = _summed_norms(a, g, ghost, c)
                    assert not torch.isnan(norms).any() or which == "plain"
                    ratio = float(torch.nan_to_num(norms, nan=0.0).max()) / BOUND
                    if which == "plain":
                        worst_plain = max(worst_plain, ratio)
                    else:
                        worst_certified = max(worst_certified, ratio)
    return worst_plain, worst_certified


def test_certified_margin_keeps_every_clipped_example_within_the_bound() -> None:
    worst_plain, worst_certified = _worst()
    print(f"max fp64 norm / bound: plain factor {worst_plain!r}, certified {worst_certified!r}")
    assert worst_certified <= 1.0, worst_certified
    assert worst_plain > 1.0  # the adversarial set does break the uncertified factor


def test_instantiated_bf16_margin() -> None:
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(64, 40, generator=gen) * torch.pow(10.0, torch.empty(64, 1).uniform_(-20, 10, generator=gen)))
    x = x.to(LOW)
    norm2, _, up = instantiated(x)
    scale = BOUND * (1 + 2**-9) / norm2.double().sqrt()
    x = (x.double() * scale.view(-1, 1)).to(LOW)
    norm2, _, up = instantiated(x)
    plain, certified = _factors(norm2, up)
    summed = lambda c: (c.to(LOW).double().view(-1, 1) * x.double()).norm(dim=1)  # noqa: E731
    assert float(summed(certified).max()) <= BOUND
    assert float(summed(plain).max()) > BOUND


def test_fp32_keeps_opacus_factor() -> None:
    """fp32 / fp64 work needs no certified bound (None): the engine keeps Opacus' factor bit for bit."""
    a, g = torch.randn(4, 3, 5), torch.randn(4, 3, 6)
    assert outer_sum(a, g, True)[2] is None and instantiated(a)[2] is None
    assert math.isfinite(gamma(10, torch.float32))


def test_engine_clips_with_the_certified_bounds_under_bf16_only() -> None:
    from torch import nn

    from mechanisms.clipping_engine import BookkeepingEngine, BookkeepingLoss

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(16, 5, 6), torch.randint(0, 3, (16,))
    for dtype in (torch.bfloat16, None):
        engine = BookkeepingEngine(model, 0.1)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = BookkeepingLoss(engine, nn.CrossEntropyLoss())(model(x).mean(1), y)
        loss.backward()
        engine.detach()
        model.zero_grad()
        if dtype is None:
            assert engine.per_sample_bounds is None
            continue
        ratio = engine.per_sample_bounds / engine.per_sample_norms
        print(f"bf16 certified bound / computed norm: max {ratio.max().item():.5f}")
        assert bool((ratio >= 1.0).all()) and bool((ratio < 1.05).all())
