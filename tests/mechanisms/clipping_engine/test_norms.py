"""The per-sample norms (norms.py): the mixed rule that picks the ghost norm, and the certified rounding margin
(docs/clipping.md): under bf16, every clipped per-example gradient, recomputed in fp64 from the very bf16 / fp32
tensors the engine sums, has norm <= the bound, over adversarial inputs (a dynamic range of 1e-30..1e15 per entry,
long sequences of tiny cancelling terms, norms right at the bound, random). The same inputs clipped with the plain
factor min(1, C / (|G_i| + 1e-6)) exceed the bound, which is what the margin is for."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from mechanisms.clipping_engine.norms import gamma, instantiated, outer_sum, prefer_ghost

sys.path.insert(0, str(Path(__file__).parents[3] / "benchmarks"))

from rounding_margin import BOUND, LOW, factors, worst


def test_certified_margin_keeps_every_clipped_example_within_the_bound() -> None:
    res = worst(torch.device("cpu"))  # benchmarks/gpu_check.py's `margin` part runs the same check on CUDA
    print(f"max fp64 norm / bound: plain factor {res['plain']!r}, certified {res['certified']!r}")
    assert res["certified"] <= 1.0, res
    assert res["plain"] > 1.0  # the adversarial set does break the uncertified factor


def test_instantiated_bf16_margin() -> None:
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(64, 40, generator=gen) * torch.pow(10.0, torch.empty(64, 1).uniform_(-20, 10, generator=gen)))
    x = x.to(LOW)
    norm2, _, up = instantiated(x)
    scale = BOUND * (1 + 2**-9) / norm2.double().sqrt()
    x = (x.double() * scale.view(-1, 1)).to(LOW)
    norm2, _, up = instantiated(x)
    plain, certified = factors(norm2, up)
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


def test_mixed_rule():
    assert prefer_ghost(1, 3, 3)  # no positions: always the ghost norm
    assert prefer_ghost(64, 128, 128) and not prefer_ghost(196, 25, 16)  # 2 T^2 < p d
    assert not prefer_ghost(64, 128, 128, "instantiate") and prefer_ghost(196, 25, 16, "ghost")
