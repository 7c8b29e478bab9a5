"""DP-Forward's noise layer: per-example Frobenius normalisation to C, then i.i.d. Gaussian noise, added to a
BERT-style model's hidden states by forward hooks at one position (arXiv 2309.06746, sections 3.1-3.2).

Positions (the paper's Table 5 / Figure 3, and the released code's `noise_position`):

| position                 | tensor noised (shape n x d, or 1 x d for `pooled`)                            |
|--------------------------|--------------------------------------------------------------------------------|
| `embedding`              | embeddings output: LayerNorm(token + position + type), after dropout          |
| `encoder-<k>-mha`        | attention output projection after dropout, BEFORE the residual; the Add&Norm  |
|                          | then runs without the residual                                                 |
| `encoder-<k>-add-norm-1` | LayerNorm(attention + input): output of the first Add&Norm                    |
| `encoder-<k>-ffn`        | second FFN dense output, BEFORE dropout and residual; Add&Norm without residual |
| `encoder-<k>-add-norm-2` | output of encoder layer k (= `encoder-<k>`, the paper's "Encoder k")          |
| `last-encoder[-<sub>]`   | the same for the last layer                                                    |
| `pooled` (alias `output`)| the task head's input: BertPooler's tanh(W h_CLS), or a mean-pooling head's   |

k is 1-based, as in the paper's tables (the released code's `--noise_layer` is 0-based). At `mha` and
`ffn` the residual must be dropped: otherwise the post-noise layers re-read the clean input X.

The hooks only find modules by structure (an `embeddings` + `encoder.layer` backbone; layers with
`attention.output.{dense,dropout}` and `output.{dense,dropout}`), so they work on any BERT-family model
(BERT, MiniLM, RoBERTa, ...), bare or inside an adapter, with no change to its code. Noise is drawn in
training AND in eval mode (DP-Forward inference) unless `inference_noise=False`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from mechanisms.parts.noise_addition import GaussianNoise

SUBLAYERS = ("mha", "add-norm-1", "ffn", "add-norm-2")
NORMALIZATIONS = ("normalize", "clip")
_ENCODER = re.compile(r"(?:encoder-(\d+)|last-encoder)(?:-(mha|add-norm-1|ffn|add-norm-2))?")
POSITION_HELP = ("embedding | encoder-<k>[-<sub>] | last-encoder[-<sub>] | pooled (alias output), "
                 f"k 1-based, sub one of {', '.join(SUBLAYERS)}")

Observer = Callable[[torch.Tensor, torch.Tensor], None]  # (bounded input, released output) per release


@dataclasses.dataclass(frozen=True)
class Position:
    """Where noise goes. `layer` is 1-based; 0 means "the last layer" until `resolve` knows the depth."""

    kind: str  # "embedding" | "encoder" | "pooled"
    layer: int | None = None
    sublayer: str | None = None

    @property
    def name(self) -> str:
        if self.kind != "encoder":
            return self.kind
        head = "last-encoder" if self.layer == 0 else f"encoder-{self.layer}"
        return f"{head}-{self.sublayer}"

    @property
    def sequence_level(self) -> bool:
        """True when one release is a whole n x d matrix (its shape and mask depend on the sequence length)."""
        return self.kind != "pooled"

    def resolve(self, num_layers: int) -> Position:
        """`last-encoder` -> the model's last layer; checks that layer k exists."""
        if self.kind != "encoder":
            return self
        layer = num_layers if self.layer == 0 else self.layer
        if not 1 <= layer <= num_layers:  # type: ignore[operator]
            raise ValueError(f"position {self.name!r}: the model has {num_layers} encoder layers (1-based)")
        return dataclasses.replace(self, layer=layer)


def parse_position(text: str) -> Position:
    """Parse a position name (see the module docstring); raises ValueError listing the grammar."""
    name = str(text).strip().lower().replace("_", "-")
    if name == "embedding":
        return Position("embedding")
    if name in ("pooled", "output"):
        return Position("pooled")
    match = _ENCODER.fullmatch(name)
    if match is None or (match.group(1) is not None and int(match.group(1)) < 1):
        raise ValueError(f"unknown dp-forward position {text!r}; expected {POSITION_HELP}")
    layer = int(match.group(1)) if match.group(1) is not None else 0
    return Position("encoder", layer, match.group(2) or "add-norm-2")


