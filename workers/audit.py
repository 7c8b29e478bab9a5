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
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import dp_accounting
import numpy as np

from mechanisms.auditing.dirac_canaries import CanaryObservations, decode_array, encode_array
from mechanisms.framework.claims import REL_TOL
from mechanisms.framework.integrity import Finding
from mechanisms.parts.noise_addition import RunNoise
from workers.config import AuditConfig
from workers.datasets.contract import Split

if TYPE_CHECKING:
    from mechanisms.framework.mechanism import Mechanism

# The least time the curve search gets, however short the training: about five of its profiles at the
# quickstart's geometry, enough to bracket the noise multiplier when the guesses reject it.
FAMILY_MIN_S = 1.0


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


def step_audit(mechanism: Mechanism, plan: Any, clip: float, cfg: AuditConfig, options: dict[str, Any],
               seed: int, workers: int, tensor_sizes: Sequence[int] | None = None) -> dict[str, Any]:
    """Fields for the record; empty when the mechanism has no noise to audit.

    A mechanism whose release transforms each parameter tensor on its own (gredp's per-tensor FFT) is
    audited on the model's tensor structure scaled to the audited dimension (`tensor_sizes`).
    """
    if plan.sigma is None or not mechanism.private:
        return {}
    from mechanisms.auditing import audit_step  # lazy: heavy (torch)
    from mechanisms.auditing.profile import step_spec  # lazy: heavy (torch)

    if tensor_sizes and mechanism.audit_per_tensor:
        options = options | {"tensor_sizes": scaled_sizes(tensor_sizes, cfg.dim)}
    parts = getattr(plan, "parts", None)
    if parts is not None:  # the step's batch: parts whose noise depends on it are audited as they trained
        options = options | {"batch_size": parts.sampler.batch_size}

    step = step_spec(plan.sigma, plan.delta, clip=clip, options=options)  # the plan's noise, on one step
    audit = audit_step(mechanism, step, samples=cfg.samples, dim=cfg.dim, seed=seed, workers=workers,
                       significance=cfg.step_significance)
    out = {"epsilon_audited_step": audit.epsilon_audited, "mu_audited": audit.mu_audited,
           "mu_claimed": audit.mu_claimed, "audit_step_violated": audit.violated,
           "audit_step_p_value": audit.p_value, "audit_step_significance": audit.significance,
           "audit_step_curve": audit.claimed_curve, "audit_step_s": audit.wall_s}
    probe = step_probe(mechanism, plan, seed)
    out |= probe
    if "audit_step_probe_p_value" in probe:  # two tests of the step now: Bonferroni over them
        p = min(1.0, 2.0 * min(audit.p_value, probe["audit_step_probe_p_value"]))
        out |= {"audit_step_p_value": p, "audit_step_violated": p <= audit.significance,
                "audit_step_s": audit.wall_s + probe["audit_step_probe_s"]}
    return out


PROBE_STEPS, PROBE_WIDTH = 32, 64  # the canary layer's steps and inputs (130 parameters, 4,160 observations)


