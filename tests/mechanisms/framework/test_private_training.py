"""`make_private` (`mechanisms.framework.private_training`) wraps a plain model, optimizer and training set into
the process the plan accounts for. Checked against references written here, independently of privbench: the
clipped sum against a loop over examples with autograd, the noise against the plan's std (sigma C) and, for
correlated noise, against s C^-1 z on the generator's own draws, the normalisation against the sampler's expected
batch size. The optimizer stops at the plan's steps, the loader draws the plan's batches and privacy units, and
bad input is refused before anything runs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from opacus.grad_sample import GradSampleModule
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from mechanisms.catalog import dp_bandmf, dpsgd, dpsgd_adaclip
from mechanisms.framework import private_training
from mechanisms.framework.private_training import (
    Grouping,
    PlanViolation,
    PrivateBookkeepingOptimizer,
    PrivateDPOptimizer,
    PrivateGhostOptimizer,
    PrivatePerLayerOptimizer,
    ResidentBatches,
    StreamedBatches,
    make_private,
    optimizer_class,
    plan_loader,
)
from mechanisms.parts.grouping import Units
from mechanisms.parts.plan import PrivacySpec

pytestmark = [pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
              pytest.mark.filterwarnings("ignore:Full backward hook")]

CLIP = 1.0
DPSGD = dpsgd.mechanism


def model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))


def spec(**changes) -> PrivacySpec:
    """A setting with an explicit sigma (no calibration): 64 examples of 5 features, batches of 8, one epoch."""
    return PrivacySpec(**{"epsilon": None, "delta": 1e-5, "dataset_size": 64, "batch_size": 8, "epochs": 1,
                          "sigma": 1.0, "clip": CLIP, **changes})


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


class Capture:
    """A release observer: each step's clipped sum (what the noise is added to) and its release (sum + noise)."""

    def __init__(self) -> None:
        self.sums: list[torch.Tensor] = []
        self.releases: list[torch.Tensor] = []

    def before_noise(self, optimizer):
        self.sums.append(flat(p.summed_grad for p in optimizer.params))

    def after_noise(self, optimizer):
        self.releases.append(flat(p.grad for p in optimizer.params))


def wrap(module, plan, mode="hooks", *, features=5, noise_seed=1, **kwargs):
    """`make_private` on `plan` over random data of the plan's size (no integrity guard: its own tests are
    elsewhere), with a `Capture` observing every release."""
    n = plan.batch_selection.dataset_size
    data = TensorDataset(torch.randn(n, features), torch.zeros(n, dtype=torch.long))
    training = make_private(module, torch.optim.SGD(module.parameters(), lr=0.0), data, plan,
                            criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0),
                            grad_sample_mode=mode, noise_generator=torch.Generator().manual_seed(noise_seed),
                            guard=False, **kwargs)
    capture = Capture()
    training.optimizer.observe_releases(capture)
    return training, capture


def step(training, x, y):
    training.optimizer.zero_grad(set_to_none=True)
    training.criterion(training.module(x), y).backward()
    training.optimizer.step()


def reference_clipped_sum(module, x, y, clips) -> tuple[torch.Tensor, float]:
    """sum_i clip(g_i) by Opacus' rule g min(1, c / (|g| + 1e-6)), one autograd call per example; `clips`: one
    bound (flat, over all tensors) or one per tensor (per-layer). Also the share of the clippings that cut."""
    total, cuts = torch.zeros(sum(p.numel() for p in module.parameters())), []
    for i in range(len(x)):
        module.zero_grad()
        nn.functional.cross_entropy(module(x[i:i + 1]), y[i:i + 1]).backward()
        grads = [p.grad.reshape(-1).clone() for p in module.parameters()]
        if len(clips) == 1:
            norm = float(torch.cat(grads).norm())
            norms, bounds, cuts = [norm] * len(grads), clips * len(grads), [*cuts, norm > clips[0]]
        else:
            norms, bounds = [float(g.norm()) for g in grads], clips
            cuts += [n > c for n, c in zip(norms, bounds, strict=True)]
        total += torch.cat([g * min(1.0, c / (n + 1e-6)) for g, n, c in zip(grads, norms, bounds, strict=True)])
    return total, sum(cuts) / len(cuts)


