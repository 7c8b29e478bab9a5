"""The clipping parts' declared sensitivity holds on what Opacus really runs: their clipped sum is Opacus', a
worst-case pair of neighbouring batches attains the declared sensitivity, and random pairs never exceed it."""

from __future__ import annotations

import pytest
import torch
from clipped_sums import ADD_REMOVE, REPLACE, distance, grads, opacus_clipped_sum
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.parts.clipping import FlatClipping, PerLayerClipping

CLIPPERS = [FlatClipping(0.7), PerLayerClipping((0.3, 0.5, 0.2)), PerLayerClipping.splitting(1.3, 3)]


@pytest.mark.parametrize("clipper", CLIPPERS, ids=repr)
def test_clip_and_sum_is_what_opacus_runs(clipper):
    per_example = grads(9, 1.0, torch.Generator().manual_seed(0))
    for ours, theirs in zip(clipper.clip_and_sum(per_example), opacus_clipped_sum(clipper, per_example), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("clipper", CLIPPERS, ids=repr)
def test_clipping_sensitivity_is_attained_by_a_worst_case_pair(clipper):
    gen = torch.Generator().manual_seed(1)
    base = grads(5, 1.0, gen)
    big = [10.0 * g for g in grads(1, 1.0, gen)]  # far above every bound: clipped to it exactly
    added = [torch.cat([b, x]) for b, x in zip(base, big, strict=True)]
    gap = distance(opacus_clipped_sum(clipper, added), opacus_clipped_sum(clipper, base))
    assert gap == pytest.approx(clipper.sensitivity(ADD_REMOVE), rel=1e-4)
    replaced = [torch.cat([b[:-1], -x]) for b, x in zip(added, big, strict=True)]  # that example, negated
    gap = distance(opacus_clipped_sum(clipper, added), opacus_clipped_sum(clipper, replaced))
    assert gap == pytest.approx(clipper.sensitivity(REPLACE), rel=1e-4)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 8), scale=st.floats(0.01, 5.0),
       which=st.integers(0, len(CLIPPERS) - 1))
def test_clipping_sensitivity_is_never_exceeded(seed, batch, scale, which):
    clipper = CLIPPERS[which]
    gen = torch.Generator().manual_seed(seed)
    base, extra, other = grads(batch, scale, gen), grads(1, scale * 3, gen), grads(1, scale * 3, gen)
    added = [torch.cat([b, x]) for b, x in zip(base, extra, strict=True)]
    replaced = [torch.cat([b, y]) for b, y in zip(base, other, strict=True)]
    s_base, s_added = opacus_clipped_sum(clipper, base), opacus_clipped_sum(clipper, added)
    assert distance(s_added, s_base) <= clipper.sensitivity(ADD_REMOVE) * (1 + 1e-9)
    assert distance(s_added, opacus_clipped_sum(clipper, replaced)) <= clipper.sensitivity(REPLACE) * (1 + 1e-9)