def step_probe(mechanism: Mechanism, plan: Any, seed: int, *, steps: int = PROBE_STEPS,
               width: int = PROBE_WIDTH) -> dict[str, Any]:
    """The one-step audit's probe of the code that trains: the mechanism's own `make_private` (its engine, its
    hooks and post-processing, privbench's step guard) on a canary layer (a linear layer `width` -> 2 over
    random data of the plan's size), every coordinate a Dirac canary joining every step (sample rate 1), for
    `steps` steps. Its findings: the canaries' push (`noise_checks.push_check`: at most one plan unit) and, when
    the plan is DP-SGD-shaped, the noise checks at the plan's noise multiplier. The p-value is the smaller of
    the two families' (Bonferroni over them, `significance` 0.001). A mechanism whose step cannot run on such a
    layer (per-layer bounds for another model, a post-processing that needs the model's layers) is skipped with
    the reason (`audit_step_probe_skipped`): the probe never fails a trial."""
    t0 = time.perf_counter()
    parts = getattr(plan, "parts", None)
    if parts is None or not mechanism.private or plan.sigma is None:
        return {}
    try:
        import torch  # lazy: heavy (torch)
        from torch import nn  # lazy: heavy (torch)
        from torch.utils.data import TensorDataset  # lazy: heavy (torch)

        from mechanisms.auditing import DiracCanaries, noise_checks  # lazy: heavy (torch)

        n = parts.sampler.dataset_size
        gen = torch.Generator().manual_seed(seed)
        # the data only makes the batch's own gradients; a large training set gets one row repeated (a view)
        inputs = torch.randn(n, width, generator=gen) if n <= 65_536 else \
            torch.randn(1, width, generator=gen).expand(n, width)
        data = TensorDataset(inputs, torch.randint(0, 2, (n,), generator=gen))
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            layer = nn.Linear(width, 2)
        training = mechanism.make_private(layer, torch.optim.SGD(layer.parameters(), lr=0.0), data, plan,
                                          criterion=nn.CrossEntropyLoss(),
                                          generator=torch.Generator().manual_seed(seed),
                                          noise_generator=torch.Generator().manual_seed(seed + 1),
                                          grad_sample_mode="hooks")
        optimizer = training.optimizer
        if not hasattr(optimizer, "attach_probe"):
            return {"audit_step_probe_skipped": "the mechanism's step has no private optimizer to carry canaries"}
        unit, unit_range, correlation = plan_units(plan)
        n_params = sum(p.numel() for p in optimizer.params)
        canaries = DiracCanaries.attach_to(optimizer, n_params, sample_rate=1.0, seed=seed, unit=unit,
                                           unit_range=unit_range, planned_steps=steps, correlation=correlation)
        done = 0
        while done < steps:
            for x, y in training.loader:
                optimizer.zero_grad()
                training.criterion(training.module(x), y).backward()
                optimizer.step()
                done += 1
                if done == steps or optimizer.steps_taken >= plan.steps:
                    break
            if optimizer.steps_taken >= plan.steps:
                break
        obs = canaries.observations()
    except Exception as exc:  # noqa: BLE001 - the probe is an extra check, never a failed trial
        return {"audit_step_probe_skipped": f"the mechanism's step did not run on a canary layer: "
                                            f"{type(exc).__name__}: {exc}"}
    half = noise_checks.SIGNIFICANCE / 2
    push = noise_checks.push_check(obs.scores, obs.included, 1.0, obs.steps, significance=half)
    out: dict[str, Any] = {"audit_step_probe_steps": obs.steps}
    findings, p_values = [], []
    if push is not None:
        out["audit_step_probe_push"] = push.push
        p_values.append(push.p_value)
        if push.failed:
            findings.append(push.words)
    shape = declared_shape(plan)
    if isinstance(parts.noise, RunNoise):  # correlated noise: its event is the run's one Gaussian; each
        shape = (float(plan.sigma), 1.0, steps)  # step's whitened noise is N(0, sigma^2) in the plan's unit
    if shape is not None and obs.noise_summary is not None:
        report = noise_checks.check_noise(obs.noise_summary, shape[0], significance=half)
        if report.findings:
            p_values.append(report.p_value)  # Bonferroni-adjusted within the noise checks
            findings += report.reasons()
    if p_values:
        out["audit_step_probe_p_value"] = min(1.0, len(p_values) * min(p_values))
    if findings:
        out["audit_step_probe_findings"] = findings
    out["audit_step_probe_s"] = time.perf_counter() - t0
    return out


def dpsgd_shape(event: Any) -> tuple[float, float, int] | None:
    """(noise multiplier, sampling rate, steps) when `event` is T Poisson-subsampled Gaussian steps."""
    count = 1
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        event, count = event.event, event.count
    rate = 1.0
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        event, rate = event.event, event.sampling_probability
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return float(event.noise_multiplier), float(rate), int(count)
    return None


def declared_shape(plan: Any) -> tuple[float, float, int] | None:
    """`dpsgd_shape` of the plan's event, or, when the plan is uncertified (no sound analysis of what runs: a
    contract broken, a part that is not privbench's), of the event its parts declare: the audits then test what
    the mechanism declares against what ran, and a refutation makes it `violated` (above `uncertified`)."""
    event = plan.effective_event
    parts = getattr(plan, "parts", None)
    if isinstance(event, dp_accounting.UnsupportedDpEvent) and parts is not None and plan.sigma is not None:
        try:
            event = parts.dp_event(plan.sigma)
        except Exception:  # noqa: BLE001 - parts that cannot state an event have no shape to test
            return None
    return dpsgd_shape(event)


def plan_units(plan: Any) -> tuple[float | None, tuple[float, float] | None, Any]:
    """(unit, unit range, correlation) of the canaries, from the plan alone (never from the optimizer): the bound
    the plan's noise is declared for (`Parts.audit_bound`); when that noise follows a state-set bound, the
    clipper's declared range, which the bound in force is clamped to in every step; and the correlation across
    steps the noise part declares (`correlation`, None: independent). A plan without parts: (None, None, None)."""
    parts = getattr(plan, "parts", None)
    if parts is None:
        return None, None, None
    clipper, noise = parts.clipper, parts.noise
    unit_range = None
    if clipper.state_key is not None and getattr(noise, "follows_bound", False):
        unit_range = (float(getattr(clipper, "minimum", clipper.bound)), float(clipper.max_bound))
    return float(parts.audit_bound), unit_range, noise.correlation if isinstance(noise, RunNoise) else None