# ---- the private step -------------------------------------------------------------------------------------
PER_LAYER = {"options": {"clipping": "per-layer"}, "n_tensors": 4, "tensor_sizes": (30, 6, 18, 3), "model_dim": 57}


@pytest.mark.parametrize(("mode", "clipping"), [("hooks", "flat"), ("functorch", "flat"), ("ew", "flat"),
                                                ("bk", "flat"), ("ghost", "flat"), ("hooks", "per-layer"),
                                                ("bk", "per-layer")])
def test_the_clipped_sum_is_the_loop_over_examples(mode, clipping):
    """Every engine (Opacus' modes, the book-keeping engine), flat or per-layer, clips at the plan's bounds."""
    torch.manual_seed(1)
    x, y = torch.randn(12, 5) * torch.linspace(0.05, 4.0, 12).unsqueeze(1), torch.randint(0, 3, (12,))
    plan = DPSGD.plan(spec(**PER_LAYER) if clipping == "per-layer" else spec())
    bounds = plan.parts.clipper.max_grad_norm
    training, capture = wrap(model(), plan, mode)
    step(training, x, y)
    want, cut = reference_clipped_sum(model(), x, y, bounds if clipping == "per-layer" else [bounds])
    assert 0 < cut < 1  # some gradients were clipped, some not
    torch.testing.assert_close(capture.sums[0], want, rtol=1e-5, atol=1e-6)


def test_the_noise_is_the_plans_gaussian_fresh_in_every_step():
    """DP-SGD at sigma 0.7, C 1.5: release - clipped sum over 3 steps x 4,040 coordinates has mean 0 and std
    sigma C, and is uncorrelated from step to step."""
    plan = DPSGD.plan(spec(sigma=0.7, clip=1.5))
    training, capture = wrap(nn.Linear(100, 40), plan, features=100)
    for _ in range(3):
        step(training, torch.randn(8, 100), torch.randint(0, 40, (8,)))
    noise = torch.stack(capture.releases) - torch.stack(capture.sums)
    n, std = noise.numel(), 0.7 * 1.5
    assert abs(float(noise.mean())) < 4 * std / n ** 0.5
    assert float(noise.std()) == pytest.approx(std, rel=4 / (2 * n) ** 0.5)  # 4 standard errors
    corr = np.corrcoef(noise.numpy())
    assert np.abs(corr[np.triu_indices(3, 1)]).max() < 4 / noise.shape[1] ** 0.5


def test_the_correlated_noise_continues_its_stream_from_step_to_step():
    """dp-bandmf with 3 bands keeps one stream for the run: step t adds s (C^-1 z)_t, with z the noise
    generator's N(0, 1) draws in order (one flat buffer per step) and C the banded Toeplitz matrix of the
    strategy's coefficients, built here; a stream restarted every step would add s z_t / c_0."""
    steps, sigma = 5, 0.8
    plan = dp_bandmf.mechanism.plan(spec(sigma=sigma, options={"bands": 3}))
    coefficients = plan.parts.noise.strategy.coefficients
    training, capture = wrap(model(), plan, noise_seed=5)
    torch.manual_seed(2)
    x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
    for _ in range(steps):
        step(training, x, y)
    noise = (torch.stack(capture.releases) - torch.stack(capture.sums)).numpy()
    draws = torch.Generator().manual_seed(5)
    z = np.concatenate([torch.normal(0.0, 1.0, (1, noise.shape[1]), generator=draws).numpy() for _ in range(steps)])
    c = sum(ck * np.eye(steps, k=-k) for k, ck in enumerate(coefficients))
    s = sigma * CLIP
    np.testing.assert_allclose(noise, s * np.linalg.solve(c, z), rtol=1e-4, atol=1e-5)
    assert len(coefficients) == 3 and not np.allclose(noise[1:], s * z[1:] / coefficients[0], atol=1e-2)


