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

Certified rounding margin (mixed precision; docs/clipping.md has the full statement). The privacy guarantee
needs every clipped term the sum adds, c_i times what the recipe sums for example i, to have norm <= C when
taken exactly, whatever the rounding. Two things break it with Opacus' factor on a computed norm: the norm
is computed with rounding, and c_i is rounded to bf16 (up to (1 + u) c_i, u = 2^-8) and so is the rescaled
g_i c_i. So under bf16 / fp16 each recipe also reports U_i, an upper bound on the exact squared norm of its
term per unit of c_i, from gamma_n = n u32 / (1 - n u32) (any length-n fp32 dot product, in any order, is
within gamma_n sum |terms|):
* T = 1: U = |a|^2 |g|^2 (1 + 2 gamma_{p+2})(1 + 2 gamma_{d+2})(1 + u)^4 (rank one, entrywise rounding).
* ghost: with S_i = sum_t |a_it||g_it|, the Gram identity is within gamma_{p+d+T^2} S_i^2 (its terms have both
  signs: Cauchy-Schwarz bounds sum |A_st||G_st| by S_i^2), and rounding g_i c_i entrywise adds at most
  u c_i S_i, so U = (sqrt(norm2 + 2 gamma S_i^2) + u S_i)^2 (1 + u)^2.
* instantiated: U = norm2 (1 + 2 gamma_{n+2}), times (1 + u)^2 when c_i is rounded to bf16 for the sum.
Each bound takes a further 16 u32 for its own fp32 roundings; the engine sums them over tensors (2 gamma_{k+1})
and clips with min(1, C (1 - 16 u32) / (sqrt(U_i) + 1e-6)). fp32 / fp64 keep Opacus' factor (U = None).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

ClippedSum = Callable[[torch.Tensor], torch.Tensor]  # per-sample factors c (B,) -> sum_i c_i G_i
NORM_MODES = ("mixed", "ghost", "instantiate")
U32 = 2.0 ** -24  # fp32's unit roundoff
FP32_SLACK = 16 * U32  # covers the handful of fp32 roundings (adds, sqrt, square, the inflation's own multiply)


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps / 2: a rounding to nearest moves a (normal) number by at most u relative; bf16 2^-8, fp32 2^-24."""
    return torch.finfo(dtype).eps / 2


def gamma(n: int, dtype: torch.dtype) -> float:
    """gamma_n = n u / (1 - n u) (Higham, Accuracy and Stability, 3.1): any length-n sum of products computed
    in `dtype`, in any order or blocking, is within gamma_n sum |terms| of the exact value."""
    nu = n * unit_roundoff(dtype)
    return nu / (1 - nu) if nu < 0.5 else float("inf")


def matmul_gamma(n: int, dtype: torch.dtype) -> float:
    """gamma for an fp32 matmul, whose inputs may be rounded to TF32 (2^-11) or bf16 (2^-8) inside the kernel
    when `torch.set_float32_matmul_precision` is not "highest": n dot-product terms, each with two input
    roundings and one product rounding, hence 3 n + 1 roundings at the coarser unit."""
    if dtype != torch.float32 or torch.get_float32_matmul_precision() == "highest":
        return gamma(n, dtype)
    coarse = torch.bfloat16 if torch.get_float32_matmul_precision() == "medium" else None
    u = unit_roundoff(coarse) if coarse is not None else 2.0 ** -11
    nu = (3 * n + 1) * u
    return nu / (1 - nu) if nu < 0.5 else float("inf")


def narrow(dtype: torch.dtype) -> bool:
    """bf16 / fp16: the precisions whose rounding the certified margin covers (mixed precision)."""
    return torch.finfo(dtype).bits < 32


def inflate(x: torch.Tensor, rel: float) -> torch.Tensor:
    """x (1 + rel + FP32_SLACK): an upper bound that survives its own rounding and the fp32 work before it."""
    return x * (1.0 + rel + FP32_SLACK)


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


def wide_bmm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x @ y per batch, in at least fp32: the products of the norms' Gram matrices and per-sample gradients.

    Why: a product of two bf16 (or fp16) numbers is exact in fp32 (8 + 8, or 11 + 11, significant bits fit in
    24), so a narrow matmul that accumulates and writes fp32 computes the same exact products as an fp32 matmul
    of upcast copies, and the same bound gamma_n covers its fp32 sums in any order. On CUDA it is cuBLAS' bf16
    kernel (`out_dtype=torch.float32`: tensor cores, no fp32 copies of the activations and gradients; the
    reduced-precision reduction is turned off for it); elsewhere, where no such kernel exists, the inputs are
    upcast. fp32 / fp64 inputs multiply as they are."""
    wide = torch.promote_types(torch.promote_types(x.dtype, y.dtype), torch.float32)
    if x.is_cuda and x.dtype == y.dtype and narrow(x.dtype):
        with _full_precision_reduction():
            return torch.bmm(x, y, out_dtype=torch.float32)
    return torch.bmm(x if x.dtype == wide else x.to(wide), y if y.dtype == wide else y.to(wide))  # no op in fp32