class OneRun:
    """Attach Dirac canaries to the private optimizer (if it is an Opacus one); the analysis phase estimates.

    The guess counts of the one-run bound and the ceiling are fixed on simulations of the certified mechanism
    (`white_box.plan_guesses`) from what is known before the run (the canary count, the certified shape, the
    parameter count, the seed), never from the run. Nothing in training needs them, so the analysis phase
    computes them (`planned_guesses`) and the accelerator phase does not wait on CPU simulations.
    """

    def __init__(self, cfg: AuditConfig, plan: Any, seed: int) -> None:
        self.cfg, self.plan, self.seed = cfg, plan, seed
        self.sample_rate = plan.sample_rate
        self.canaries: Any = None
        self.skipped: str | None = None
        self.plan_s = 0.0
        self.shape: tuple[float, float, int] | None = None
        self.n_params = 0

    def attach(self, optimizer: Any) -> Callable[[], float] | None:
        """Returns a clock of the seconds the canaries spent inside optimizer steps (kept out of the step time)."""
        if not hasattr(optimizer, "attach_probe"):
            self.skipped = "the mechanism has no private optimizer releasing noisy gradients to carry canaries"
            return None
        from mechanisms.auditing import DiracCanaries  # lazy: heavy (torch)

        t0 = time.perf_counter()
        self.n_params = sum(p.numel() for p in optimizer.params)
        # The canaries join each step with probability q, as an example of a Poisson-sampled run does: the run is
        # then read within the certified family (T Poisson-subsampled Gaussian steps). A shuffled or fixed-size
        # run is not that process, so no bound leans on its event's shape (it would not be a lower bound).
        self.shape = declared_shape(self.plan) if self.plan.sampler == "poisson" else None
        m = self.cfg.canaries_for(self.n_params, self.shape, self.plan.delta, self.seed)
        unit, unit_range, correlation = plan_units(self.plan)
        noise = getattr(getattr(self.plan, "parts", None), "noise", None)
        if isinstance(noise, RunNoise):  # correlated noise: canaries join as fixed-order examples do, and
            # lazy: heavy (torch)
            from mechanisms.auditing.correlated_canaries import CorrelatedCanaries  # are scored after whitening

            self.canaries = CorrelatedCanaries.attach_correlated(
                optimizer, m, noise=noise, steps_per_epoch=self.plan.batch_selection.steps_per_epoch, seed=self.seed,
                statistic=self.cfg.statistic, unit=unit, planned_steps=self.plan.steps)
        else:
            self.canaries = DiracCanaries.attach_to(optimizer, m, sample_rate=self.sample_rate, seed=self.seed,
                                                    statistic=self.cfg.statistic, unit=unit, unit_range=unit_range,
                                                    planned_steps=self.plan.steps, correlation=correlation)
        self.plan_s = time.perf_counter() - t0
        canaries = self.canaries
        return lambda: canaries.overhead_s

    def result(self) -> OneRunResult:
        """What the canaries saw and what the analysis needs to fix their guesses: all the analysis phase needs."""
        return OneRunResult(self.canaries.observations() if self.canaries is not None else None, self.shape,
                            self.plan_s, self.skipped, None, self.n_params, self.seed)


@dataclasses.dataclass(frozen=True)
class OneRunResult:
    """The one-run audit's part of a trained run (JSON-ready): the canaries' observations, the certified
    event's shape, the seconds spent planning, why it was skipped, the ceiling (epsilon, Steinke, f-DP) the
    same analysis reaches on the certified mechanism simulated (None until `planned_guesses`), and the
    parameter count and seed the simulations take."""

    observations: CanaryObservations | None
    shape: tuple[float, float, int] | None
    plan_s: float = 0.0
    skipped: str | None = None
    ceiling: tuple[float, ...] | None = None  # epsilon, Steinke, f-DP, and the noise of one run's bound
    n_params: int = 0
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"observations": self.observations.to_dict() if self.observations is not None else None,
                "shape": list(self.shape) if self.shape is not None else None, "plan_s": self.plan_s,
                "skipped": self.skipped, "ceiling": list(self.ceiling) if self.ceiling is not None else None,
                "n_params": self.n_params, "seed": self.seed}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OneRunResult:
        obs = data.get("observations")
        shape, ceiling = data.get("shape"), data.get("ceiling")
        return cls(CanaryObservations.from_dict(obs) if obs is not None else None,
                   (float(shape[0]), float(shape[1]), int(shape[2])) if shape is not None else None,
                   float(data.get("plan_s", 0.0)), data.get("skipped"), tuple(ceiling) if ceiling else None,
                   int(data.get("n_params", 0)), int(data.get("seed", 0)))


