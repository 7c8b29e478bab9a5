"""bf16 autocast against Opacus' hooks (float64) on the registry models that run fast on CPU, and the
compiled step against the eager one.

The bf16 tolerance. bf16 keeps 8 significant bits: one rounding is off by at most u = 2^-8 (3.9e-3)
relative. Under autocast every matmul of the forward and of the input-gradient backward rounds its output
to bf16; the engine then computes each per-sample norm in fp32 from the bf16 activations a and output
gradients g. |G_i| = |g_i^T a_i| moves by about the relative error of a and g, each one rounding plus what
the layers before passed on: we allow 2u = 2^-7 on every per-sample norm (measured at most 0.8u on these
models at batch 32). The clipped sum is returned by a bf16 matmul (one more rounding of every coordinate)
and the input gradients that reach the first layers went through every layer's bf16 rounding, so the whole
clipped gradient (all tensors as one vector) is allowed 8u = 2^-5 relative (measured at most 2.3e-2, on
bert-tiny, whose 2-layer encoder sits behind a 30k-row embedding). No clipped example exceeds the bound:
the factors come from certified upper bounds on the norms (norms.py; test_norms.py), and the
noise (fp32, after the step) is unchanged. The test also checks that bf16 really ran
(the error is above fp32's 1e-5), so a silently ignored autocast cannot pass.
"""

from __future__ import annotations

import copy

import pytest
import torch
from bk_reference import bookkeeping, opacus_hooks
from test_registry_models import _case
from torch import nn

from mechanisms.clipping_engine import BookkeepingEngine, BookkeepingLoss

U_BF16 = 2.0 ** -8
NORM_TOL = 2 * U_BF16
SUM_TOL = 8 * U_BF16


def _bk(model: nn.Module, inputs, y, bound: float, dtype: torch.dtype | None = None, compile_step: bool = False):
    model = copy.deepcopy(model)
    engine = BookkeepingEngine(model, bound)
    forward = torch.compile(model) if compile_step else model
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        loss = BookkeepingLoss(engine, nn.CrossEntropyLoss())(forward(*inputs), y)
    loss.backward()
    return engine.per_sample_norms, [p.grad for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("case", ["mlp", "cnn-small", "vit-tiny", "bert-tiny", "gpt2-tiny"])
def test_bf16_matches_opacus_hooks_within_the_stated_tolerance(case):
    module, inputs, y, chunk = _case(case, 32)
    norms, sums = opacus_hooks(module, inputs, y, 0.5, chunk=chunk)
    got_norms, got_sums = _bk(module, inputs, y, 0.5, torch.bfloat16)
    assert got_norms.dtype == torch.float32 and all(g.dtype == torch.float32 for g in got_sums)
    norm_err = ((got_norms - norms).abs() / norms).max().item()
    whole = torch.cat([s.flatten() for s in sums])
    sum_err = ((torch.cat([g.flatten() for g in got_sums]) - whole).norm() / whole.norm()).item()
    assert norm_err <= NORM_TOL, f"per-sample norms off by {norm_err:.2e} relative (allowed {NORM_TOL:.2e})"
    assert sum_err <= SUM_TOL, f"clipped gradient off by {sum_err:.2e} relative (allowed {SUM_TOL:.2e})"
    assert max(norm_err, sum_err) > 1e-5  # bf16 really ran (fp32 is within 1e-5)
    assert (norms > 0.5).any()  # clipping was active


def test_compiled_step_gives_the_eager_clipped_sums():
    """torch.compile of a bk model: the engine's Functions run in eager code under Dynamo, same sums."""
    if not torch._dynamo.is_dynamo_supported():
        pytest.fail("torch.compile is unsupported here; train: {compile: true} refuses it (acceleration.compiled)")
    module, inputs, y, _ = _case("mlp", 16)
    eager = bookkeeping(module, inputs, y, 0.5)
    norms, sums = _bk(module, inputs, y, 0.5, compile_step=True)
    assert torch.allclose(norms, eager[0], rtol=1e-6, atol=1e-7)
    for a, b in zip(eager[1], sums, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