def test_the_release_is_divided_by_the_expected_batch_size_not_the_batchs():
    """Poisson batches vary in size; the plan's sensitivity is of the sum, so the release is normalised by the
    sampler's expected batch size (8 here) whatever the batch held (5 rows)."""
    training, capture = wrap(model(), DPSGD.plan(spec()))
    step(training, torch.randn(5, 5), torch.randint(0, 3, (5,)))
    torch.testing.assert_close(flat(p.grad for p in training.module.parameters()), capture.releases[0] / 8)


@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_updates_are_counted_and_one_beyond_the_plan_is_refused(mode):
    """Two planned steps (16 examples, batches of 8). A skipped step (Opacus' virtual step: the batch's clipped
    sum is kept for the next) is no update and no post-processing; a third update raises before its
    post-processing runs."""
    plan = DPSGD.plan(spec(dataset_size=16))
    assert plan.steps == 2
    post_processed = []
    training, capture = wrap(model(), plan, mode, after_step=lambda opt: post_processed.append(opt.steps_taken))
    optimizer = training.optimizer
    torch.manual_seed(3)
    x, y = 3 * torch.randn(8, 5), torch.randint(0, 3, (8,))
    optimizer.signal_skip_step(True)
    step(training, x[:4], y[:4])
    step(training, x[4:], y[4:])  # zero_grad after a skipped step keeps its clipped sum (Opacus)
    assert optimizer.steps_taken == 1 and len(capture.sums) == 1 and post_processed == [1]
    torch.testing.assert_close(capture.sums[0], reference_clipped_sum(model(), x, y, [CLIP])[0], rtol=1e-5,
                               atol=1e-6)
    step(training, x, y)
    assert optimizer.steps_taken == 2
    with pytest.raises(PlanViolation, match="update 3 exceeds the 2 steps"):
        step(training, x, y)
    assert post_processed == [1, 2]


@pytest.mark.parametrize("mode", ["hooks", "bk", "ghost"])
def test_clipped_norm_is_the_engines_clipping_at_its_bound(mode):
    """What the one-run audit's canaries rely on: `clipped_norm(|g|)` is the norm a gradient of norm |g| keeps
    in this step, clipped by the engine that clips at the bound it holds now (here changed to 3 after planning),
    as a one-example step's clipped sum shows."""
    torch.manual_seed(4)
    training, capture = wrap(nn.Linear(5, 3), DPSGD.plan(spec()), mode)
    optimizer = training.optimizer
    four = torch.tensor(4.0)
    assert float(optimizer.clipped_norm(four)) == pytest.approx(1.0, rel=1e-5)
    assert float(optimizer.clipped_norm(torch.tensor(0.5))) == pytest.approx(0.5, rel=1e-5)  # not clipped
    engine = getattr(optimizer, "engine", None)
    (optimizer if engine is None else engine).max_grad_norm = 3.0
    assert float(optimizer.clipped_norm(four)) == pytest.approx(3.0, rel=1e-5)
    x, y = 10 * torch.randn(1, 5), torch.tensor([1])
    reference = nn.Linear(5, 3)
    reference.load_state_dict(training.module.state_dict() if mode == "bk" else
                              {k.removeprefix("_module."): v for k, v in training.module.state_dict().items()})
    nn.functional.cross_entropy(reference(x), y).backward()
    norm = flat(p.grad for p in reference.parameters()).norm()
    assert norm > 3
    step(training, x, y)
    assert float(capture.sums[0].norm()) == pytest.approx(float(optimizer.clipped_norm(norm)), rel=1e-5)


def test_per_layer_clipped_norm_is_the_norm_of_the_clipped_tensors():
    """Per-layer: a norm |g| in every tensor keeps min(|g|, C_l) in tensor l, sqrt(sum_l ...^2) in all."""
    plan = DPSGD.plan(spec(**PER_LAYER))
    training, _ = wrap(model(), plan)
    clips = plan.parts.clipper.clips
    assert clips == (0.5,) * 4  # C = 1 shared equally, in squares, by 4 tensors
    for norm in (0.1, 0.4, 4.0):
        want = sum(min(norm, c) ** 2 for c in clips) ** 0.5
        assert float(training.optimizer.clipped_norm(torch.tensor(norm))) == pytest.approx(want, rel=1e-5)