@contextlib.contextmanager
def _full_precision_reduction() -> Iterator[None]:
    """cuBLAS may reduce a split-K bf16 / fp16 matmul's partial sums in the narrow dtype unless told not to:
    the bound assumes fp32 accumulation throughout."""
    flags = torch.backends.cuda.matmul
    kept = flags.allow_bf16_reduced_precision_reduction, flags.allow_fp16_reduced_precision_reduction
    flags.allow_bf16_reduced_precision_reduction = flags.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        flags.allow_bf16_reduced_precision_reduction, flags.allow_fp16_reduced_precision_reduction = kept


def outer_sum(a: torch.Tensor, g: torch.Tensor, ghost: bool
              ) -> tuple[torch.Tensor, ClippedSum, torch.Tensor | None]:
    """Per-sample squared norms of G_i = g_i^T a_i, the book-keeping clipped sum sum_i c_i G_i (d x p), and,
    in a narrow dtype, the certified upper bound on the squared norm each example adds to that sum per unit
    of c_i (docs/clipping.md, "Certified rounding margin"; None in fp32 / fp64).

    `a` is (B, T, p), `g` is (B, T, d). Ghost: the Gram identity above, and the clipped sum as one matmul
    of the rescaled output gradients with the activations. Instantiated: G by batched matmul, kept.
    Under mixed precision the norms (Gram matrices, instantiated G) are bf16 / fp16 products accumulated in
    fp32 (`wide_bmm`), and the clipped-sum matmul runs in the narrow dtype.
    """
    batch, positions, fan_in = a.shape
    fan_out = g.shape[-1]
    low = work_dtype(a, g)
    a, g = a.to(low), g.to(low)
    wide = norm_dtype(a)
    certify = narrow(low)
    u = unit_roundoff(low)
    if positions == 1:
        a1, g1 = a[:, 0], g[:, 0]
        na, ng = sq_norms(a1), sq_norms(g1)
        norm2 = na * ng
        # rank one: |bf16(g bf16(c))| <= c (1+u)^2 |g| entrywise, so the summed term has norm <= c (1+u)^2 |g||a|
        # one multiply (the step is launch-bound): the product's and the constant's roundings are in the slack
        rel = (1 + 2 * gamma(fan_in + 2, wide)) * (1 + 2 * gamma(fan_out + 2, wide)) * (1 + u) ** 4 - 1
        up = inflate(norm2, rel) if certify else None
        return norm2, lambda c: (g1 * c.to(low).unsqueeze(1)).t().matmul(a1), up
    if ghost:
        gram_a = wide_bmm(a, a.transpose(1, 2))
        gram_g = wide_bmm(g, g.transpose(1, 2))
        norm2 = torch.bmm(gram_a.view(batch, 1, -1), gram_g.view(batch, -1, 1)).view(batch)  # <A, G>_F
        del gram_a, gram_g
        up = None
        if certify:  # S_i = sum_t |a_it| |g_it| bounds every cancellation the Gram identity hides
            s_i = inflate((torch.linalg.vector_norm(a, dim=2, dtype=wide)
                           * torch.linalg.vector_norm(g, dim=2, dtype=wide)).sum(1),
                          2 * gamma(fan_in + fan_out + positions + 4, wide))
            err = inflate(s_i.square(), 0) * (2 * matmul_gamma(fan_in + fan_out + positions * positions + 4, wide))
            up = inflate(inflate(norm2.clamp_min(0) + err, 0).sqrt() + u * s_i, 0).square() * ((1 + u) ** 2)
            up = inflate(up, 0)

        def ghost_sum(c: torch.Tensor) -> torch.Tensor:
            c3 = c.to(low).view(-1, 1, 1)
            if fan_out <= fan_in:  # rescale the smaller of the two factors
                return (g * c3).reshape(-1, fan_out).t().matmul(a.reshape(-1, fan_in))
            return g.reshape(-1, fan_out).t().matmul((a * c3).reshape(-1, fan_in))

        return norm2, ghost_sum, up
    per_sample = wide_bmm(g.transpose(1, 2), a)  # (B, d, p)
    norm2 = sq_norms(per_sample)
    # the sum runs over this stored fp32 tensor with fp32 factors: only its norm's own rounding is left
    up = inflate(norm2, 2 * gamma(fan_in * fan_out + 2, wide)) if certify else None  # sq_norms, no matmul
    return norm2, lambda c: weighted_sum(c, per_sample), up


