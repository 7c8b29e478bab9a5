"""Batch selection: which examples each step sees, and the DpEvent that describes it.

A sampler is the one source of truth for the batch geometry of a trial. The loader the trial runs is
built from it (`batch_sampler`), and the accountant composes the event it states (`dp_event`), so the
accounted process is the executed one by construction: the plan never re-derives q or T on its own.

Every sampler runs exactly `steps_per_epoch = max(1, round(N / B))` steps per epoch and `epochs` epochs,
so `steps = epochs * steps_per_epoch` is what the trial executes and what is accounted.

| sampler   | what a step sees                                           | neighbouring relation |
|-----------|------------------------------------------------------------|-----------------------|
| `poisson` | each example independently with probability q = B / N      | add-or-remove-one     |
| `fixed`   | exactly B examples drawn without replacement, fresh per step| replace-one           |
| `shuffle` | one permutation per epoch cut into `steps_per_epoch` batches| replace-one           |
| `fixed-order` | one permutation fixed before training, the same batches every epoch | replace-one     |

`fixed-order`'s permutation comes from its `order_seed` alone (not the data, not the trial's generator), so
each example joins the same offset of every epoch (a cyclic participation schema, for correlated noise).

Batches are drawn where the data lives, without waiting on the host (`epoch`): a Poisson step draws its size
K ~ Binomial(N, q) on the host generator and its K examples as a uniform subset on the device generator
(the same law as N independent coins: given the count, the subset is uniform), a fixed-size step a slice
of a device permutation, a shuffled epoch one device permutation cut into slices. Each step's indices are
one device tensor, its size a host integer; `pad_to` pads a step to a multiple of rows of weight 0 (static
shapes for a compiled step), which contribute nothing to any sum, norm or count.

`dp_event(step)` wraps the event of ONE step's release (a Gaussian whose noise multiplier is measured
against the sensitivity under the sampler's relation, see `mechanisms/parts.py`) into the event of the
whole run. Shuffling gets no amplification (none is known to be sound for it: Chua et al., arXiv
2403.17673, show Poisson accounting under-reports it); each example joins one batch per epoch.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

import dp_accounting

from mechanisms.accounting import events
from mechanisms.accounting.validation import require_sample_rate, require_steps

if TYPE_CHECKING:  # torch loads when batches are drawn: accounting (`privbench privacy`) never pays for it
    import torch

    from mechanisms.parts.participation import Participation

NeighborRel = dp_accounting.NeighboringRelation


@dataclasses.dataclass(frozen=True)
class BatchSelection(abc.ABC):
    """The batch geometry of a run: N examples, batch size B (expected, for Poisson), E epochs."""

    dataset_size: int
    batch_size: int
    epochs: int

    name: ClassVar[str]
    neighboring_relation: ClassVar[NeighborRel]

    def __post_init__(self) -> None:
        for field in ("dataset_size", "batch_size", "epochs"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be an integer >= 1, got {value!r}")
        if self.batch_size > self.dataset_size:
            raise ValueError(f"batch_size {self.batch_size} exceeds dataset_size {self.dataset_size}")

    @property
    def sample_rate(self) -> float:
        """q = B / N: each example's chance to be in a given step's batch."""
        return self.batch_size / self.dataset_size

    @property
    def steps_per_epoch(self) -> int:
        return max(1, round(self.dataset_size / self.batch_size))

    @property
    def steps(self) -> int:
        """The number of updates the loader yields, and the number the accountant composes."""
        return self.epochs * self.steps_per_epoch

    @abc.abstractmethod
    def dp_event(self, step: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        """The whole run's event, given the event of one step's release on a batch holding the record."""

    @abc.abstractmethod
    def epoch(self, generator: torch.Generator, device_generator: torch.Generator | None = None,
              pad_to: int | None = None) -> Iterator[StepIndices]:
        """The batches of one epoch, exactly `steps_per_epoch` of them: each step's example indices as one tensor
        on `device_generator`'s device (default: `generator`'s), drawn without a host synchronisation."""

    def batch_sampler(self, generator: torch.Generator) -> EpochBatches:
        """A `torch.utils.data.Sampler` for `DataLoader(batch_sampler=...)`: one epoch per iteration."""
        return EpochBatches(self, generator)

    def describe(self) -> dict[str, object]:
        return {"sampler": self.name, "dataset_size": self.dataset_size, "batch_size": self.batch_size,
                "epochs": self.epochs, "steps": self.steps, "sample_rate": self.sample_rate,
                "neighboring_relation": relation_name(self.neighboring_relation)}


@dataclasses.dataclass(frozen=True)
class PoissonSampling(BatchSelection):
    """Each step includes every example independently with probability q = B / N (batch size random)."""

    name: ClassVar[str] = "poisson"
    neighboring_relation: ClassVar[NeighborRel] = NeighborRel.ADD_OR_REMOVE_ONE

    def dp_event(self, step: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        return events.poisson_sampled(step, self.sample_rate, self.steps)

    def epoch(self, generator: torch.Generator, device_generator: torch.Generator | None = None,
              pad_to: int | None = None) -> Iterator[StepIndices]:
        """K ~ Binomial(N, q) from `generator` (the host's), then K of the N indices uniformly at random from
        `device_generator`: each example is in the batch with probability q, independently of the others."""
        import torch  # lazy: heavy (torch)

        device_generator = device_generator or generator
        counts = torch.full((self.steps_per_epoch,), float(self.dataset_size))
        rates = torch.full((self.steps_per_epoch,), self.sample_rate)
        sizes = torch.binomial(counts, rates, generator=generator).long().tolist()  # the epoch's, on the host
        for size in sizes:
            order = torch.randperm(self.dataset_size, generator=device_generator, device=device_generator.device)
            yield StepIndices.of(order[:size], size, pad_to)


@dataclasses.dataclass(frozen=True)
class FixedSizeSampling(BatchSelection):
    """Each step draws exactly B examples without replacement, independently of other steps."""

    name: ClassVar[str] = "fixed"
    neighboring_relation: ClassVar[NeighborRel] = NeighborRel.REPLACE_ONE

    def dp_event(self, step: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        return events.sampled_without_replacement(step, self.dataset_size, self.batch_size, self.steps)

    def epoch(self, generator: torch.Generator, device_generator: torch.Generator | None = None,
              pad_to: int | None = None) -> Iterator[StepIndices]:
        import torch  # lazy: heavy (torch)

        device_generator = device_generator or generator
        for _ in range(self.steps_per_epoch):
            order = torch.randperm(self.dataset_size, generator=device_generator, device=device_generator.device)
            yield StepIndices.of(order[: self.batch_size], self.batch_size, pad_to)


@dataclasses.dataclass(frozen=True)
class ShuffleSampling(BatchSelection):
    """One random permutation per epoch, cut into `steps_per_epoch` near-equal consecutive batches.

    Every example is in exactly one batch per epoch (batches hold N / steps_per_epoch examples, within
    one of each other), so a record joins `epochs` releases; no amplification is claimed.
    """

    name: ClassVar[str] = "shuffle"
    neighboring_relation: ClassVar[NeighborRel] = NeighborRel.REPLACE_ONE

    def dp_event(self, step: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        return dp_accounting.SelfComposedDpEvent(step, self.epochs)

    def epoch(self, generator: torch.Generator, device_generator: torch.Generator | None = None,
              pad_to: int | None = None) -> Iterator[StepIndices]:
        import torch  # lazy: heavy (torch)

        device_generator = device_generator or generator
        order = torch.randperm(self.dataset_size, generator=device_generator, device=device_generator.device)
        start = 0
        for size in self.sizes():
            yield StepIndices.of(order[start:start + size], size, pad_to)
            start += size

    def sizes(self) -> list[int]:
        """The batch sizes of one epoch (those of `torch.tensor_split`: the first N mod steps are one larger)."""
        whole, extra = divmod(self.dataset_size, self.steps_per_epoch)
        return [whole + (i < extra) for i in range(self.steps_per_epoch)]


@dataclasses.dataclass(frozen=True)
class FixedOrderSampling(ShuffleSampling):
    """Cyclic batches: one permutation of the training set, fixed before training, cut into `steps_per_epoch`
    batches that every epoch visits in the same order (DP-FTRL's and DP-MF's participation, Kairouz et al.
    2021, Choquette-Choo et al. 2023).

    The order is a function of `order_seed` alone: it does not depend on the data, nor on the trial's
    generator, so it is the same on neighbouring datasets (an example replaced keeps its slot). Each example
    joins exactly the steps i, i + P, ..., i + (E - 1) P of its batch's offset i (`participation`: cyclic,
    P = steps_per_epoch, E = epochs). Relation: replace-one, as `fixed` and `shuffle` (batch sizes are fixed).

    With DP-SGD's memoryless noise, the event is `shuffle`'s (one Gaussian per epoch, no amplification). A
    correlated-noise part states one Gaussian for the whole run from `participation` instead
    (`mechanisms.parts.correlated_noise`).
    """

    order_seed: int = 0

    name: ClassVar[str] = "fixed-order"
    neighboring_relation: ClassVar[NeighborRel] = NeighborRel.REPLACE_ONE

    @property
    def participation(self) -> Participation:
        """The steps one example joins: the cyclic schema of this order."""
        from mechanisms.parts.participation import Participation  # lazy: keeps privbench privacy light

        return Participation.cyclic(self.steps_per_epoch, self.epochs)

    def order(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The permutation every epoch cuts into batches: drawn from `order_seed` alone, on the host (the same
        on every device), then moved to `device`."""
        import torch  # lazy: heavy (torch)

        generator = torch.Generator().manual_seed(self.order_seed)
        return torch.randperm(self.dataset_size, generator=generator).to(device)

    def epoch(self, generator: torch.Generator, device_generator: torch.Generator | None = None,
              pad_to: int | None = None) -> Iterator[StepIndices]:
        """The fixed batches, in the fixed order; `generator` is not read (the order is fixed before training)."""
        device = (device_generator or generator).device
        order = self.order(device)
        start = 0
        for size in self.sizes():
            yield StepIndices.of(order[start:start + size], size, pad_to)
            start += size

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "order_seed": self.order_seed, "participation": self.participation.describe()}