def planned_guesses(result: OneRunResult, cfg: AuditConfig, delta: float) -> OneRunResult:
    """`result` with its guess counts and ceiling fixed by `white_box.plan_guesses`: simulations of the
    certified mechanism at the run's canary count, shape, parameter count and seed. They read nothing the run
    produced, so fixing them after it is the same as before it. Their seconds join `plan_s`. A result that
    has them already (or has no DP-SGD shape, whose guesses stay the estimate's own) is returned as it is."""
    c = result.observations
    if c is None or result.shape is None or c.guess_counts is not None:
        return result
    from mechanisms.auditing import white_box  # lazy: heavy (torch)

    t0 = time.perf_counter()
    sigma, rate, steps = result.shape
    plan = white_box.plan_guesses(c.m, steps, rate, sigma, delta, score=cfg.statistic, seed=result.seed,
                                  layout_n=result.n_params or None)
    ceiling = (float(plan.ceiling.epsilon_audited), float(plan.ceiling.epsilon_steinke),
               float(plan.ceiling.epsilon_fdp), float(plan.ceiling_noise))
    return dataclasses.replace(result, observations=dataclasses.replace(c, guess_counts=plan.guess_counts),
                               ceiling=ceiling, plan_s=result.plan_s + time.perf_counter() - t0)


def legacy_epsilon(c: CanaryObservations, delta: float) -> float | None:
    """The estimate before issue 14 on the same canaries: Steinke at 0.05 over every threshold of the sum."""
    n_in = int(c.included.sum())
    if not 0 < n_in < c.m:
        return None
    from mechanisms.auditing import CanaryScoreAuditor  # lazy: heavy (torch)

    return CanaryScoreAuditor(c.scores[c.included], c.scores[~c.included]).epsilon_one_run(0.05, delta)


def one_run_fields(result: OneRunResult, cfg: AuditConfig, plan: Any, delta: float,
                   train_s: float | None = None) -> dict[str, Any]:
    """The one-run audit's record fields, computed from a run's stored observations (no model needed)."""
    result = planned_guesses(result, cfg, delta)
    c = result.observations
    if c is None:
        return {"audit_one_run_skipped": result.skipped} if result.skipped else {}
    e = c.estimate(delta)
    out: dict[str, Any] = {
        "epsilon_audited": e.epsilon, "epsilon_audited_steinke": e.epsilon_steinke,
        "epsilon_audited_fdp": e.epsilon_fdp, "epsilon_audited_fdp_gdp": e.epsilon_fdp_gdp,
        "audit_canaries": e.canaries, "audit_guesses": e.guesses, "audit_statistic": e.statistic,
        "audit_one_run_s": e.overhead_s, "audit_estimate_s": e.estimate_s, "audit_plan_s": result.plan_s,
        "audit_steps": e.steps, "epsilon_audited_legacy": legacy_epsilon(c, delta),
    }
    budget_s = None if train_s is None else max(FAMILY_MIN_S, cfg.family_budget * train_s)
    out |= family_fields(result, cfg, plan, delta, budget_s)
    certified = getattr(plan, "epsilon_certified", None)
    if certified:
        out["audit_tightness"] = e.epsilon / certified
    if result.ceiling is not None and cfg.ceiling:
        ceiling, steinke, fdp, *noise = result.ceiling
        if certified:
            out["audit_ceiling_tightness"] = ceiling / certified
        out |= {"audit_ceiling": ceiling, "audit_ceiling_steinke": steinke, "audit_ceiling_fdp": fdp,
                "audit_ceiling_guess_counts": list(c.guess_counts or ())}
        if noise:  # above the ceiling by more than its noise: the run leaks more than certified, or the audit is wrong
            out["audit_ceiling_noise"] = noise[0]
            out["audit_above_ceiling"] = above_ceiling(e.epsilon, ceiling, noise[0])
            if out["audit_above_ceiling"]:
                from mechanisms.auditing.white_box import CEILING_FLAG_NOISES  # lazy: heavy (torch)

                finding = (f"the audited epsilon {e.epsilon:.3g} lies above the ceiling {ceiling:.3g} (what this audit "
                           f"reaches on the certified mechanism) by more than {CEILING_FLAG_NOISES:g} times the "
                           f"ceiling's noise ({noise[0]:.2g}): the run leaks more than its certificate says")
                out["audit_findings"] = [*out.get("audit_findings", []), finding]
                out["audit_violations"] = [*out.get("audit_violations", []), "above ceiling"]
                out["audit_run_violated"] = True
    return out