# ---- what is refused ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("clipping", "mode", "expected"), [
    ("flat", "hooks", PrivateDPOptimizer), ("flat", "functorch", PrivateDPOptimizer),
    ("flat", "ew", PrivateDPOptimizer), ("per_layer", "hooks", PrivatePerLayerOptimizer),
    ("flat", "ghost", PrivateGhostOptimizer), ("flat", "bk", PrivateBookkeepingOptimizer),
    ("per_layer", "bk", PrivateBookkeepingOptimizer)])
def test_the_optimizer_class_follows_clipping_and_mode(clipping, mode, expected):
    assert optimizer_class(clipping, mode) is expected


def test_an_unknown_mode_and_per_layer_ghost_are_refused():
    with pytest.raises(ValueError, match="unknown grad_sample_mode 'fast'"):
        optimizer_class("flat", "fast")
    with pytest.raises(ValueError, match="ghost mode clips flat only"):
        optimizer_class("per_layer", "ghost")


@pytest.mark.parametrize(("case", "message"), [
    ("wrapped", "takes the plain module"),
    ("padded hooks", "need grad_sample_mode bk"),
    ("no state", "does not give"),
    ("releases under ghost", "need flat clipping with per-example norms"),
    ("another size", "the plan accounts for 64 examples, the data has 50"),
])
def test_bad_input_is_refused_before_training(case, message):
    module, mode, kwargs, n = model(), "hooks", {}, 64
    plan = dpsgd_adaclip.mechanism.plan(spec()) if case in ("no state", "releases under ghost") else DPSGD.plan(spec())
    if plan.parts.clipper.state_key is not None and case != "no state":
        kwargs["state"] = {plan.parts.clipper.state_key: CLIP}
    if case == "wrapped":
        module = GradSampleModule(module)
    elif case == "padded hooks":
        kwargs["pad_to"] = 8
    elif case == "releases under ghost":
        mode = "ghost"
    elif case == "another size":
        n = 50
    data = TensorDataset(torch.randn(n, 5), torch.zeros(n, dtype=torch.long))
    with pytest.raises(ValueError, match=message):
        make_private(module, torch.optim.SGD(module.parameters(), lr=0.1), data, plan, criterion=nn.CrossEntropyLoss(),
                     generator=torch.Generator(), grad_sample_mode=mode, **kwargs)



def test_a_bookkeeping_step_without_its_backward_pass_is_refused():
    """The book-keeping engine writes the clipped sum during the backward pass: without one there is no sum to
    noise (not a zero one)."""
    training, _ = wrap(model(), DPSGD.plan(spec()), "bk")
    training.optimizer.zero_grad(set_to_none=True)
    with pytest.raises(RuntimeError, match="call the engine's loss backward"):
        training.optimizer.step()


# ---- the loader -------------------------------------------------------------------------------------------------
class Rows(Dataset):
    """A training set without `tensors` (not a `TensorDataset`): it streams through a DataLoader."""

    def __init__(self, *tensors):
        self.columns = tensors

    def __len__(self):
        return len(self.columns[0])

    def __getitem__(self, i):
        return tuple(t[i] for t in self.columns)