SAMPLERS: dict[str, type[BatchSelection]] = {s.name: s for s in (PoissonSampling, FixedSizeSampling, ShuffleSampling,
                                                                 FixedOrderSampling)}


@dataclasses.dataclass(frozen=True)
class PoissonRate:
    """Poisson sampling stated by its rate q and step count T rather than by (N, B, epochs): for accounting
    alone (`privbench privacy --sample-rate --steps`, DP-Forward's claimed central analysis). Its event is
    `PoissonSampling`'s, through the same `events.poisson_sampled`; it runs nothing (no `epoch`)."""

    sample_rate: float
    steps: int

    name: ClassVar[str] = "poisson"
    neighboring_relation: ClassVar[NeighborRel] = NeighborRel.ADD_OR_REMOVE_ONE

    def __post_init__(self) -> None:
        require_sample_rate(self.sample_rate)
        require_steps(self.steps)

    def dp_event(self, step: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        return events.poisson_sampled(step, self.sample_rate, self.steps)

    def describe(self) -> dict[str, object]:
        return {"sampler": self.name, "steps": self.steps, "sample_rate": self.sample_rate,
                "neighboring_relation": relation_name(self.neighboring_relation)}




def batch_selection(name: str, dataset_size: int, batch_size: int, epochs: int) -> BatchSelection:
    if name not in SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}; known: {', '.join(SAMPLERS)}")
    return SAMPLERS[name](dataset_size, batch_size, epochs)


