"""Which layer families the book-keeping engine clips, and how a module is handed to its rule.

A rule replaces the forward of one module instance by a version whose parameters enter through a custom
autograd Function. That Function's backward returns the input gradient only (never a parameter gradient,
so autograd does no weight-gradient work and never writes `p.grad`) and hands the saved activations and
the output gradient to the module's `Tap`, which computes per-sample norms and the clipped-sum recipe.
Rules register here, one module per layer family (as Opacus' `grad_sample/`); `rules()` imports them all,
so import order never matters.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mechanisms.clipping_engine.norms import ClippedSum


def autocast_weight(weight: torch.Tensor) -> torch.Tensor:
    """The weight in the autocast dtype when the forward runs under autocast (else unchanged). A rule's
    forward casts it once, uses it, and saves it for the input gradient, as autocast's own layers do, instead
    of a second cast in the backward pass."""
    kind = weight.device.type
    if torch.is_autocast_enabled(kind) and weight.is_floating_point():
        return weight.to(torch.get_autocast_dtype(kind))
    return weight


class UnsupportedModule(ValueError):
    """A module with trainable parameters the engine cannot clip per sample (the message names it)."""


@dataclasses.dataclass
class Tap:
    """What a replaced forward needs: the engine to report to, the module's name and its norm mode."""

    engine: Any
    name: str
    module: nn.Module
    norm_mode: str = "mixed"

    def live(self) -> bool:
        """Record only when autograd records (evaluation under no_grad runs the original forward)."""
        return self.engine.enabled and torch.is_grad_enabled()

    def grouped(self, x: torch.Tensor, scaled: bool = False) -> torch.Tensor:
        """A layer's per-row tensor (B, T, k) as the step's groups (count, width * T, k) when the engine clips
        groups of rows (`mechanisms.parts.grouping.regroup`; `scaled`: the output gradient, which carries the
        group's scale); as it is otherwise."""
        groups = self.engine.groups
        if groups is None:
            return x
        from mechanisms.parts.grouping import regroup  # lazy: heavy (numpy)

        return regroup(x, groups, scaled)

    def trainable(self, param: torch.Tensor | None) -> bool:
        return param is not None and param.requires_grad

    def record(self, param: torch.Tensor, norm2: torch.Tensor, clipped_sum: ClippedSum,
               norm2_up: torch.Tensor | None = None) -> None:
        """`norm2_up`: the certified bound on the squared norm of what `clipped_sum` adds per example per unit
        of c_i (norms.py), when it differs from `norm2` (mixed precision)."""
        self.engine.contribute(param, norm2, clipped_sum, norm2_up)


@dataclasses.dataclass(frozen=True)
class Rule:
    """`forward(module, tap, *args, **kwargs)` replaces `module.forward`; `check(module)` returns why this
    configuration of the module is not supported (or None); `params` are the direct parameters it clips."""

    name: str
    matches: Callable[[nn.Module], bool]
    params: tuple[str, ...]
    forward: Callable[..., Any]
    check: Callable[[nn.Module], str | None] = lambda module: None


_RULES: list[Rule] = []
_FAMILIES = ("linear", "conv", "embedding", "layernorm", "hf_conv1d", "hf_vit")


def register(rule: Rule) -> Rule:
    if any(r.name == rule.name for r in _RULES):
        raise ValueError(f"book-keeping rule {rule.name!r} registered twice")
    _RULES.append(rule)
    return rule


def exact_type(cls: type) -> Callable[[nn.Module], bool]:
    """Match the class itself, not subclasses: a subclass may change forward (LoRA, quantised layers)."""
    return lambda module: type(module) is cls


def rules() -> list[Rule]:
    for family in _FAMILIES:
        importlib.import_module(f"mechanisms.clipping_engine.{family}")
    return list(_RULES)


def rule_for(module: nn.Module) -> Rule | None:
    return next((r for r in rules() if r.matches(module)), None)