class InputCanaryRun:
    """The input canaries of one run (`mechanisms.auditing.input_canaries`): drawn from the seed and the dataset's
    public description, encoded by the model's own encoder before training, joined to each step's batch as
    Poisson-sampled examples (`batches`), and scored on the final model (`result`). The plan is not touched: each
    included canary is one more example of the accounted process, which the certificate covers."""

    def __init__(self, m: int, plan: Any, splits: Any, bundle: Any, seed: int) -> None:
        t0 = time.perf_counter()
        self.skipped: str | None = None
        self.tensors: list[Any] = []
        self.rows = 0
        if plan.sampler != "poisson" or getattr(plan, "parts", None) is None:
            self.skipped = (f"the run's batches are not Poisson-sampled ({plan.sampler}): an input canary joins a run "
                            "as an added example, a neighbour its certificate covers under Poisson sampling only")
        else:
            import torch  # lazy: heavy (torch)

            from mechanisms.auditing import input_canaries  # lazy: heavy (torch)

            self.canaries = input_canaries.draw(splits.kind, splits.input_shape, splits.num_classes, m, seed)
            encoded = bundle.encode(Split(self.canaries.inputs, self.canaries.labels))
            self.tensors = [*encoded, torch.from_numpy(self.canaries.labels)]
            self.index, self.offsets = input_canaries.schedule(self.canaries.included, plan.sample_rate, plan.steps,
                                                               seed)
            self.initial = _log_probs(bundle.module, self.tensors, torch.device("cpu"))
        self.seconds = time.perf_counter() - t0

    def batches(self, loader: Any) -> Any:
        """`loader`'s batches, each with the canaries that join its step appended (drawn before the run and moved to
        the device once: no step copies from or waits on the host)."""
        return loader if self.skipped is not None else _CanaryBatches(self, loader)

    def result(self, module: Any, device: Any) -> InputCanaryResult:
        """Each canary's score on the final `module`: how much training raised the log-probability of its label
        (the final model's minus the initial model's, read before training)."""
        if self.skipped is not None:
            return InputCanaryResult(None, None, 0, self.seconds, self.skipped)
        t0 = time.perf_counter()
        scores = _log_probs(module, self.tensors, device) - self.initial
        return InputCanaryResult(scores, self.canaries.included, self.rows,
                                 self.seconds + time.perf_counter() - t0, None)


def _log_probs(module: Any, tensors: Sequence[Any], device: Any, chunk: int = 1024) -> np.ndarray:
    """The log-probability `module` (in eval mode) gives each row's label (the last tensor)."""
    import torch  # lazy: heavy (torch)

    was_training = module.training
    module.eval()
    with torch.no_grad():
        *xs, y = [t.to(device) for t in tensors]
        logits = torch.cat([module(*(x[i:i + chunk] for x in xs)) for i in range(0, len(y), chunk)])
        out = torch.log_softmax(logits.double(), dim=1).gather(1, y[:, None]).squeeze(1).cpu().numpy()
    module.train(was_training)
    return out


class _CanaryBatches:
    """A private loader whose batches carry the joining input canaries after the sampled rows (weight 1 each when
    the batch is padded)."""

    def __init__(self, run: InputCanaryRun, loader: Any) -> None:
        self.run, self.loader, self.on, self.step = run, loader, None, 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Any:
        import torch  # lazy: heavy (torch)

        from mechanisms.framework.private_training import Batch  # lazy: heavy (opacus, torch)

        run = self.run
        for batch in self.loader:
            if self.step + 1 >= run.offsets.size:
                raise RuntimeError(f"the loader gave more than the plan's {run.offsets.size - 1} steps")
            start, end = int(run.offsets[self.step]), int(run.offsets[self.step + 1])
            self.step += 1
            if start == end:
                yield batch
                continue
            device = batch[-1].device
            if self.on != device:  # the canaries and their schedule move to the training device once
                run.tensors = [t.to(device) for t in run.tensors]
                self.index, self.on = torch.from_numpy(run.index).to(device), device
            index = self.index[start:end]
            rows = [_fit(t.index_select(0, index), b) for t, b in zip(run.tensors, batch, strict=True)]
            weights = batch.weights
            if weights is not None:
                weights = torch.cat([weights, weights.new_ones(end - start)])
            run.rows += end - start
            yield Batch([torch.cat([b, r]) for b, r in zip(batch, rows, strict=True)], batch.size + end - start,
                        weights)


