"""mechanisms/catalog/shuffled_dpsgd/permutation.py: the coupled permutation. The model's function is unchanged,
the weights really move, and the optimizer state and the canonical frame follow them (arXiv 2407.15414, App. B)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mechanisms.catalog.shuffled_dpsgd.permutation import BlockLayout, CanonicalFrame, Target, permute_, permuted_numel
from mechanisms.catalog.shuffled_dpsgd.permutation_hf import find_blocks
from tests.mechanisms.catalog.shuffled_dpsgd.tiny_transformers import quiet, tiny

TOL = 1e-5  # the bound on max |output difference|
KINDS = ["bert", "roberta", "vit", "gpt2", "gpt2-linear"]


def logits(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("shared_value", [True, False])
@pytest.mark.parametrize("kind", KINDS)
def test_shuffle_keeps_the_function_and_moves_every_target(kind, shared_value):
    model, inputs = tiny(kind)
    before = logits(model, inputs)
    layouts = find_blocks(model)
    assert len(layouts) == 2 and all(layout.heads == 4 and layout.head_dim == 8 for layout in layouts)
    snapshot = {id(t.tensor): t.tensor.detach().clone() for layout in layouts for t in layout.targets}
    permute_(layouts, torch.Generator().manual_seed(1), shared_value=shared_value)
    after = logits(model, inputs)
    assert (after - before).abs().max().item() <= TOL
    assert before.abs().max().item() > 1e-3  # the comparison is not between two near-zero outputs
    for layout in layouts:
        for t in layout.targets:
            old, new = snapshot[id(t.tensor)], t.tensor.detach()
            assert not torch.equal(old, new), f"{layout.name}/{t.name} did not move"
            # the same values, rearranged along the permuted axis only
            assert torch.equal(old.sort(dim=t.axis).values, new.sort(dim=t.axis).values)


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_decoupled_permutations_change_the_function(kind):
    """Negative control: Q and K permuted independently (or fc1 without fc2) is not an equivalent model."""
    model, inputs = tiny(kind)
    before = logits(model, inputs)
    layout = find_blocks(model)[0]
    gen = torch.Generator().manual_seed(2)
    perms, other = layout.sample(gen), layout.sample(gen)
    for t in layout.targets:
        use = other if t.name.startswith(("k", "fc2")) else perms
        if t.name.startswith("qkv"):  # GPT-2 fused: K columns get the other Q/K draw
            width = layout.heads * layout.head_dim
            index = torch.cat([perms["qk"], width + other["qk"], 2 * width + perms["v"]])
        else:
            index = t.index(use)
        t.tensor.data = t.tensor.data.index_select(t.axis, index)
    assert (logits(model, inputs) - before).abs().max().item() > 100 * TOL


@pytest.mark.parametrize(("model_name", "dataset"), [("bert-tiny", "rotten-tomatoes"), ("vit-tiny", "digits"),
                                                     ("gpt2-tiny", "rotten-tomatoes")])
def test_registry_models_are_unchanged_by_a_shuffle(model_name, dataset):
    """The issue's check on privbench's own workloads (adapters around the HF models)."""
    quiet()
    from workers import datasets, models

    torch.manual_seed(0)
    splits = datasets.load(dataset, {})
    bundle = models.build(model_name, splits, {})
    inputs = bundle.encode(splits.train.subset(list(range(16))))
    module = bundle.module.eval()
    with torch.no_grad():
        before = module(*inputs)
    layouts = find_blocks(module)
    assert len(layouts) == bundle.info["num_layers"]
    for _ in range(3):
        permute_(layouts, torch.Generator().manual_seed(3))
    with torch.no_grad():
        after = module(*inputs)
    assert (after - before).abs().max().item() <= TOL


def test_optimizer_state_and_gradients_follow_the_weights():
    model, inputs = tiny("bert")
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(**inputs).logits.sum().backward()
    optimizer.step()
    for p in model.parameters():  # make every state tensor a known function of its parameter
        optimizer.state[p]["exp_avg"] = 2 * p.detach()
        optimizer.state[p]["exp_avg_sq"] = 3 * p.detach()
        p.grad = 5 * p.detach()
    steps = {p: optimizer.state[p]["step"].clone() for p in model.parameters()}
    layouts = find_blocks(model)
    permute_(layouts, torch.Generator().manual_seed(4), optimizer=optimizer)
    for p in model.parameters():
        assert torch.equal(optimizer.state[p]["exp_avg"], 2 * p.detach())
        assert torch.equal(optimizer.state[p]["exp_avg_sq"], 3 * p.detach())
        assert torch.equal(p.grad, 5 * p.detach())
        assert torch.equal(optimizer.state[p]["step"], steps[p])


def _adam_run(permute: bool, with_state: bool, steps: int = 20) -> torch.Tensor:
    model, inputs = tiny("vit")
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    layouts, gen = find_blocks(model), torch.Generator().manual_seed(5)
    labels = torch.tensor([0, 1, 0])
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(**inputs).logits, labels).backward()
        optimizer.step()
        if permute:
            permute_(layouts, gen, optimizer=optimizer if with_state else None)
    return logits(model, inputs)


def test_training_without_permuting_the_optimizer_state_drifts():
    """Adam's moments must move with the weights, else the run silently diverges."""
    reference = _adam_run(permute=False, with_state=False)
    assert (_adam_run(permute=True, with_state=True) - reference).abs().max().item() <= TOL
    assert (_adam_run(permute=True, with_state=False) - reference).abs().max().item() > 100 * TOL


def test_canonical_frame_maps_original_coordinates_to_current_ones():
    model, _ = tiny("gpt2-linear")
    layouts = find_blocks(model)
    original = {t.tensor: t.tensor.detach().clone() for layout in layouts for t in layout.targets}
    frame, gen = CanonicalFrame(), torch.Generator().manual_seed(6)
    for _ in range(4):
        permute_(layouts, gen, frame=frame)
    for tensor, canonical in original.items():
        assert torch.equal(frame.to_current(tensor, canonical), tensor.detach())
    assert permuted_numel(layouts) == sum(t.numel() for t in original)


def test_layouts_reject_inconsistent_geometry():
    weight = nn.Parameter(torch.zeros(10, 4))
    with pytest.raises(ValueError, match="expects 8"):
        BlockLayout("b", heads=2, head_dim=4, ffn=6, targets=(Target(weight, 0, (("qk", 0),), "q.weight"),))
    with pytest.raises(ValueError, match="axis 2"):
        BlockLayout("b", heads=2, head_dim=5, ffn=6, targets=(Target(weight, 2, (("qk", 0),), "q.weight"),))
