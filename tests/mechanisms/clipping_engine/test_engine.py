"""The engine layer by layer against the definition (one example at a time), in every norm mode, and the
ways it refuses to give a wrong gradient."""

from __future__ import annotations

import pytest
import torch
from bk_reference import assert_close, bookkeeping, one_at_a_time
from torch import nn

from mechanisms.clipping_engine import BookkeepingEngine, BookkeepingLoss, UnsupportedModule, unsupported


class Tokens(nn.Module):
    """Embedding (with padding_idx) -> LayerNorm -> HF Conv1D -> Linear over positions -> pooled head."""

    def __init__(self) -> None:
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        self.embed = nn.Embedding(40, 12, padding_idx=0)
        self.norm = nn.LayerNorm(12)
        self.conv1d = Conv1D(16, 12)
        self.proj = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.conv1d(self.norm(self.embed(ids))))
        return self.head(torch.tanh(self.proj(h)).mean(1))


def _models():
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(2, 6, 3, stride=2, padding=1), nn.Tanh(), nn.Conv2d(6, 8, 3, dilation=2),
                         nn.Flatten(), nn.Linear(8 * 2 * 2, 3))
    return {"conv": (conv, (torch.randn(10, 2, 12, 12),)),
            "tokens": (Tokens(), (torch.randint(0, 40, (10, 9)),))}


@pytest.mark.parametrize("norm_mode", ["mixed", "ghost", "instantiate"])
@pytest.mark.parametrize("name", ["conv", "tokens"])
@pytest.mark.parametrize("bounds", [0.3, "per_layer"])
def test_layers_match_the_definition(name, norm_mode, bounds):
    model, inputs = _models()[name]
    y = torch.randint(0, 3, (10,))
    if bounds == "per_layer":
        bounds = [0.1 + 0.05 * i for i in range(sum(1 for p in model.parameters() if p.requires_grad))]
    assert_close(one_at_a_time(model, inputs, y, bounds), bookkeeping(model, inputs, y, bounds, norm_mode))


def test_frozen_parameters_are_skipped_and_untouched():
    model, inputs = _models()["tokens"]
    model.embed.weight.requires_grad_(False)
    model.proj.bias.requires_grad_(False)
    y = torch.randint(0, 3, (10,))
    assert_close(one_at_a_time(model, inputs, y, 0.3), bookkeeping(model, inputs, y, 0.3))
    engine = BookkeepingEngine(model, 1.0)
    BookkeepingLoss(engine, nn.CrossEntropyLoss())(model(*inputs), y).backward()
    assert model.embed.weight.grad is None and model.proj.bias.grad is None


def test_empty_batch_gives_zero_gradients():
    model = nn.Sequential(nn.Linear(4, 3))
    engine = BookkeepingEngine(model, 1.0)
    loss = BookkeepingLoss(engine, nn.CrossEntropyLoss())
    loss(model(torch.zeros(0, 4)), torch.zeros(0, dtype=torch.long)).backward()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_unsupported_modules_are_named():
    model = nn.Sequential(nn.Linear(4, 4), nn.Conv1d(1, 1, 3), nn.GRU(4, 4))
    problems = unsupported(model)
    assert any(p.startswith("1 (Conv1d)") for p in problems) and any(p.startswith("2 (GRU)") for p in problems)
    with pytest.raises(UnsupportedModule, match=r"1 \(Conv1d\)"):
        BookkeepingEngine(model, 1.0)
    model.requires_grad_(False)
    assert unsupported(model) == []  # frozen: nothing to clip


def test_tied_weights_are_refused():
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    b.weight = a.weight
    with pytest.raises(UnsupportedModule, match="tied"):
        BookkeepingEngine(nn.Sequential(a, b), 1.0)


def test_module_called_twice_raises():
    layer = nn.Linear(3, 3)
    engine = BookkeepingEngine(layer, 1.0)
    x = torch.randn(4, 3)
    with pytest.raises(RuntimeError, match="more than once"):
        BookkeepingLoss(engine, nn.CrossEntropyLoss())(layer(layer(x)), torch.zeros(4, dtype=torch.long)).backward()


def test_direct_use_of_a_parameter_raises():
    class Leaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x) + x @ self.lin.weight.t()  # the weight used outside the Linear's forward

    model = Leaky()
    engine = BookkeepingEngine(model, 1.0)
    with pytest.raises(RuntimeError, match="outside its module"):
        loss = BookkeepingLoss(engine, nn.CrossEntropyLoss())
        loss(model(torch.randn(4, 3)), torch.zeros(4, dtype=torch.long)).backward()


def test_not_batch_first_and_foreign_backward_raise():
    layer = nn.Linear(3, 2)
    engine = BookkeepingEngine(layer, 1.0)
    x = torch.randn(4, 5, 3)
    flat_out = layer(x.reshape(20, 3)).reshape(4, 5, 2).mean(1)
    with pytest.raises(RuntimeError, match="leading dimension"):
        BookkeepingLoss(engine, nn.CrossEntropyLoss())(flat_out, torch.zeros(4, dtype=torch.long)).backward()
    with pytest.raises(RuntimeError, match="did not start"):
        layer(torch.randn(4, 3)).sum().backward()


def test_detach_restores_the_module():
    layer = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    engine = BookkeepingEngine(layer, 1.0)
    engine.detach()
    layer(x).sum().backward()
    assert torch.allclose(layer.bias.grad, torch.full((2,), 4.0))