def _fit(rows: Any, like: Any) -> Any:
    """Canary rows cut or zero-padded along their second axis to a batch cut to its longest example (texts)."""
    if rows.dim() < 2 or rows.shape[1] == like.shape[1]:
        return rows
    if rows.shape[1] > like.shape[1]:
        return rows[:, :like.shape[1]]
    import torch  # lazy: heavy (torch)

    return torch.nn.functional.pad(rows, (0, 0) * (rows.dim() - 2) + (0, like.shape[1] - rows.shape[1]))


@dataclasses.dataclass(frozen=True)
class InputCanaryResult:
    """The input canaries' part of a trained run (JSON-ready): their scores on the final model, which were
    included, the canary rows trained on, the seconds spent on them outside the steps, and why they were skipped."""

    scores: np.ndarray | None
    included: np.ndarray | None
    rows: int = 0
    seconds: float = 0.0
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        arrays = {k: None if v is None else encode_array(v) for k, v in (("scores", self.scores),
                                                                          ("included", self.included))}
        return arrays | {"rows": self.rows, "seconds": self.seconds, "skipped": self.skipped}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InputCanaryResult:
        scores, included = (None if data.get(k) is None else decode_array(data[k]) for k in ("scores", "included"))
        return cls(scores, included, int(data.get("rows", 0)), float(data.get("seconds", 0.0)), data.get("skipped"))


def input_canary_fields(result: InputCanaryResult, plan: Any, delta: float) -> dict[str, Any]:
    """The input-canary audit's record fields; a bound above the claim is a finding that refutes it."""
    if result.scores is None or result.included is None:
        return {"audit_input_skipped": result.skipped} if result.skipped else {}
    from mechanisms.auditing import input_canaries  # lazy: heavy (torch)

    t0 = time.perf_counter()
    b = input_canaries.bound(result.scores, result.included, delta)
    out: dict[str, Any] = {"epsilon_audited_input": b.epsilon, "epsilon_audited_input_steinke": b.steinke,
                           "epsilon_audited_input_fdp": b.fdp, "audit_input_canaries": b.canaries,
                           "audit_input_included": b.included, "audit_input_guesses": b.guesses,
                           "audit_input_rows": result.rows}
    claimed = getattr(plan, "epsilon_claimed", None)
    if claimed is not None and b.epsilon > claimed * (1 + REL_TOL):
        out["audit_findings"] = [f"the input canaries (real examples through the data, the model and the loss, "
                                 f"scored on the final model) give an epsilon of at least {b.epsilon:.3g}, above the "
                                 f"claimed {claimed:.3g}: what the whole pipeline leaks exceeds the claim"]
        out["audit_violations"] = ["input canaries above claim"]
    return out | {"audit_input_s": result.seconds + time.perf_counter() - t0}


def with_input_canaries(audits: dict[str, Any], result: InputCanaryResult, plan: Any, delta: float) -> dict[str, Any]:
    """`audits` with the input-canary audit's fields, its findings after the others' and `audit_run_violated`
    set when it refutes the claim."""
    fields = input_canary_fields(result, plan, delta)
    out = audits | fields
    for key in ("audit_findings", "audit_violations"):
        if key in fields:
            out[key] = [*audits.get(key, []), *fields[key]]
    if "audit_violations" in fields:
        out["audit_run_violated"] = True
    return out


# each run audit's check name in the record's integrity fields, by the few words of its findings
AUDIT_CHECKS = {"above ceiling": "audit_ceiling", "canaries pushed beyond the bound": "audit_push",
                "noise below declared": "audit_noise", "noise repeats across steps": "audit_noise",
                "noise correlated across steps": "audit_noise", "family bound above claim": "audit_family",
                "input canaries above claim": "audit_input_canaries"}


def audit_integrity_findings(audits: dict[str, Any]) -> list[Any]:
    """The run audits' checks as `integrity.Finding`s (the one type every check of what ran reports through):
    each check that ran, passed or failed with its findings in words. A failed audit makes the trial
    `violated` (it refutes the claim), where a failed integrity check makes it `uncertified`."""
    ran = {"audit_ceiling": "audit_above_ceiling" in audits, "audit_push": "audit_canary_push" in audits,
           "audit_noise": bool(audits.get("audit_noise_checks")),
           "audit_family": any(audits.get(k) is not None for k in ("epsilon_audited_curve", "epsilon_audited_noise")),
           "audit_input_canaries": audits.get("epsilon_audited_input") is not None}
    failed: dict[str, list[str]] = {}
    for label, words in zip(audits.get("audit_violations") or (), audits.get("audit_findings") or (), strict=True):
        failed.setdefault(AUDIT_CHECKS.get(label, "audit_" + label.replace(" ", "_")), []).append(words)
    checks = [c for c, yes in ran.items() if yes or c in failed] + [c for c in failed if c not in ran]
    return [Finding(c, c not in failed, "; ".join(failed.get(c, ()))) for c in checks]


