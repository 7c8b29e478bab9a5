"""The one-run canary audit of a correlated-noise run (DP-FTRL, DP-MF), scored with the known correlation.

`DiracCanaries` scores each canary by a statistic of independent per-step observations. Under correlated noise
(step t's noise is s w_t, w = M z with the strategy's known M) the residuals at a canary's coordinate are
r = s w + (pushes), with covariance s^2 Sigma, Sigma = M M^T declared by the noise part
(`CorrelatedNoise.covariance`). The auditor knows M (it is public, as the mechanism is), so it decorrelates:
with L L^T = Sigma (`CorrelatedNoise.whiten` applies L^-1; for a banded C, L^-1 = C), L^-1 r = L^-1 b + s z'
with z' i.i.d., b the canary's pushes. The likelihood-ratio test of "pushed at pattern b" against "not
pushed" is then the projection

    score = <L^-1 b, L^-1 r> / ||L^-1 b||,     N(||L^-1 b|| / s, 1) vs N(0, 1) in units of s,

so each canary's score is one Gaussian mechanism's output, as tight as the noise allows: the bound is not loose
because the noise is correlated, and stays valid (Steinke, Nasr & Jagielski's guarantee needs only each
canary's inclusion to be a fair coin and the run to be DP with respect to it).

A canary must not leak more than a real example: it joins the steps a real example joins, i.e. under the
executed `fixed-order` (cyclic) schema one step per epoch at a fixed offset o_c (drawn uniformly in [0, P) from
the seed), never the independent Poisson coin of `DiracCanaries`. Its pattern is then an admissible pattern of
the schema, whose sensitivity the certificate covers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from mechanisms.auditing.dirac_canaries import CanaryObservations, DiracCanaries

if TYPE_CHECKING:
    from mechanisms.parts.correlated_noise import CorrelatedNoise


class CorrelatedCanaries(DiracCanaries):
    """Dirac canaries joining as fixed-order examples do, scored after whitening with the declared correlation."""

    def __init__(self, n_params: int, m: int, *, clip: float, noise: CorrelatedNoise, steps_per_epoch: int,
                 seed: int = 0, statistic: str = "lr", guess_counts: tuple[int, ...] | None = None,
                 planned_steps: int | None = None) -> None:
        super().__init__(n_params, m, clip=clip, sample_rate=1.0, seed=seed, score="residual", statistic=statistic,
                         guess_counts=guess_counts, planned_steps=planned_steps, correlation=noise.correlation)
        self.noise, self.steps_per_epoch = noise, steps_per_epoch
        self.offsets = np.random.default_rng([seed, 0xC0FF]).integers(0, steps_per_epoch, m)
        self._observed: list[np.ndarray] = []  # per block, (rows, m) observations in units of the clip
        self._injected = 0  # steps whose joins were drawn
        self._whitened: tuple[int, np.ndarray, np.ndarray] | None = None

    @classmethod
    def attach_correlated(cls, optimizer: Any, m: int, *, noise: CorrelatedNoise, steps_per_epoch: int,
                          seed: int = 0, statistic: str = "lr", unit: float | None = None,
                          planned_steps: int | None = None) -> CorrelatedCanaries:
        """Canaries over all of `optimizer.params`, attached; `unit` is the plan's (`Parts.audit_bound`), the
        optimizer's declared bound without it."""
        n_params = sum(p.numel() for p in optimizer.params)
        clip = unit if unit is not None else float(getattr(optimizer, "declared_bound", None)
                                                   or optimizer.max_grad_norm)
        return cls(n_params, m, clip=clip, noise=noise, steps_per_epoch=steps_per_epoch, seed=seed,
                   statistic=statistic, planned_steps=planned_steps).attach(optimizer)

    def _joins(self, rows: int) -> np.ndarray:
        """An included canary joins the steps t with t mod P = its offset: once per epoch, as an example."""
        steps = self._injected + np.arange(rows)
        self._injected += rows
        return self.included & (steps[:, None] % self.steps_per_epoch == self.offsets[None, :])

    def _score_pending(self) -> None:
        """Keep the block's observations (scored once the run is over: whitening needs every step)."""
        if not self._rows:
            return
        t0 = time.perf_counter()
        block = self._pending[: self._rows].detach().double().cpu().numpy()
        bounds = self._bounds[: self._rows].detach().double().cpu().numpy()[:, None]
        ids = self._ids
        observed = np.zeros((self._rows, self.m))
        observed[:, ids] = (block[:, 1] - block[:, 0]) * self.signs[ids] / bounds
        self._observed.append(observed)
        self._series.add(observed)  # the noise checks whiten the excluded canaries' series with the correlation
        self._steps += self._rows
        # the rows left in the joins' block were drawn but not run: the next block starts after the run ones
        self._injected = self._steps
        self._rows = 0
        self._whitened = None
        self.overhead_s += time.perf_counter() - t0

    def whitened_scores(self) -> np.ndarray:
        """Each canary's projection score <L^-1 b_c, L^-1 r_c> / ||L^-1 b_c|| (module docstring)."""
        self._score_pending()
        if self._whitened is not None and self._whitened[0] == self._steps:
            return self._whitened[1]
        if not self._observed:
            return np.zeros(self.m)
        observed = np.concatenate(self._observed)  # (steps, m)
        steps = observed.shape[0]
        white = self.noise.whiten(observed)
        patterns = np.zeros((steps, self.steps_per_epoch))
        for offset in range(self.steps_per_epoch):
            patterns[offset::self.steps_per_epoch, offset] = 1.0
        signal = self.noise.whiten(patterns)  # (steps, P): each offset's whitened pattern
        norms = np.linalg.norm(signal, axis=0)
        norms[norms == 0] = 1.0
        scores = np.einsum("tc,tc->c", signal[:, self.offsets] / norms[self.offsets], white)
        out = white[:, self.noise_columns]  # one excluded canary per coordinate (DiracCanaries.noise_columns)
        sq = out * out
        self._noise_moments = np.array([out.size, float(sq.sum()), float((sq * sq).sum())])
        self._whitened = (self._steps, scores, white)
        return scores

    @property
    def scores(self) -> np.ndarray:
        return self.whitened_scores()

    @property
    def lr_scores(self) -> np.ndarray:
        return self.whitened_scores()

    @property
    def noise_moments(self) -> np.ndarray:
        self.whitened_scores()
        return self._noise_moments

    def observations(self) -> CanaryObservations:
        scores = self.whitened_scores()
        return CanaryObservations(self.statistic, scores.copy(), scores.copy(), self.included.copy(),
                                  self._noise_moments.copy(), self.guess_counts, self._steps, self.overhead_s,
                                  self._series.summary())