def bound_norm(hidden: torch.Tensor, clip: float, normalization: str = "normalize") -> torch.Tensor:
    """Scale each example (dim 0) to Frobenius norm exactly `clip` (normalize) or at most `clip` (clip).

    Either way every release has norm <= C, so two examples differ by at most 2C (replace-one). A zero
    matrix stays zero under `normalize` (it has no direction), which keeps that bound.
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    norms = hidden.reshape(hidden.shape[0], -1).norm(dim=1).clamp_min(torch.finfo(hidden.dtype).tiny)
    scale = clip / norms
    if normalization == "clip":
        scale = scale.clamp(max=1.0)
    return hidden * scale.view(-1, *([1] * (hidden.dim() - 1)))


@dataclasses.dataclass
class BertParts:
    """The pieces of a BERT-family model the hooks attach to."""

    backbone: nn.Module  # has .embeddings and .encoder.layer
    embeddings: nn.Module
    layers: nn.ModuleList
    pooled_module: nn.Module  # its output (BertPooler) or its input (a pooling head's dropout) is noised
    pooled_is_input: bool


def _pooling_head(model: nn.Module) -> nn.Module | None:
    """An adapter that pools hidden states itself (`pooling` set) into `head(dropout(pooled))`."""
    for module in model.modules():
        if (isinstance(getattr(module, "pooling", None), str) and isinstance(getattr(module, "dropout", None),
                                                                            nn.Module)
                and isinstance(getattr(module, "head", None), nn.Linear)):
            return module
    return None


def find_bert(model: nn.Module) -> BertParts:
    """Locate the backbone (embeddings + encoder layers) and the pooled vector of a BERT-family model."""
    for module in model.modules():
        encoder = getattr(module, "encoder", None)
        layers = getattr(encoder, "layer", None)
        if isinstance(getattr(module, "embeddings", None), nn.Module) and isinstance(layers, nn.ModuleList):
            break
    else:
        raise ValueError(f"dp-forward needs a BERT-family model (an `embeddings` + `encoder.layer` backbone); "
                         f"none found in {type(model).__name__}")
    head = _pooling_head(model)
    pooler = getattr(module, "pooler", None)
    if head is not None:
        pooled, is_input = head.dropout, True
    elif isinstance(pooler, nn.Module):
        pooled, is_input = pooler, False
    else:
        pooled, is_input = None, False
    return BertParts(module, module.embeddings, layers, pooled, is_input)  # type: ignore[arg-type]


def _sublayer(layer: nn.Module, path: str) -> nn.Module:
    module: Any = layer
    for part in path.split("."):
        module = getattr(module, part, None)
        if not isinstance(module, nn.Module):
            raise ValueError(f"dp-forward encoder positions need BERT-style layers with `{path}`; "
                             f"{type(layer).__name__} has none")
    return module


def _drop_residual(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Pre-hook on an Add&Norm (BertSelfOutput / BertOutput): replace its residual input by zeros."""
    if "input_tensor" in kwargs:
        kwargs = {**kwargs, "input_tensor": torch.zeros_like(kwargs["input_tensor"])}
        return args, kwargs
    if len(args) < 2:
        raise ValueError(f"{type(module).__name__} was called without its residual input")
    return (args[0], torch.zeros_like(args[1]), *args[2:]), kwargs