def above_ceiling(audited: float, ceiling: float, noise: float) -> bool:
    """Whether an audited epsilon lies above what the same analysis reaches on the certified mechanism by more
    than the ceiling's noise allows (`white_box.CEILING_FLAG_NOISES` of it, and the claims' tolerance): then
    either the run leaks more than its certificate says or the audit is not a valid one (a canary larger than
    any example), and the record says so."""
    from mechanisms.auditing.white_box import CEILING_FLAG_NOISES  # lazy: heavy (torch)

    return audited > ceiling * (1 + REL_TOL) + CEILING_FLAG_NOISES * noise


def family_fields(result: OneRunResult, cfg: AuditConfig, plan: Any, delta: float,
                  budget_s: float | None = None) -> dict[str, Any]:
    """The two run-level bounds that lean on the certified event's shape (T Poisson-subsampled Gaussian
    steps at rate q, noise multiplier unknown): the one-run f-DP test against that family's curves
    (`epsilon_audited_curve`) and the white-box noise measurement (`epsilon_audited_noise`), and the noise checks
    (`noise_checks`: the excluded canaries' noise against the declared scale and independence across steps).
    Either bound above the claim, or a failed noise check, refutes it (`audit_run_violated`, with each finding in
    words in `audit_findings` and in a few words in `audit_violations`); `epsilon_audited` stays the
    assumption-free bound. A reading the Gaussian-model guard sets aside is recorded (`audit_noise_discarded`)."""
    from mechanisms.auditing import white_box  # lazy: heavy (torch)

    c = result.observations
    if c is None:
        return {}
    if result.shape is None:
        return {"audit_noise_skipped": "the run is not T Poisson-subsampled Gaussian steps (its certified event "
                                       "or its sampler), the family the curve and noise bounds read it against"}
    t0 = time.perf_counter()
    sigma, rate, steps = result.shape
    out: dict[str, Any] = {}
    if c.guess_counts and cfg.family_bounds:
        b = white_box.curve_bound(c.statistic_scores(), c.included, delta, rate, steps, sigma,
                                  guess_counts=c.guess_counts, budget_s=budget_s)
        out |= {"epsilon_audited_curve": b.epsilon, "audit_sigma_curve": b.sigma}
    certified = getattr(plan, "epsilon_certified", None)  # the measured noise is near the certified one
    n = white_box.noise_bound(c.noise_moments, rate, steps, delta, near=certified) if cfg.family_bounds else None
    if n is not None:
        out |= {"audit_sigma_measured": n.sigma, "audit_sigma_measured_upper": n.sigma_upper,
                "audit_noise_kurtosis": n.kurtosis, "epsilon_audited_noise": n.epsilon}
    why = "audit.family_bounds is off" if not cfg.family_bounds else white_box.noise_check_gap(c.noise_moments)
    if why is not None:
        out["audit_noise_skipped"] = why
    findings: list[str] = []
    labels: list[str] = []
    if n is not None and not n.gaussian:  # the guard sets the reading aside; the record says what it set aside
        low = n.sigma_upper < sigma * (1 - REL_TOL)
        out["audit_noise_discarded"] = (
            f"the measured noise {n.sigma:.3g} (upper bound {n.sigma_upper:.3g}, declared {sigma:.3g}) gave no "
            f"epsilon: its kurtosis {n.kurtosis:.3g} is not a Gaussian's 3" +
            ("; it is significantly below the declared noise" if low else ""))
        if low and c.noise_summary is None:  # no noise checks to judge it: the reading itself is the finding
            findings.append(f"the measured noise {n.sigma_upper:.3g} (upper bound) is below the {sigma:.3g} "
                            "the plan declares")
            labels.append("noise below declared")
    from mechanisms.auditing import noise_checks  # lazy: heavy (torch)

    # the run's checks share privbench's audit significance: half to the noise checks, half to the push (Bonferroni)
    push = noise_checks.push_check(c.scores, c.included, rate, c.steps, significance=noise_checks.SIGNIFICANCE / 2)
    if push is not None:
        out |= {"audit_canary_push": push.push, "audit_canary_push_se": push.std_error}
        if push.failed:
            findings.append(push.words)
            labels.append(push.label)
    if c.noise_summary is not None and cfg.family_bounds:
        report = noise_checks.check_noise(c.noise_summary, sigma, significance=noise_checks.SIGNIFICANCE / 2)
        out["audit_noise_checks"] = [f.check for f in report.findings]
        if report.skipped:
            out["audit_noise_checks_skipped"] = report.skipped
        findings += report.reasons()
        labels += [f.label for f in report.failed]  # one label per finding (`audit_integrity_findings` pairs them)
    claimed = getattr(plan, "epsilon_claimed", None)
    if claimed is not None:
        for key, what in (("epsilon_audited_curve", "the bound within the certified family"),
                          ("epsilon_audited_noise", "the epsilon read off the measured noise")):
            value = out.get(key)
            if value is not None and value > claimed * (1 + REL_TOL):
                findings.append(f"{what} ({value:.3g}) exceeds the claimed epsilon {claimed:.3g}")
                labels.append("family bound above claim")
    if out and claimed is not None or findings:
        out["audit_run_violated"] = bool(findings)
    if findings:
        out["audit_findings"], out["audit_violations"] = findings, labels  # parallel: one label per finding
    if out:
        out["audit_family_s"] = time.perf_counter() - t0
    return out


