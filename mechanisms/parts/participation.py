"""Participation schemas: in which steps of a run one example's gradient can appear.

A correlated-noise mechanism (DP-FTRL's tree, banded matrix factorization) adds noise that is a fixed linear
combination of independent Gaussian draws across steps, so its privacy is not a per-step event composed over
the run: it is ONE Gaussian mechanism on the whole run, whose sensitivity depends on the set of steps one
example can join (Choquette-Choo et al., ICML 2023, arXiv 2211.06530, Section 2; Kairouz et al., ICML 2021,
arXiv 2103.00039, Appendix D). The schema states that set:

| schema                 | the steps one example joins                                              |
|------------------------|--------------------------------------------------------------------------|
| `cyclic`               | exactly i, i + b, ..., i + (k - 1) b for one offset i in [0, b)         |
|                        | (`fixed-order` batches: one fixed order, each example once per epoch)   |
| `min-separation`       | any set of at most k steps, any two at least b apart (b-min-separation) |

`cyclic` is what the `fixed-order` sampler executes (b = steps per epoch, k = epochs); `min-separation` is
the papers' schema, a superset of it, so a sensitivity under it bounds the cyclic one. `patterns()` lists
every admissible pattern (for the brute-force checks of small runs; a cyclic schema has b of them).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

SCHEMAS = ("cyclic", "min-separation")


@dataclasses.dataclass(frozen=True)
class Participation:
    """`steps` steps in all; one example joins at most `max_participations` of them, any two at least
    `min_separation` apart (`schema` says whether at fixed offsets, `cyclic`, or anywhere, `min-separation`)."""

    steps: int
    max_participations: int
    min_separation: int
    schema: str = "cyclic"

    def __post_init__(self) -> None:
        for field in ("steps", "max_participations", "min_separation"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be an integer >= 1, got {value!r}")
        if self.schema not in SCHEMAS:
            raise ValueError(f"schema must be one of {', '.join(SCHEMAS)}, got {self.schema!r}")
        if self.schema == "cyclic" and self.max_participations > -(-self.steps // self.min_separation):
            raise ValueError(f"a cyclic schema of {self.steps} steps at separation {self.min_separation} has at most "
                             f"{-(-self.steps // self.min_separation)} participations, not {self.max_participations}")

    @classmethod
    def cyclic(cls, steps_per_epoch: int, epochs: int) -> Participation:
        """One fixed order repeated every epoch: offset i joins steps i, i + P, ..., i + (E - 1) P."""
        return cls(steps_per_epoch * epochs, epochs, steps_per_epoch, "cyclic")

    @property
    def single(self) -> bool:
        """Whether an example joins one step at most (the sensitivity is then the largest column norm)."""
        return self.max_participations == 1

    def patterns(self) -> Iterator[tuple[int, ...]]:
        """Every admissible pattern, as sorted step indices. Cyclic: the `min_separation` offsets. Min-separation:
        every non-empty set of at most k steps pairwise >= b apart (exponential in k: small runs only)."""
        if self.schema == "cyclic":
            for offset in range(min(self.min_separation, self.steps)):
                yield tuple(range(offset, self.steps, self.min_separation))[: self.max_participations]
            return
        for size in range(1, self.max_participations + 1):
            for pattern in itertools.combinations(range(self.steps), size):
                if all(b - a >= self.min_separation for a, b in itertools.pairwise(pattern)):
                    yield pattern

    def describe(self) -> dict[str, object]:
        return dataclasses.asdict(self)


__all__ = ["SCHEMAS", "Participation"]
