"""The maths shared by every layer family: per-sample norms of a sum of outer products, and the mixed rule.

A layer whose output at position t is y_t = W a_t (+ b) has, for one example i with activations
a_i = (a_i1, ..., a_iT) in R^{T x p} and output gradients g_i = (g_i1, ..., g_iT) in R^{T x d}, the
per-sample weight gradient G_i = sum_t g_it a_it^T = g_i^T a_i (d x p). Two ways to get ||G_i||_F:

* instantiate G_i with one batched matmul (2 B T p d flops, B p d floats held), then square and sum;
* the ghost norm (Goodfellow 2015, arXiv 1510.01799; Li et al. 2021, arXiv 2110.05679):
  ||g_i^T a_i||_F^2 = tr(a_i^T g_i g_i^T a_i) = sum_{s,t} (a_is . a_it)(g_is . g_it) = <a_i a_i^T, g_i g_i^T>_F,
  two T x T Gram matrices (2 B T^2 (p + d) flops, 2 B T^2 floats). For T = 1 it is |a_i|^2 |g_i|^2.

Mixed ghost clipping (Bu, Mao, Xu, NeurIPS 2022, arXiv 2205.10683) picks, per layer, the cheaper of the
two. Its rule compares the memory each needs, 2 B T^2 (two Gram matrices) against B p d (the per-sample
gradients): ghost when 2 T^2 < p d. On time alone, ghost wins when 2 B T^2 (p + d) < 2 B T p d, i.e.
T < p d / (p + d). In book-keeping (Bu, Wang, Zha, Karypis, ICML 2023, arXiv 2210.00038; the fastDP
library) the choice also decides what is kept for the clipped sum: a ghost layer keeps a and g and pays one
more matmul, sum_i c_i g_i^T a_i (the 2 B T p d flops of the non-private weight gradient, which book-keeping
never computed in the backward pass); an instantiated layer keeps G (B p d floats) and pays a weighted sum
over it (B p d reads, memory-bound). So in flops the instantiated path is never much slower, and the choice
is about memory and memory traffic (B p d floats written and read twice, against 2 B T^2): the paper's
space rule, which we use. Per-sample gradients of biases, LayerNorm affine parameters and embedding rows
are small (B d, or at most B T d) and always instantiated.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ClippedSum = Callable[[torch.Tensor], torch.Tensor]  # per-sample factors c (B,) -> sum_i c_i G_i
NORM_MODES = ("mixed", "ghost", "instantiate")


def prefer_ghost(positions: int, fan_in: int, fan_out: int, mode: str = "mixed") -> bool:
    """Mixed ghost rule (module docstring): ghost norm when 2 T^2 < p d, else instantiate."""
    if mode == "ghost" or positions == 1:  # T = 1: the ghost norm is two row norms, always the cheapest
        return True
    if mode == "instantiate":
        return False
    return 2 * positions * positions < fan_in * fan_out


def work_dtype(a: torch.Tensor, g: torch.Tensor) -> torch.dtype:
    """The dtype of the clipped-sum matmul: the narrower of the two (bf16 / fp16 under autocast, where the
    input of a layer can be fp32 and its output gradient bf16), as autocast computes the weight gradient."""
    return min((a.dtype, g.dtype), key=lambda d: torch.finfo(d).bits)


def norm_dtype(x: torch.Tensor) -> torch.dtype:
    """Per-sample norms and clipping factors are at least fp32 (float64 stays float64), whatever autocast
    made of the activations: a bf16 norm is off by up to 2^-8 relative and the factor with it."""
    return torch.promote_types(x.dtype, torch.float32)


def outer_sum(a: torch.Tensor, g: torch.Tensor, ghost: bool) -> tuple[torch.Tensor, ClippedSum]:
    """Per-sample squared norms of G_i = g_i^T a_i and the book-keeping clipped sum sum_i c_i G_i (d x p).

    `a` is (B, T, p), `g` is (B, T, d). Ghost: the Gram identity above, and the clipped sum as one matmul
    of the rescaled output gradients with the activations. Instantiated: G by batched matmul, kept.
    Under mixed precision the norms (Gram matrices, instantiated G) are computed in fp32 from the bf16 /
    fp16 activations and gradients, and the clipped-sum matmul runs in the narrow dtype.
    """
    batch, positions, fan_in = a.shape
    fan_out = g.shape[-1]
    low = work_dtype(a, g)
    a, g = a.to(low), g.to(low)
    wide = norm_dtype(a)
    if positions == 1:
        a1, g1 = a[:, 0], g[:, 0]
        norm2 = sq_norms(a1) * sq_norms(g1)
        return norm2, lambda c: (g1 * c.to(low).unsqueeze(1)).t().matmul(a1)
    if ghost:
        aw, gw = a.to(wide), g.to(wide)  # no copy in fp32
        gram_a = torch.bmm(aw, aw.transpose(1, 2))
        gram_g = torch.bmm(gw, gw.transpose(1, 2))
        norm2 = torch.bmm(gram_a.view(batch, 1, -1), gram_g.view(batch, -1, 1)).view(batch)  # <A, G>_F
        del gram_a, gram_g, aw, gw

        def ghost_sum(c: torch.Tensor) -> torch.Tensor:
            c3 = c.to(low).view(-1, 1, 1)
            if fan_out <= fan_in:  # rescale the smaller of the two factors
                return (g * c3).reshape(-1, fan_out).t().matmul(a.reshape(-1, fan_in))
            return g.reshape(-1, fan_out).t().matmul((a * c3).reshape(-1, fan_in))

        return norm2, ghost_sum
    per_sample = torch.bmm(g.to(wide).transpose(1, 2), a.to(wide))  # (B, d, p)
    norm2 = sq_norms(per_sample)
    return norm2, lambda c: weighted_sum(c, per_sample)


def weighted_sum(c: torch.Tensor, per_sample: torch.Tensor) -> torch.Tensor:
    """sum_i c_i X_i for X of shape (B, ...): one matrix-vector product."""
    if per_sample.shape[0] == 0:
        return per_sample.new_zeros(per_sample.shape[1:])
    return c.to(per_sample.dtype).matmul(per_sample.reshape(per_sample.shape[0], -1)).view(per_sample.shape[1:])


def instantiated(per_sample: torch.Tensor) -> tuple[torch.Tensor, ClippedSum]:
    """Squared norms and clipped sum of explicitly held per-sample gradients (B, *param_shape)."""
    return sq_norms(per_sample), lambda c: weighted_sum(c, per_sample)


def sq_norms(x: torch.Tensor) -> torch.Tensor:
    """|x_i|^2 over all but the first dimension, (B,), in at least fp32: one reduction kernel, no squared
    temporary (the upcast happens inside the kernel)."""
    return torch.linalg.vector_norm(x.flatten(1) if x.dim() > 1 else x.unsqueeze(1), dim=1,
                                    dtype=norm_dtype(x)).square()


def clip_factors(norms: torch.Tensor, bound: float) -> torch.Tensor:
    """Opacus' factor, min(1, C / (|G_i| + 1e-6)), so clipped sums match its optimizers exactly."""
    return (bound / (norms + 1e-6)).clamp(max=1.0)