@dataclasses.dataclass(frozen=True)
class MiaLosses:
    """The per-example losses a loss-threshold attack scores: the accelerator phase's forward passes over
    training examples (members) and held-out ones, JSON-ready through `to_dict`."""

    members: np.ndarray
    non_members: np.ndarray
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"members": encode_array(self.members), "non_members": encode_array(self.non_members),
                "seconds": self.seconds}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MiaLosses:
        return cls(decode_array(data["members"]), decode_array(data["non_members"]), float(data["seconds"]))


def example_losses(module: Any, members: Any, non_members: Any, *, device: Any, examples: int,
                   seed: int, batch_size: int = 1024) -> MiaLosses:
    """The final model's losses on equal numbers of members and non-members (at most `examples` each),
    drawn with `seed`: the model's part of the membership-inference attack."""
    import torch  # lazy: heavy (torch)
    from torch.utils.data import DataLoader, Subset  # lazy: heavy (torch)

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
    return MiaLosses(member_loss, other_loss, time.perf_counter() - t0)


def loss_threshold_mia(losses: MiaLosses) -> dict[str, Any]:
    """Black-box membership inference: score = -loss, training examples vs held-out ones (Yeom et al. 2018).

    No canaries and no access beyond the final model's losses: what DPMLBench and ML Privacy Meter
    report. `mia_s` counts the forward passes and the scoring.
    """
    from mechanisms.auditing import CanaryScoreAuditor  # lazy: heavy (torch)

    t0 = time.perf_counter()
    auditor = CanaryScoreAuditor(-losses.members, -losses.non_members)
    out = {"mia_auc": auditor.attack_auroc(), "mia_tpr_at_0_1pct_fpr": float(auditor.tpr_at_given_fpr(0.001)),
           "mia_tpr_at_1pct_fpr": float(auditor.tpr_at_given_fpr(0.01)), "mia_examples": int(losses.members.size),
           "mia_attack": "loss-threshold"}
    return out | {"mia_s": losses.seconds + time.perf_counter() - t0}


def mia_losses(bundle: Any, train_split: Any, held_out: Any, cfg: AuditConfig, *, device: Any,
               seed: int) -> MiaLosses | None:
    """The losses the loss-threshold MIA scores: a trained model's training examples against `held_out`
    (the test split); None when the attack is off."""
    if not cfg.enabled or cfg.mia == "off" or len(held_out) == 0:
        return None
    from workers.train import tensor_dataset  # lazy: heavy (torch)

    return example_losses(bundle.module, tensor_dataset(bundle, train_split), tensor_dataset(bundle, held_out),
                          device=device, examples=cfg.mia_examples, seed=seed)


def audit_cost(audits: dict[str, Any], train_s: float | None) -> dict[str, Any]:
    """What the run-level audits cost: seconds (planning, in-step canaries, bounds, MIA) and the run's
    time with them over its time without (`audit_time_ratio`; the one-step audit is not counted, it
    audits the mechanism, not the run)."""
    keys = ("audit_plan_s", "audit_one_run_s", "audit_estimate_s", "audit_family_s", "audit_input_s", "mia_s")
    spent = sum(float(audits[k]) for k in keys if audits.get(k) is not None)
    if not any(audits.get(k) is not None for k in keys):
        return {}
    ratio = (train_s + spent) / train_s if train_s else None
    return {"audit_s": spent, "audit_time_ratio": ratio}