def weighted_sum(c: torch.Tensor, per_sample: torch.Tensor) -> torch.Tensor:
    """sum_i c_i X_i for X of shape (B, ...): one matrix-vector product."""
    if per_sample.shape[0] == 0:
        return per_sample.new_zeros(per_sample.shape[1:])
    return c.to(per_sample.dtype).matmul(per_sample.reshape(per_sample.shape[0], -1)).view(per_sample.shape[1:])


def instantiated(per_sample: torch.Tensor) -> tuple[torch.Tensor, ClippedSum, torch.Tensor | None]:
    """Squared norms and clipped sum of explicitly held per-sample gradients (B, *param_shape), and in a narrow
    dtype the certified bound (the norm's rounding, and c rounded to that dtype: (1 + u)^2 on the square)."""
    norm2 = sq_norms(per_sample)
    if not narrow(per_sample.dtype):
        return norm2, lambda c: weighted_sum(c, per_sample), None
    n = per_sample[0].numel() if per_sample.shape[0] else 1
    up = inflate(norm2, 2 * gamma(n + 2, norm2.dtype) + (1 + unit_roundoff(per_sample.dtype)) ** 2 - 1)
    return norm2, lambda c: weighted_sum(c, per_sample), up


def sq_norms(x: torch.Tensor) -> torch.Tensor:
    """|x_i|^2 over all but the first dimension, (B,), in at least fp32: one reduction kernel, no squared
    temporary (the upcast happens inside the kernel)."""
    return torch.linalg.vector_norm(x.flatten(1) if x.dim() > 1 else x.unsqueeze(1), dim=1,
                                    dtype=norm_dtype(x)).square()


def clip_factors(norms: torch.Tensor, bound: float) -> torch.Tensor:
    """Opacus' factor, min(1, C / (|G_i| + 1e-6)), so clipped sums match its optimizers exactly."""
    return (bound / (norms + 1e-6)).clamp(max=1.0)


def certified_factors(norm2_up: torch.Tensor, bound: float) -> torch.Tensor:
    """Opacus' factor from certified squared-norm bounds: min(1, C' / (sqrt(U_i) + 1e-6)), C' = C (1 - 16 u32)
    for the fp32 roundings of the sqrt, the add and the division. A bound that is NaN (the Gram identity's
    inf - inf after fp32 overflow) counts as infinite: factor 0, the example adds nothing."""
    inf = float("inf")
    up = torch.nan_to_num(norm2_up, nan=inf, posinf=inf, neginf=inf)
    return clip_factors(up.clamp_min(0).sqrt(), bound * (1 - FP32_SLACK))
