"""The audits a trial runs (grid key `audit`), turned into the privacy fields of its result record.

Two audits answer two different questions, so their numbers are kept apart:
- `step`: the mechanism-level audit of ONE un-subsampled privatisation step at the trial's sigma. Its
  verdict (a measured error pair strictly below the claimed one-step curve) falsifies the per-step claim
  a paper's analysis is built on, so it can make the trial `violated`. Its epsilon is NOT a lower bound
  on the whole run's epsilon (subsampling and composition change the threat model), so it is reported as
  `epsilon_audited_step` and never compared with the run-level claim.
- `one-run`: Dirac gradient canaries inside the real training run, scored by the likelihood ratio of
  the subsampled Gaussian; the larger of the Steinke, Nasr & Jagielski (2023) and the f-DP
  (Mahloujifar et al. 2024) bounds, each at half the significance, is a run-level lower bound and
  fills `epsilon_audited`; `audit_ceiling` is what the same analysis reaches on the certified
  mechanism simulated exactly (docs/auditing.md).
- `mia`: a black-box loss-threshold membership-inference view of every private or non-private trial
  (AUC, TPR at 0.1% / 1% FPR); no canaries, no bound.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from mechanisms.claims import REL_TOL

MODES = ("step", "one-run", "both", "off")
MIAS = ("loss", "off")
STATISTICS = ("lr", "sum")


@dataclasses.dataclass(frozen=True)
class AuditConfig:
    """Grid key `audit`. `canaries: auto` (see `canaries_for`) takes up to 25 canaries per trainable
    coordinate, as many as a simulation says help (docs/auditing.md)."""

    mode: str = "step"
    samples: int = 20_000
    dim: int = 1_000
    canaries: int | str = "auto"
    enabled: bool = True
    statistic: str = "lr"  # white-box score of a gradient canary: likelihood ratio across steps, or sum
    max_canaries: int = 50_000
    ceiling: bool = True  # simulate the certified mechanism under the same analysis
    family_bounds: bool = True  # the curve-family and noise-measurement bounds (white_box.curve_bound, noise_bound)
    # The curve-family search refines its bound for at most this share of the run's training time (at least
    # 3 s): at small noise and many steps each of its PLDs takes seconds, and the audit should stay near 1.1x.
    family_budget: float = 0.02
    mia: str = "loss"  # black-box loss-threshold membership inference on train vs held-out examples
    mia_examples: int = 5_000
    # A trial's one-step verdict: at 5% a correct mechanism would be called `violated` in 1 trial of 20 (its
    # claim is exactly the Gaussian curve the audit tests), too often for a leaderboard; at 0.1% it is 1 in
    # 1,000, while a broken noise step (GReDP's sigma / sqrt 2) is still refuted by a wide margin.
    step_significance: float = 0.001

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"audit mode must be one of {MODES}, got {self.mode!r}")
        if self.canaries != "auto" and (not isinstance(self.canaries, int) or self.canaries < 1):
            raise ValueError(f"audit canaries must be 'auto' or an integer >= 1, got {self.canaries!r}")
        if self.samples < 4 or self.dim < 1 or self.max_canaries < 1 or self.mia_examples < 10:
            raise ValueError("audit samples must be >= 4, dim and max_canaries >= 1, mia_examples >= 10")
        if self.statistic not in STATISTICS:
            raise ValueError(f"audit statistic must be one of {STATISTICS}, got {self.statistic!r}")
        if not 0 < self.step_significance < 0.5:
            raise ValueError(f"audit step_significance must lie in (0, 0.5), got {self.step_significance}")
        if not 0 <= self.family_budget < math.inf:
            raise ValueError(f"audit family_budget must be a finite share >= 0, got {self.family_budget}")
        if self.mia not in MIAS:
            raise ValueError(f"audit mia must be one of {MIAS}, got {self.mia!r}")

    @property
    def step(self) -> bool:
        return self.enabled and self.mode in ("step", "both")

    @property
    def one_run(self) -> bool:
        return self.enabled and self.mode in ("one-run", "both")

    def canaries_for(self, n_params: int, shape: tuple[float, float, int] | None, delta: float, seed: int) -> int:
        """`auto`: 1, 3, 10 or 25 canaries per trainable coordinate (at most `max_canaries`), whichever
        a simulation of the certified mechanism predicts to give the largest bound
        (`white_box.choose_canaries`); one per coordinate when the mechanism is not DP-SGD-shaped."""
        if self.canaries != "auto":
            return int(self.canaries)
        if shape is None:
            return max(1, min(self.max_canaries, n_params))
        from mechanisms.auditing import white_box

        sigma, rate, steps = shape
        return white_box.choose_canaries(n_params, steps, rate, sigma, delta, score=self.statistic, seed=seed,
                                         max_canaries=self.max_canaries)


def scaled_sizes(sizes: Sequence[int], total: int) -> list[int]:
    """`sizes` rescaled to sum to `total` (each >= 1, largest remainders rounded up): the model's tensor
    structure on the audited vector."""
    sizes = list(sizes)[:total]
    shares = [total * s / sum(sizes) for s in sizes]
    out = [max(1, int(x)) for x in shares]
    for i in sorted(range(len(sizes)), key=lambda i: shares[i] - int(shares[i]), reverse=True):
        if sum(out) >= total:
            break
        out[i] += 1
    while sum(out) > total:
        out[out.index(max(out))] -= 1
    return out


def step_audit(mechanism: ModuleType, plan: Any, clip: float, cfg: AuditConfig, options: dict[str, Any],
               seed: int, workers: int, tensor_sizes: Sequence[int] | None = None) -> dict[str, Any]:
    """Fields for the record; empty when the mechanism has no noise to audit.

    A mechanism whose release transforms each parameter tensor on its own (gredp's per-tensor FFT) is
    audited on the model's tensor structure scaled to the audited dimension (`tensor_sizes`).
    """
    if plan.sigma is None or not hasattr(mechanism, "privatize_step"):
        return {}
    from mechanisms.auditing import audit_step

    if tensor_sizes and "tensor_sizes" in inspect.signature(mechanism.privatize_step).parameters:
        options = options | {"tensor_sizes": scaled_sizes(tensor_sizes, cfg.dim)}

    audit = audit_step(mechanism, plan.sigma, samples=cfg.samples, delta=plan.delta, dim=cfg.dim, clip=clip,
                       seed=seed, workers=workers, options=options, significance=cfg.step_significance)
    return {"epsilon_audited_step": audit.epsilon_audited, "mu_audited": audit.mu_audited,
            "mu_claimed": audit.mu_claimed, "audit_step_violated": audit.violated,
            "audit_step_curve": audit.claimed_curve, "audit_step_s": audit.wall_s}


def dpsgd_shape(event: Any) -> tuple[float, float, int] | None:
    """(noise multiplier, sampling rate, steps) when `event` is T Poisson-subsampled Gaussian steps."""
    import dp_accounting

    count = 1
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        event, count = event.event, event.count
    rate = 1.0
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        event, rate = event.event, event.sampling_probability
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return float(event.noise_multiplier), float(rate), int(count)
    return None


class OneRun:
    """Attach Dirac canaries to the private optimizer (if it is an Opacus one), estimate afterwards.

    Before training it fixes, on a simulation of the certified mechanism, the guess counts of the
    one-run bound and the ceiling (`white_box.plan_guesses`); neither looks at the real run.
    """

    def __init__(self, cfg: AuditConfig, plan: Any, seed: int) -> None:
        self.cfg, self.plan, self.seed = cfg, plan, seed
        self.sample_rate = plan.sample_rate
        self.canaries: Any = None
        self.skipped: str | None = None
        self.audit_plan: Any = None
        self.plan_s = 0.0
        self.shape: tuple[float, float, int] | None = None

    def attach(self, optimizer: Any) -> Callable[[], float] | None:
        """Returns a clock of the seconds the canaries spent inside optimizer steps (kept out of the step time)."""
        if not hasattr(optimizer, "observe_releases"):
            self.skipped = "the mechanism has no private optimizer releasing noisy gradients to carry canaries"
            return None
        from mechanisms.auditing import DiracCanaries, white_box

        t0 = time.perf_counter()
        n_params = sum(p.numel() for p in optimizer.params)
        shape = self.shape = dpsgd_shape(self.plan.effective_event)
        guess_counts = None
        m = self.cfg.canaries_for(n_params, shape, self.plan.delta, self.seed)
        if shape is not None:
            sigma, rate, steps = shape
            self.audit_plan = white_box.plan_guesses(m, steps, rate, sigma, self.plan.delta, score=self.cfg.statistic,
                                                     seed=self.seed, layout_n=n_params)
            guess_counts = self.audit_plan.guess_counts
        self.canaries = DiracCanaries.attach_to(optimizer, m, sample_rate=self.sample_rate, seed=self.seed,
                                                statistic=self.cfg.statistic, guess_counts=guess_counts)
        self.plan_s = time.perf_counter() - t0
        canaries = self.canaries
        return lambda: canaries.overhead_s

    def legacy_epsilon(self, delta: float) -> float | None:
        """The estimate before issue 14 on the same canaries: Steinke at 0.05 over every threshold of the sum."""
        c = self.canaries
        n_in = int(c.included.sum())
        if not 0 < n_in < c.m:
            return None
        from mechanisms.auditing import CanaryScoreAuditor

        return CanaryScoreAuditor(c.scores[c.included], c.scores[~c.included]).epsilon_one_run(0.05, delta)

    def fields(self, delta: float, train_s: float | None = None) -> dict[str, Any]:
        if self.canaries is None:
            return {"audit_one_run_skipped": self.skipped} if self.skipped else {}
        e = self.canaries.estimate(delta)
        out: dict[str, Any] = {
            "epsilon_audited": e.epsilon, "epsilon_audited_steinke": e.epsilon_steinke,
            "epsilon_audited_fdp": e.epsilon_fdp, "epsilon_audited_fdp_gdp": e.epsilon_fdp_gdp,
            "audit_canaries": e.canaries, "audit_guesses": e.guesses, "audit_statistic": e.statistic,
            "audit_one_run_s": e.overhead_s, "audit_estimate_s": e.estimate_s, "audit_plan_s": self.plan_s,
            "audit_steps": e.steps, "epsilon_audited_legacy": self.legacy_epsilon(delta),
        }
        out |= self.family_fields(delta, None if train_s is None else max(3.0, self.cfg.family_budget * train_s))
        certified = getattr(self.plan, "epsilon_certified", None)
        if certified:
            out["audit_tightness"] = e.epsilon / certified
        if self.audit_plan is not None and self.cfg.ceiling:
            c = self.audit_plan.ceiling
            if certified:
                out["audit_ceiling_tightness"] = c.epsilon_audited / certified
            out |= {"audit_ceiling": c.epsilon_audited, "audit_ceiling_steinke": c.epsilon_steinke,
                    "audit_ceiling_fdp": c.epsilon_fdp,
                    "audit_ceiling_guess_counts": list(self.audit_plan.guess_counts)}
        return out


    def family_fields(self, delta: float, budget_s: float | None = None) -> dict[str, Any]:
        """The two run-level bounds that lean on the certified event's shape (T Poisson-subsampled Gaussian
        steps at rate q, noise multiplier unknown): the one-run f-DP test against that family's curves
        (`epsilon_audited_curve`) and the white-box noise measurement (`epsilon_audited_noise`). Either above the
        claim refutes it (`audit_run_violated`); `epsilon_audited` stays the assumption-free bound."""
        from mechanisms.auditing import white_box

        if self.shape is None or self.canaries is None:
            return {}
        t0 = time.perf_counter()
        sigma, rate, steps = self.shape
        c = self.canaries
        out: dict[str, Any] = {}
        if c.guess_counts and self.cfg.family_bounds:
            b = white_box.curve_bound(c.statistic_scores(), c.included, delta, rate, steps, sigma,
                                      guess_counts=c.guess_counts, budget_s=budget_s)
            out |= {"epsilon_audited_curve": b.epsilon, "audit_sigma_curve": b.sigma}
        n = white_box.noise_bound(c.noise_moments, rate, steps, delta) if self.cfg.family_bounds else None
        if n is not None:
            out |= {"audit_sigma_measured": n.sigma, "audit_sigma_measured_upper": n.sigma_upper,
                    "audit_noise_kurtosis": n.kurtosis, "epsilon_audited_noise": n.epsilon}
        claimed = getattr(self.plan, "epsilon_claimed", None)
        if out and claimed is not None:
            found = [out.get(k) for k in ("epsilon_audited_curve", "epsilon_audited_noise")]
            out["audit_run_violated"] = any(e is not None and e > claimed * (1 + REL_TOL) for e in found)
        if out:
            out["audit_family_s"] = time.perf_counter() - t0
        return out


def loss_threshold_mia(module: Any, members: Any, non_members: Any, *, device: Any, examples: int,
                       seed: int, batch_size: int = 1024) -> dict[str, Any]:
    """Black-box membership inference: score = -loss, training examples vs held-out ones (Yeom et al. 2018).

    No canaries and no access beyond the final model's losses: what DPMLBench and ML Privacy Meter
    report. Equal numbers of members and non-members (at most `examples` each), drawn with `seed`.
    """
    import torch
    from torch.utils.data import DataLoader, Subset

    from mechanisms.auditing import CanaryScoreAuditor

    t0 = time.perf_counter()
    n = min(len(members), len(non_members), examples)
    rng = np.random.default_rng([seed, 0x313A])

    @torch.no_grad()
    def losses(data: Any) -> np.ndarray:
        idx = np.sort(rng.choice(len(data), size=n, replace=False)).tolist()
        was_training = module.training
        module.eval()
        out = []
        for *xs, y in DataLoader(Subset(data, idx), batch_size=batch_size):
            logits = module(*[x.to(device) for x in xs])
            out.append(torch.nn.functional.cross_entropy(logits, y.to(device), reduction="none").double().cpu())
        module.train(was_training)
        return torch.cat(out).numpy()

    member_loss, other_loss = losses(members), losses(non_members)
    auditor = CanaryScoreAuditor(-member_loss, -other_loss)
    return {"mia_auc": auditor.attack_auroc(), "mia_tpr_at_0_1pct_fpr": float(auditor.tpr_at_given_fpr(0.001)),
            "mia_tpr_at_1pct_fpr": float(auditor.tpr_at_given_fpr(0.01)), "mia_examples": int(n),
            "mia_attack": "loss-threshold", "mia_s": time.perf_counter() - t0}


def mia_fields(bundle: Any, train_split: Any, held_out: Any, cfg: AuditConfig, *, device: Any,
               seed: int) -> dict[str, Any]:
    """The loss-threshold MIA of a trained model: its training examples against `held_out` (the test split)."""
    if not cfg.enabled or cfg.mia == "off" or len(held_out) == 0:
        return {}
    from workers.train import tensor_dataset

    return loss_threshold_mia(bundle.module, tensor_dataset(bundle, train_split), tensor_dataset(bundle, held_out),
                              device=device, examples=cfg.mia_examples, seed=seed)


def audit_cost(audits: dict[str, Any], train_s: float | None) -> dict[str, Any]:
    """What the run-level audits cost: seconds (planning, in-step canaries, bounds, MIA) and the run's
    time with them over its time without (`audit_time_ratio`; the one-step audit is not counted, it
    audits the mechanism, not the run)."""
    keys = ("audit_plan_s", "audit_one_run_s", "audit_estimate_s", "audit_family_s", "mia_s")
    spent = sum(float(audits[k]) for k in keys if audits.get(k) is not None)
    if not any(audits.get(k) is not None for k in keys):
        return {}
    ratio = (train_s + spent) / train_s if train_s else None
    return {"audit_s": spent, "audit_time_ratio": ratio}