def test_tensors_are_gathered_where_they_live_and_other_data_streams_with_its_empty_batches():
    """Poisson at q = 1/50 over 50 steps: both loaders yield exactly the plan's steps, each batch counting its
    examples (`size`); a streamed empty batch is shaped like the items (0, 5)."""
    torch.manual_seed(5)
    x, y = torch.randn(50, 5), torch.randint(0, 3, (50,))
    plan = DPSGD.plan(spec(dataset_size=50, batch_size=1))
    resident = plan_loader(TensorDataset(x, y), plan, torch.Generator().manual_seed(0))
    streamed = plan_loader(Rows(x, y), plan, torch.Generator().manual_seed(0))
    assert isinstance(resident, ResidentBatches) and isinstance(streamed, StreamedBatches)
    for loader in (resident, streamed):
        batches = list(loader)
        assert len(batches) == len(loader) == plan.steps == 50
        for features, labels in batches:
            assert features.shape == (len(labels), 5)
        assert all(batch.size == len(batch[1]) for batch in batches)
        empty = [batch for batch in batches if batch.size == 0]
        assert empty and empty[0][0].shape == (0, 5)
        for batch in batches:  # every row is an example of the training set
            assert all(bool((x == row).all(1).any()) for row in batch[0])



@pytest.mark.parametrize("stream", [False, True], ids=["resident", "streamed"])
def test_a_batch_of_sequences_is_cut_to_its_longest_example(stream):
    """`trim_by` names the attention mask: each batch's inputs are cut to the longest mask in it (a transformer's
    padding beyond it is never computed), the labels are left whole, no token of an example is lost."""
    torch.manual_seed(6)
    n, width = 64, 12
    lengths = torch.randint(1, 9, (n,))
    mask = (torch.arange(width) < lengths.unsqueeze(1)).long()
    ids = torch.randint(1, 50, (n, width)) * mask
    ids[:, 0] = torch.arange(n)  # the row's index: which example a batch row is
    labels = torch.randint(0, 2, (n,))
    data = Rows(ids, mask, labels) if stream else TensorDataset(ids, mask, labels)
    data.trim_by = 1
    loader = plan_loader(data, DPSGD.plan(spec()), torch.Generator().manual_seed(0))
    assert isinstance(loader, StreamedBatches if stream else ResidentBatches)
    cut = 0
    for batch_ids, batch_mask, batch_labels in loader:
        rows = batch_ids[:, 0]
        longest = int(lengths[rows].max()) if len(rows) else 1
        assert batch_ids.shape[1] == batch_mask.shape[1] == longest
        assert torch.equal(batch_ids, ids[rows, :longest]) and torch.equal(batch_mask, mask[rows, :longest])
        assert torch.equal(batch_labels, labels[rows])
        cut += longest < width
    assert cut == len(loader)


# ---- privacy units and augmult (`Grouping`): the loader draws them, the step clips a unit's rows together -------
def train_params(data, plan, mode, seed=0, flatten=False):
    module = nn.Sequential(nn.Flatten(), *model(seed)) if flatten else model(seed)
    training = make_private(module, torch.optim.SGD(module.parameters(), lr=0.5), data, plan,
                            criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(seed),
                            grad_sample_mode=mode, noise_generator=torch.Generator().manual_seed(seed + 1))
    for batch in training.loader:
        x, y = batch
        training.optimizer.row_groups = batch.groups  # what the trainer's step does (workers.train.train_step)
        training.optimizer.zero_grad(set_to_none=True)
        training.criterion(training.module(x), y).backward()
        training.optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]), training


@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_singleton_units_are_plain_dpsgd_bit_for_bit(mode):
    """Every row its own unit: the units path (host draw, rows by unit, per-row gradients summed per group) gives
    the very parameters plain DP-SGD gives, with the same seeds: same batches, same clipped sums, same noise."""
    torch.manual_seed(4)
    tensors = torch.randn(90, 5), torch.randint(0, 3, (90,))
    setting = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=90, batch_size=10, epochs=2, sigma=1.0, clip=CLIP)
    plan = DPSGD.plan(setting)
    plain, _ = train_params(TensorDataset(*tensors), plan, mode)
    grouped_data = TensorDataset(*tensors)
    grouped_data.units = Units.of(np.arange(90))
    grouped, training = train_params(grouped_data, plan, mode)
    assert training.loader.grouping is not None
    assert torch.equal(plain, grouped)


