"""Coupled random permutations of a transformer block's permutation-invariant weights.

Why this exists: shuffled DP-SGD (arXiv 2407.15414 replaces
the weights after every update by a uniformly drawn *equivalent* model. A block computes the same
function when one applies, with index operations (never permutation matrices, paper Table VII):

- per head h, one permutation of the head's Q/K dimensions, the same for Q and K (Thm 4, P_1h);
- one permutation of the value dimensions shared by all heads, on V's outputs and on the output
  projection's inputs (Thm 4, P_2 and P_3 = blockdiag(P_2^T));
- one permutation of the MLP hidden units, on fc1's outputs (weight rows, bias) and fc2's inputs
  (Thm 3).

This module is layout-agnostic: a block is a `BlockLayout`, a list of `Target`s (tensor, axis,
segments). `permutation_hf.py` builds layouts for Hugging Face BERT/RoBERTa, ViT and GPT-2 blocks.
`permute_` applies one fresh draw to the weights and to the optimizer's element-wise state (Adam's
moments, momentum), without which training silently drifts from the unshuffled run.
`CanonicalFrame` remembers the cumulative permutation so noise can be drawn in the original
coordinates; a shuffled run then equals the unshuffled one step for step, not only in distribution.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

import torch

GROUPS = ("qk", "v", "mlp")  # the independent permutations drawn for one block


@dataclasses.dataclass(frozen=True)
class Target:
    """One axis of one tensor and how a block's permutations act on it.

    `parts` lists (group, offset) segments laid end to end along `axis`: a Linear query projection's
    output axis is `(("qk", 0),)`; GPT-2's fused c_attn output axis is
    `(("qk", 0), ("qk", D), ("v", 2 D))`, i.e. the columns [Q | K | V].
    """

    tensor: torch.Tensor
    axis: int
    parts: tuple[tuple[str, int], ...]
    name: str = ""

    def index(self, perms: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The gather index along `axis` for one draw of the block's group permutations."""
        if len(self.parts) == 1:
            group, offset = self.parts[0]
            return perms[group] + offset if offset else perms[group]
        return torch.cat([perms[group] + offset for group, offset in self.parts])


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """The permutation-invariant tensors of one transformer block and its geometry."""

    name: str
    heads: int
    head_dim: int
    ffn: int
    targets: tuple[Target, ...]

    def __post_init__(self) -> None:
        sizes = {"qk": self.heads * self.head_dim, "v": self.heads * self.head_dim, "mlp": self.ffn}
        for t in self.targets:
            if not 0 <= t.axis < t.tensor.dim():
                raise ValueError(f"{self.name}/{t.name}: axis {t.axis} out of range for {tuple(t.tensor.shape)}")
            length = sum(sizes[group] for group, _ in t.parts)
            if t.tensor.shape[t.axis] != length:
                raise ValueError(f"{self.name}/{t.name}: axis {t.axis} has size {t.tensor.shape[t.axis]}, "
                                 f"the layout expects {length}")

    @property
    def tensors(self) -> list[torch.Tensor]:
        seen: dict[int, torch.Tensor] = {}
        for t in self.targets:
            seen.setdefault(id(t.tensor), t.tensor)
        return list(seen.values())

    def sample(self, generator: torch.Generator, *, shared_value: bool = True) -> dict[str, torch.Tensor]:
        """One uniform draw of the block's group permutations (as gather indices, on CPU).

        Per-head permutations come from one argsort of float64 uniforms (ties have probability
        ~dh^2 2^-53, negligible) instead of `heads` separate `randperm` calls.
        """
        h, dh = self.heads, self.head_dim
        offsets = (torch.arange(h) * dh).unsqueeze(1)
        qk = (torch.rand(h, dh, generator=generator, dtype=torch.float64).argsort(dim=1) + offsets).reshape(-1)
        if shared_value:  # the paper's P_2: one permutation for every head
            v = (torch.randperm(dh, generator=generator).unsqueeze(0) + offsets).reshape(-1)
        else:  # also valid: an independent permutation per head
            v = (torch.rand(h, dh, generator=generator, dtype=torch.float64).argsort(dim=1) + offsets).reshape(-1)
        return {"qk": qk, "v": v, "mlp": torch.randperm(self.ffn, generator=generator)}


class CanonicalFrame:
    """Cumulative permutation per tensor axis: current = canonical.index_select(axis, index[axis]).

    Each shuffle gathers with `idx`, so the cumulative index becomes `index[idx]`. Noise drawn in the
    canonical shape and mapped with `to_current` lands where the unshuffled run would have put it.
    """

    def __init__(self) -> None:
        self._index: dict[torch.Tensor, dict[int, torch.Tensor]] = {}

    def compose(self, tensor: torch.Tensor, axis: int, idx: torch.Tensor) -> None:
        axes = self._index.setdefault(tensor, {})
        current = axes.get(axis)
        axes[axis] = idx if current is None else current[idx]

    def to_current(self, tensor: torch.Tensor, canonical: torch.Tensor) -> torch.Tensor:
        for axis, idx in self._index.get(tensor, {}).items():
            canonical = canonical.index_select(axis, idx)
        return canonical

    def index(self, tensor: torch.Tensor, axis: int) -> torch.Tensor | None:
        return self._index.get(tensor, {}).get(axis)


def _gather_(tensor: torch.Tensor, axis: int, idx: torch.Tensor,
             state: MutableMapping[Any, dict[str, Any]] | None, frame: CanonicalFrame | None) -> None:
    """Permute `tensor` along `axis` in place (same object), with its gradient and element-wise state."""
    tensor.data = tensor.data.index_select(axis, idx)
    if tensor.grad is not None:
        tensor.grad = tensor.grad.index_select(axis, idx)
    if state is not None and tensor in state:
        entry = state[tensor]
        for key, value in entry.items():
            if torch.is_tensor(value) and value.shape == tensor.shape:
                entry[key] = value.index_select(axis, idx)
    if frame is not None:
        frame.compose(tensor, axis, idx)


@torch.no_grad()
def permute_(layouts: Iterable[BlockLayout], generator: torch.Generator, *, optimizer: Any = None,
             frame: CanonicalFrame | None = None, shared_value: bool = True) -> None:
    """Apply a fresh coupled permutation to every block, its optimizer state and the frame.

    `optimizer.state` (a torch optimizer, or Opacus' DPOptimizer, which forwards it) is permuted for
    every state tensor shaped like its parameter; scalar entries such as Adam's `step` are left alone.
    Non-element-wise states (e.g. full-matrix preconditioners) are not supported.
    """
    state = getattr(optimizer, "state", None) if optimizer is not None else None
    for layout in layouts:
        perms = layout.sample(generator, shared_value=shared_value)
        device = layout.targets[0].tensor.device if layout.targets else None
        if device is not None and device.type != "cpu":
            perms = {k: v.to(device) for k, v in perms.items()}
        for target in layout.targets:
            _gather_(target.tensor, target.axis, target.index(perms), state, frame)


def permuted_numel(layouts: Iterable[BlockLayout]) -> int:
    """How many scalars the layouts move (each tensor counted once)."""
    seen: dict[int, int] = {}
    for layout in layouts:
        for t in layout.targets:
            seen[id(t.tensor)] = t.tensor.numel()
    return sum(seen.values())