def relation_name(relation: NeighborRel) -> str:
    return relation.name.lower().replace("_", "-")


@dataclasses.dataclass(frozen=True)
class StepIndices:
    """One step's examples: their indices (a device tensor), how many are examples (a host integer), and,
    when the step is padded to a multiple of rows, each row's weight (1 for an example, 0 for padding)."""

    index: torch.Tensor
    size: int
    weights: torch.Tensor | None = None

    @classmethod
    def of(cls, index: torch.Tensor, size: int, pad_to: int | None = None) -> StepIndices:
        """`index` as it is, or padded with row 0 at weight 0 up to the next multiple of `pad_to` rows (at
        least one row, so that an empty Poisson batch still has a shape)."""
        import torch  # lazy: heavy (torch)

        if not pad_to:
            return cls(index, size)
        rows = max(pad_to, -(-size // pad_to) * pad_to)
        weights = torch.zeros(rows, device=index.device)
        weights[:size] = 1.0
        padding = torch.zeros(rows - size, dtype=index.dtype, device=index.device)
        return cls(torch.cat([index, padding]), size, weights)


class EpochBatches:
    """Adapts a `BatchSelection` to torch's batch-sampler protocol (an iterable of index lists with a
    length, what `DataLoader(batch_sampler=...)` takes) for data streamed from the host: `len` is the steps
    of one epoch. The same draws as the device path from a host generator."""

    def __init__(self, selection: BatchSelection, generator: torch.Generator) -> None:
        self.selection, self.generator = selection, generator

    def __len__(self) -> int:
        return self.selection.steps_per_epoch

    def __iter__(self) -> Iterator[list[int]]:
        return (step.index.tolist() for step in self.selection.epoch(self.generator))


__all__ = ["SAMPLERS", "BatchSelection", "EpochBatches", "FixedOrderSampling", "FixedSizeSampling",
           "PoissonRate",
           "PoissonSampling", "ShuffleSampling", "StepIndices", "batch_selection", "relation_name"]