def simulated_run(noise: CorrelatedNoise, steps_per_epoch: int, epochs: int, sigma: float, m: int,
                  seed: int = 0) -> tuple[CorrelatedCanaries, np.ndarray]:
    """The certified mechanism itself, simulated: m canaries (coordinates of their own), each pushed 1 (the clip)
    at its fixed-order steps, noise sigma w from the part's own stream. Returns the canaries (their observations
    recorded) and the (steps, m) observations."""
    import torch  # lazy: heavy (torch)

    steps = steps_per_epoch * epochs
    canaries = CorrelatedCanaries(m, m, clip=1.0, noise=noise, steps_per_epoch=steps_per_epoch, seed=seed,
                                  planned_steps=steps)
    stream = noise.start()
    generator = torch.Generator().manual_seed(seed)
    joins = canaries._joins(steps)
    zero = [torch.zeros(1, m, dtype=torch.float64)]
    rows = [stream.release(zero, sigma, generator)[0][0].numpy() / noise.std_per_sigma for _ in range(steps)]
    observed = np.stack(rows) + joins
    canaries._observed, canaries._steps = [observed], steps
    canaries._series.add(observed)
    return canaries, observed


def simulate(noise: CorrelatedNoise, steps_per_epoch: int, epochs: int, sigma: float, m: int, seed: int = 0,
             whiten: bool = True) -> CanaryObservations:
    """The audit's observations on `simulated_run`. `whiten: False` scores the raw sum of each canary's
    observations at its steps instead (what an auditor ignoring the correlation does)."""
    canaries, observed = simulated_run(noise, steps_per_epoch, epochs, sigma, m, seed)
    if whiten:
        return canaries.observations()
    steps = observed.shape[0]
    raw = (observed * (np.arange(steps)[:, None] % steps_per_epoch == canaries.offsets[None, :])).sum(axis=0)
    return CanaryObservations("sum", raw, raw, canaries.included.copy(), np.zeros(3), None, steps, 0.0,
                              canaries._series.summary())


__all__ = ["CorrelatedCanaries", "simulate", "simulated_run"]