class ForwardNoise:
    """The installed noise layer: hooks, noise generator, and what was released (for tests and accounting).

    `std = sigma * clip` is the per-entry noise standard deviation; `sigma = 0` (tests only) releases the
    bounded hidden state itself. `observer(bounded, released)` sees every release.
    """

    def __init__(self, model: nn.Module, position: str | Position, *, sigma: float, clip: float = 1.0,
                 normalization: str = "normalize", inference_noise: bool = True, seed: int | None = None,
                 observer: Observer | None = None) -> None:
        if sigma < 0 or clip <= 0:
            raise ValueError(f"need sigma >= 0 and clip > 0, got sigma={sigma}, clip={clip}")
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
        self.parts = find_bert(model)
        raw = parse_position(position) if isinstance(position, str) else position
        self.position = raw.resolve(len(self.parts.layers))
        self.sigma, self.clip, self.normalization = float(sigma), float(clip), normalization
        self.inference_noise = inference_noise
        self.seed = int(torch.randint(0, 2**62, (1,)).item()) if seed is None else int(seed)
        self.observer = observer
        self.releases = 0  # examples released so far (rows of every privatised batch)
        self._generators: dict[torch.device, torch.Generator] = {}
        self._handles: list[Any] = []
        self._install()

    # -- the mechanism ------------------------------------------------------------------------------
    def generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]

    def privatize(self, hidden: torch.Tensor, training: bool) -> torch.Tensor:
        """Normalise each example to C, then add N(0, (sigma C)^2) to every entry (training and inference)."""
        if not training and not self.inference_noise:
            return hidden
        bounded = bound_norm(hidden, self.clip, self.normalization)
        released = GaussianNoise(self.clip).release([bounded], self.sigma, self.generator(bounded.device))[0]
        self.releases += hidden.shape[0]
        if self.observer is not None:
            self.observer(bounded.detach(), released.detach())
        return released

    # -- hooks ----------------------------------------------------------------------------------------
    def _on_output(self, module: nn.Module, _args: Any, output: torch.Tensor) -> torch.Tensor:
        return self.privatize(output, module.training)

    def _on_input(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (self.privatize(args[0], module.training), *args[1:])

    def _install(self) -> None:
        pos, parts = self.position, self.parts
        if pos.kind == "embedding":
            self._handles.append(parts.embeddings.register_forward_hook(self._on_output))
        elif pos.kind == "pooled":
            if parts.pooled_module is None:
                raise ValueError("position 'pooled' needs a pooler (BertPooler) or a pooling head; this model "
                                 "has neither")
            if parts.pooled_is_input:
                self._handles.append(parts.pooled_module.register_forward_pre_hook(self._on_input))
            else:
                self._handles.append(parts.pooled_module.register_forward_hook(self._on_output))
        else:
            layer = parts.layers[pos.layer - 1]  # type: ignore[operator]
            target, residual_of = {
                "mha": ("attention.output.dropout", "attention.output"),
                "add-norm-1": ("attention.output", None),
                "ffn": ("output.dense", "output"),
                "add-norm-2": ("output", None),
            }[pos.sublayer]  # type: ignore[index]
            for path in ("attention.output.dense", "attention.output.dropout", "output.dense", "output.dropout"):
                _sublayer(layer, path)
            self._handles.append(_sublayer(layer, target).register_forward_hook(self._on_output))
            if residual_of is not None:
                self._handles.append(_sublayer(layer, residual_of).register_forward_pre_hook(
                    _drop_residual, with_kwargs=True))

    def remove(self) -> None:
        """Detach every hook: the model computes exactly what it did before `install`."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- the split f (user side, before the noise) / p (provider side) ---------------------------------
    def pre_noise_modules(self) -> Iterator[nn.Module]:
        """The modules that compute f(X): everything whose output reaches the noise only through it."""
        pos, parts = self.position, self.parts
        if pos.kind == "pooled":
            yield parts.backbone
            return
        yield parts.embeddings
        if pos.kind == "embedding":
            return
        yield from parts.layers[: pos.layer - 1]  # type: ignore[operator]
        layer = parts.layers[pos.layer - 1]  # type: ignore[operator]
        paths = {"mha": ("attention.self", "attention.output.dense"), "add-norm-1": ("attention",),
                 "ffn": ("attention", "intermediate", "output.dense"), "add-norm-2": ("",)}[pos.sublayer]  # type: ignore[index]
        for path in paths:
            yield layer if not path else _sublayer(layer, path)

    def pre_noise_parameters(self) -> list[nn.Parameter]:
        seen: dict[int, nn.Parameter] = {}
        for module in self.pre_noise_modules():
            for param in module.parameters():
                seen.setdefault(id(param), param)
        return list(seen.values())

    def freeze_pre_noise(self) -> int:
        """Freeze f (strict local DP: users hold a fixed public f); returns the number of frozen tensors."""
        params = self.pre_noise_parameters()
        for param in params:
            param.requires_grad_(False)
        return len(params)


def install(model: nn.Module, position: str | Position, *, sigma: float, clip: float = 1.0,
            normalization: str = "normalize", inference_noise: bool = True, seed: int | None = None,
            observer: Observer | None = None) -> ForwardNoise:
    """Add DP-Forward noise to `model` at `position`; `.remove()` on the result undoes it."""
    return ForwardNoise(model, position, sigma=sigma, clip=clip, normalization=normalization,
                        inference_noise=inference_noise, seed=seed, observer=observer)
