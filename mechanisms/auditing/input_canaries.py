"""Input canaries: a one-run audit (Steinke, Nasr & Jagielski 2023) whose canaries are inputs, not gradients.

The Dirac gradient canaries (`dirac_canaries`) enter the clipped sum inside the optimizer step: they never pass
through the data, the model's forward pass or the loss, so a model that mixes the rows of a batch, a loss
normalised over the batch or a step that adds no noise to what the model memorises are invisible to them. Input
canaries are examples. Each is included with probability 1/2 (from the seed); an included canary joins each
step of the run as an example of a Poisson-sampled run does (independently, with the plan's rate q), is encoded
by the model's own encoder, runs through the model, the loss, the clipping engine and the noise, and is scored
on the final model. The bound is the one-run estimator's (`white_box.one_run_bounds`: the larger of the Steinke
and the f-DP bound, each at half the significance, over guess counts fixed before the run), so it is in the same
units as the white-box bound, a 95% lower bound on the run's epsilon.

Which inputs: out-of-distribution ones with uniformly random labels (entries of +-1 for images and feature
vectors, strings of random letters for texts), drawn from the seed and the dataset's public shape alone. Not
training-domain examples with a wrong label: the real data pulls such an example towards its true label, so
its own gradient moves its score little, while an input far from the data sits where no training example
constrains the model, and its score moves mostly by its own gradient (the largest in/out separation). They also
read no row of any split (a held-out split holds too few rows for a thousand canaries, and reading the training
split would make the audit depend on private data).

Why the plan stays honest: an included canary is one more example of the accounted process (the plan's N, q,
T and sigma are unchanged, and no plan parameter depends on which canaries are in), and the certificate covers
adding one example. That holds for Poisson sampling (add-or-remove neighbours); other samplers are skipped.

The score of a canary is how much training raised the log-probability of its label: the final model's minus
the initial model's (the initial model is fixed by the seed before any canary joins, so subtracting it removes
each canary's own starting point and reads nothing that depends on which canaries are in). The bound's ceiling
depends on m: with every guess right it reaches about 2.95 at m = 500, 4.1 at m = 750 and 4.4 at m = 1,000
(delta 1e-5). Its power is a black-box audit's: one example moves a DP-SGD model by lr C / B per step it joins,
so the canaries separate only when the run memorises them (many epochs; docs/auditing.md gives numbers).
NumPy only (the caller runs the model).
"""

from __future__ import annotations

import dataclasses
import string
from typing import Any

import numpy as np

from mechanisms.auditing import white_box

# The top-r guesses, as fractions of the canaries, fixed before the run (Bonferroni over them): an included
# canary joins at least one step with probability 1 - (1 - q)^T (0.87 at q 0.0445, T 44: digits, 2 epochs of
# batch 64), so a run that leaks everything puts about 0.43 m included canaries on top; a milder leak shows
# among the first few.
GUESS_FRACTIONS = (0.05, 0.1, 0.2, 0.4)
AUTO_CANARIES = 1_000  # `auto`: this many, at most half the training set (at most a quarter more rows per step)
TEXT_WORDS = 12  # words of a text canary
SIGNIFICANCE = 0.05


def auto_count(n_train: int) -> int:
    """`audit.input_canaries: auto`: AUTO_CANARIES, at most half the training set (the included half then adds at
    most a quarter to each step's rows, the audit's cost), and at least 2 (one in, one out, on average)."""
    return max(2, min(AUTO_CANARIES, n_train // 2))


def guess_counts(m: int) -> tuple[int, ...]:
    """The top-r guess counts of m canaries, from m alone (so fixed before the run)."""
    return tuple(sorted({max(1, int(f * m)) for f in GUESS_FRACTIONS}))


@dataclasses.dataclass(frozen=True)
class CanaryInputs:
    """m canaries: their inputs (a float32 array shaped like the dataset's rows, or a list of texts), their
    labels, and which are included in the run."""

    inputs: Any
    labels: np.ndarray
    included: np.ndarray

    @property
    def m(self) -> int:
        return int(self.labels.size)


def draw(kind: str, input_shape: tuple[int, ...] | None, num_classes: int, m: int, seed: int) -> CanaryInputs:
    """m out-of-distribution canaries with uniformly random labels, each included with probability 1/2, from
    `seed` and the public description of the dataset alone (kind, row shape, classes)."""
    if m < 1:
        raise ValueError(f"input canaries need m >= 1, got {m}")
    rng = np.random.default_rng([seed, 0x1C4A])
    if kind == "text":
        letters = np.array(list(string.ascii_lowercase))
        inputs: Any = [" ".join("".join(rng.choice(letters, size=rng.integers(3, 9))) for _ in range(TEXT_WORDS))
                       for _ in range(m)]
    else:
        if not input_shape:
            raise ValueError(f"a {kind} dataset without an input shape cannot have input canaries")
        inputs = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=(m, *input_shape))
    labels = rng.integers(0, num_classes, m).astype(np.int64)
    included = rng.random(m) < 0.5
    return CanaryInputs(inputs, labels, included)


def schedule(included: np.ndarray, sample_rate: float, steps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Every step's joining canaries, drawn before the run: every included canary joins each of the `steps` steps
    independently with probability `sample_rate`, as an example of a Poisson-sampled run does. Returns the
    canary indices of all steps in one array and each step's offsets into it (step t: `index[offsets[t]:offsets[t +
    1]]`), so a trainer moves them to its device once and slices them with host integers (no step waits)."""
    rng = np.random.default_rng([seed, 0x1C4B])
    members = np.flatnonzero(included)
    joined = rng.random((steps, members.size)) < sample_rate if members.size else np.zeros((steps, 0), dtype=bool)
    step_of, column = np.nonzero(joined)  # row-major: step by step
    offsets = np.concatenate([[0], np.cumsum(np.bincount(step_of, minlength=steps))])
    return members[column].astype(np.int64), offsets.astype(np.int64)


@dataclasses.dataclass(frozen=True)
class InputCanaryBound:
    """The run-level lower bound from the input canaries (`epsilon`: the larger of `steinke` and `fdp`), the
    guess count that gave it, and the canaries (m, included)."""

    epsilon: float
    steinke: float
    fdp: float
    guesses: int
    canaries: int
    included: int


def bound(scores: np.ndarray, included: np.ndarray, delta: float,
          significance: float = SIGNIFICANCE) -> InputCanaryBound:
    """The (1 - significance) lower bound on epsilon at `delta` from the canaries' scores (high: in)."""
    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    if scores.shape != included.shape:
        raise ValueError(f"{scores.size} scores for {included.size} canaries")
    if not np.isfinite(scores).all():  # a NaN score would sort anywhere: no guess may rest on it
        raise ValueError("the input canaries' scores are not all finite")
    b = white_box.one_run_bounds(scores, included, delta, significance=significance,
                                 guess_counts=guess_counts(scores.size), with_gdp=False)
    return InputCanaryBound(float(b.epsilon_audited), float(b.epsilon_steinke), float(b.epsilon_fdp), int(b.guesses),
                            int(scores.size), int(included.sum()))


__all__ = ["AUTO_CANARIES", "CanaryInputs", "InputCanaryBound", "auto_count", "bound", "draw", "guess_counts",
           "schedule"]