def test_the_units_sampler_draws_units_as_the_plan_accounts():
    """Poisson over 200 units of 1 to 4 rows: the plan's q and T are the units' (B / U, epochs * round(U / B)),
    the loader yields T steps, each with every row of the units it drew."""
    rng = np.random.default_rng(0)
    unit = np.repeat(np.arange(200), rng.integers(1, 5, 200))
    data = TensorDataset(torch.randn(len(unit), 5), torch.zeros(len(unit), dtype=torch.long))
    data.units = Units.of(unit)
    setting = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=200, batch_size=20, epochs=3, sigma=1.0)
    plan = DPSGD.plan(setting)
    assert (plan.sample_rate, plan.steps) == (20 / 200, 30)
    training = make_private(model(), torch.optim.SGD(model().parameters(), lr=0.1), data, plan,
                            criterion=nn.CrossEntropyLoss(), generator=torch.Generator().manual_seed(0),
                            grad_sample_mode="hooks")
    drawn = 0
    for _ in range(3):
        for batch in training.loader:
            groups, rows = batch.groups, np.array(_rows(batch, data), dtype=np.int64)
            drawn_units = np.unique(unit[rows])
            assert sorted(rows) == sorted(np.flatnonzero(np.isin(unit, drawn_units)))  # all their rows, no other
            group = groups.index.numpy()
            assert groups.count == len(drawn_units)
            assert all(len(set(unit[rows[group == g]])) == 1 for g in range(groups.count))  # a group is one unit
            drawn += groups.count
    assert drawn == pytest.approx(30 * 20, rel=0.25)
    with pytest.raises(ValueError, match="accounts for 100 privacy units, the data has 200"):
        make_private(model(), torch.optim.SGD(model().parameters(), lr=0.1), data,
                     DPSGD.plan(dataclasses.replace(setting, dataset_size=100)),
                     criterion=nn.CrossEntropyLoss(), generator=torch.Generator(), grad_sample_mode="hooks")


def _rows(batch, data):
    """Which training rows a batch holds (its inputs are rows of `data`, all distinct)."""
    x = batch[0]
    return [int(torch.nonzero((data.tensors[0] == row).all(1))[0]) for row in x]


def test_grouping_refuses_opacus_ghost_which_clips_rows():
    data = TensorDataset(torch.randn(30, 5), torch.zeros(30, dtype=torch.long))
    data.units = Units.of(np.arange(30) // 3)
    setting = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=10, batch_size=2, epochs=1, sigma=1.0)
    with pytest.raises(ValueError, match="clip a unit's rows together"):
        make_private(model(), torch.optim.SGD(model().parameters(), lr=0.1), data, DPSGD.plan(setting),
                     criterion=nn.CrossEntropyLoss(), generator=torch.Generator(), grad_sample_mode="ghost")


@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_augmult_of_identical_copies_is_plain_dpsgd(mode, monkeypatch):
    """With the augmentation replaced by the identity, each record's K copies are the record K times: their
    averaged gradient is the record's, so training gives plain DP-SGD's parameters (the same batches, the same
    noise), within float32 rounding: Opacus' hooks undo the loss's mean over four times as many rows, and bk takes a
    record's copies as four positions of one example, whose ghost norm sums in another order."""
    torch.manual_seed(6)
    tensors = torch.randn(90, 1, 1, 5), torch.randint(0, 3, (90,))
    setting = PrivacySpec(epsilon=None, delta=1e-5, dataset_size=90, batch_size=10, epochs=2, sigma=1.0, clip=CLIP)
    plan = DPSGD.plan(setting)
    flatten = nn.Flatten()
    plain, _ = train_params(TensorDataset(flatten(tensors[0]), tensors[1]), plan, mode)
    monkeypatch.setattr(private_training, "augment_crop_flip", lambda images, generator, padding: images)
    data = TensorDataset(*tensors)
    data.augmult = 4
    copies, training = train_params(data, plan, mode, flatten=True)
    assert training.loader.grouping == Grouping(None, 4)
    torch.testing.assert_close(plain, copies, rtol=1e-5, atol=1e-6)
    untrained = torch.cat([p.detach().reshape(-1) for p in model(0).parameters()])
    assert (plain - untrained).abs().max() > 1e-2  # it trained
