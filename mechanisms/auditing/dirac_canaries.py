"""White-box Dirac gradient canaries for a one-run audit of an Opacus training run.

Steinke, Nasr & Jagielski (2023), white-box variant: m parameter coordinates are canaries, each
included independently with probability 1/2 (from a seed). Inside the optimizer step, after Opacus
has clipped and summed the per-example gradients and before it adds noise, every included canary
adds C (the clip) at its coordinate, the gradient of a worst-case example of norm C. The
privatised value at every canary coordinate is accumulated over the run as that canary's score;
`estimate(delta)` turns the scores into the one-run epsilon lower bound (guess "in" for the
highest scores, abstain on the rest).

Two details keep the bound sound and useful:
- A canary must not leak more than a real example does. Under Poisson sampling at rate q an
  example joins a step with probability q, so an included canary joins each step independently
  with probability `sample_rate` (pass the loader's rate; 1.0 for full-batch or fixed batches
  accounted without amplification).
- `score="residual"` (default) subtracts the real batch's clipped sum at the coordinate, read
  before the canary is added. Conditional on the rest of the batch, each step is still a
  (subsampled) Gaussian mechanism in the canary, so the guarantee holds for the residual too, and
  the data's gradient no longer drowns the canary. `score="update"` uses the privatised value as is.

Opacus 1.6 order in `DPOptimizer.pre_step`: `clip_and_accumulate()` fills `p.summed_grad`,
`add_noise()` sets `p.grad = summed_grad + noise`, `scale_grad()` divides by the batch size. The
canaries wrap `add_noise` on the optimizer instance (not `step_hook`, which Opacus' accountant uses),
including a mechanism's own replacement of it (gredp's frequency-domain noise), so any mechanism
whose noise step reads `p.summed_grad` and writes `p.grad` is audited through its real code.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from mechanisms.auditing import one_run
from mechanisms.auditing.canary import CanaryScoreAuditor

SCORES = ("residual", "update")


@dataclasses.dataclass(frozen=True)
class OneRunEstimate:
    """epsilon: lower bound at `delta` holding with probability 1 - significance."""

    epsilon: float
    delta: float
    significance: float
    canaries: int
    included: int
    steps: int
    overhead_s: float  # time spent in canary injection and scoring

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class DiracCanaries:
    """m Dirac gradient canaries over a model's flattened trainable parameters."""

    def __init__(self, n_params: int, m: int, *, clip: float, sample_rate: float, seed: int = 0,
                 score: str = "residual") -> None:
        if not 1 <= m <= n_params:
            raise ValueError(f"need 1 <= m <= n_params ({n_params}) canaries, got {m}")
        if not clip > 0:
            raise ValueError(f"clip must be > 0, got {clip}")
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate}")
        if score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}, got {score!r}")
        rng = np.random.default_rng([seed, 0xD1AC])
        self.n_params, self.m, self.clip, self.sample_rate, self.score_kind = n_params, m, clip, sample_rate, score
        self.coordinates = np.sort(rng.choice(n_params, size=m, replace=False))
        self.included = rng.random(m) < 0.5
        self.scores = np.zeros(m)
        self.steps = 0
        self.overhead_s = 0.0
        self._participation = np.random.default_rng([seed, 0x5A3F])
        self._optimizer: Any = None
        self._layout: list[tuple[int, Any, np.ndarray]] = []  # (param index, local offsets, canary ids)
        self._data = np.zeros(m)
        self._own_add_noise: Any = None

    @classmethod
    def attach_to(cls, optimizer: Any, m: int, *, sample_rate: float, seed: int = 0,
                  score: str = "residual") -> DiracCanaries:
        """Canaries over all of `optimizer.params`, clip = its `max_grad_norm`, already attached.

        Under Opacus' per-layer clipping `max_grad_norm` is the total norm sqrt(sum_l C_l^2), the
        sensitivity of the sum: against isotropic noise a Dirac canary of that norm leaks exactly as
        much as a worst-case example with norm C_l in every tensor.
        """
        n_params = sum(p.numel() for p in optimizer.params)
        canaries = cls(n_params, m, clip=float(optimizer.max_grad_norm), sample_rate=sample_rate, seed=seed,
                       score=score)
        return canaries.attach(optimizer)

    # -- Opacus plumbing ----------------------------------------------------------------------

    def attach(self, optimizer: Any) -> DiracCanaries:
        import torch

        if self._optimizer is not None:
            raise RuntimeError("these canaries are already attached")
        if getattr(optimizer.add_noise, "_dirac_canaries", None) is not None:
            raise RuntimeError("this optimizer already carries Dirac canaries")
        sizes = [p.numel() for p in optimizer.params]
        if sum(sizes) != self.n_params:
            raise ValueError(f"optimizer has {sum(sizes)} parameters, canaries were drawn for {self.n_params}")
        starts = np.cumsum([0, *sizes])
        self._layout = []
        for i in range(len(sizes)):
            ids = np.flatnonzero((self.coordinates >= starts[i]) & (self.coordinates < starts[i + 1]))
            if ids.size:
                local = torch.as_tensor(self.coordinates[ids] - starts[i], dtype=torch.long)
                self._layout.append((i, local, ids))
        # A mechanism may already have replaced add_noise on the instance (gredp's frequency-domain
        # noise): wrap whatever is there, and put exactly that back on detach.
        self._own_add_noise = vars(optimizer).get("add_noise")
        original = optimizer.add_noise

        def add_noise() -> None:
            t0 = time.perf_counter()
            self._inject(optimizer)
            self.overhead_s += time.perf_counter() - t0
            original()
            t1 = time.perf_counter()
            self._read(optimizer)
            self.overhead_s += time.perf_counter() - t1

        add_noise._dirac_canaries = self  # type: ignore[attr-defined]
        optimizer.add_noise = add_noise
        self._optimizer = optimizer
        return self

    def detach(self) -> None:
        """Restore the optimizer's previous `add_noise`; scores are kept."""
        if self._optimizer is None:
            return
        if self._own_add_noise is None:
            del self._optimizer.add_noise
        else:
            self._optimizer.add_noise = self._own_add_noise
        self._optimizer = None

    def _inject(self, optimizer: Any) -> None:
        import torch

        joins = self.included & (self._participation.random(self.m) < self.sample_rate)
        for i, local, ids in self._layout:
            p = optimizer.params[i]
            if not p.summed_grad.is_contiguous():
                p.summed_grad = p.summed_grad.contiguous()
            flat = p.summed_grad.view(-1)
            idx = local.to(flat.device)
            self._data[ids] = flat[idx].detach().double().cpu().numpy()
            bump = torch.as_tensor(joins[ids] * self.clip, dtype=flat.dtype, device=flat.device)
            flat.index_add_(0, idx, bump)

    def _read(self, optimizer: Any) -> None:
        for i, local, ids in self._layout:
            p = optimizer.params[i]
            released = p.grad.reshape(-1)[local.to(p.grad.device)].detach().double().cpu().numpy()
            if self.score_kind == "residual":
                released = released - self._data[ids]
            self.scores[ids] += released / self.clip
        self.steps += 1

    # -- estimates --------------------------------------------------------------------------

    def auditor(self) -> CanaryScoreAuditor:
        return CanaryScoreAuditor(self.scores[self.included], self.scores[~self.included])

    def estimate(self, delta: float, significance: float = 0.05) -> OneRunEstimate:
        """The one-run epsilon lower bound at `delta` (95% by default) from the accumulated scores."""
        n_in = int(self.included.sum())
        if 0 < n_in < self.m:
            eps = self.auditor().epsilon_one_run(significance, delta)
        else:  # one side empty: the only rule is "all in", fixed in advance, so no correction
            eps = one_run.epsilon_one_run(self.m, self.m, n_in, significance, delta)
        return OneRunEstimate(epsilon=float(eps), delta=delta, significance=significance, canaries=self.m,
                              included=n_in, steps=self.steps, overhead_s=self.overhead_s)
