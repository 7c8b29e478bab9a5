"""DP-Forward (Du et al., CCS 2023; arXiv 2309.06746): noise in the forward pass, not in gradients.

Each training example's hidden state at one position is normalised to Frobenius norm C and released with
i.i.d. Gaussian noise of std sigma C (the paper's analytic matrix Gaussian mechanism with scaled-identity
covariances, which *is* the analytic Gaussian mechanism); its label goes through randomized response once.
The same noise is added at inference. The optimizer and loader stay ordinary (no per-example gradients).

`sigma` is the noise std over C everywhere (plan, hooks, `privatize_step`), as for DP-SGD.

Options (`mechanism_options: {dp-forward: {...}}`, also keyword arguments of `make_private`):
  position          pooled (default) | embedding | encoder-<k>[-mha|-add-norm-1|-ffn|-add-norm-2] |
                    last-encoder[-<sub>]  (forward_noise.py)
  sensitivity       2C (paper, default) | C (the released code): the S in the claimed accounting
  accounting        central (default: Table 5, LDP "translated" by shuffling into q = 1/N, T = kN) |
                    local (Tables 3/4: SeqLDP per sequence)
  local_composition epochs (default: k releases compose exactly, sigma grows by sqrt(k)) | per-release (the code)
  calibrator        amgm (default) | gm (classical sigma = S sqrt(2 ln(1.25/delta)) / eps; local accounting only)
  epsilon_labels    RR epsilon of the labels (default ln 9: keep probability 0.9 on binary tasks); null = clean
  num_classes       label classes for RR (default 2; make_private checks it against the model's head)
  normalization     normalize (paper, default) | clip (the code's max-norm clipping)
  freeze_pre_noise  false (paper's experiments: f is trained) | true (strict local DP: f is fixed)
  inference_noise   true (default, the paper's) | false
  seed              noise and RR seed (default: drawn from torch's seeded global generator)

Claimed vs certified (docs/mechanisms.md, DP-Forward): the claim is the paper's accounting at sensitivity S.
The certified bound is the PLD composition of what is released per example: k Gaussian releases at ratio
2C / (sigma C) (any two normalised states differ by up to 2C, whatever the paper's convention) and one RR
label, under replace-one adjacency; being a local bound it is also a central one. No shuffling amplification
is certified (no sound result covers it here). It exists only when f is frozen, labels are randomized and
the release is the pooled vector; otherwise there is no sound bound and the plan is `uncertified`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from mechanisms.framework.mechanism import Claim, ForwardNoiseMechanism
from mechanisms.parts.clipping import FlatClipping

if TYPE_CHECKING:
    import dp_accounting

    from mechanisms.parts.plan import Parts, PrivacyPlan, PrivacySpec

ID = "dp-forward"
SENSITIVITIES = {"2C": 2.0, "C": 1.0}
ACCOUNTINGS = ("central", "local")
LOCAL_COMPOSITIONS = ("epochs", "per-release")
CALIBRATORS = ("amgm", "gm")
NORMALIZATIONS = ("normalize", "clip")
TRUE_SENSITIVITY = 2.0  # in units of C: ||f(X)|| <= C and ||f(X')|| <= C, so they differ by up to 2C


@dataclasses.dataclass(frozen=True)
class Options:
    """DP-Forward's switches (see the module docstring); validated on construction."""

    position: str = "pooled"
    sensitivity: str = "2C"
    accounting: str = "central"
    local_composition: str = "epochs"
    calibrator: str = "amgm"
    epsilon_labels: float | None = math.log(9)
    num_classes: int | None = None
    normalization: str = "normalize"
    freeze_pre_noise: bool = False
    inference_noise: bool = True
    seed: int | None = None

    def __post_init__(self) -> None:
        from mechanisms.catalog.dp_forward.forward_noise import parse_position  # lazy: keeps the registries light

        parse_position(self.position)
        for name, allowed in (("sensitivity", tuple(SENSITIVITIES)), ("accounting", ACCOUNTINGS),
                              ("local_composition", LOCAL_COMPOSITIONS), ("calibrator", CALIBRATORS),
                              ("normalization", NORMALIZATIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"dp-forward {name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.epsilon_labels is not None and not (self.epsilon_labels > 0 and math.isfinite(self.epsilon_labels)):
            raise ValueError(f"dp-forward epsilon_labels must be a positive number or null, got {self.epsilon_labels}")
        if self.num_classes is not None and int(self.num_classes) < 2:
            raise ValueError(f"dp-forward num_classes must be >= 2, got {self.num_classes}")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def s(self) -> float:
        """The claimed sensitivity in units of C."""
        return SENSITIVITIES[self.sensitivity]

    @property
    def classes(self) -> int:
        return int(self.num_classes or 2)


# ---- the paper's accounting (claimed) ----------------------------------------------------------------

def central_events(dataset_size: int, epochs: int, options: Options) -> Parts:
    """Table 5's translation, as parts: each of kN steps releases one example's noisy state at Poisson
    rate q = 1/N (batches of 1 over N examples, k epochs) with noise sigma C at sensitivity S = s C.
    An event family sigma -> DpEvent built like a trial's, so one setting has one event."""
    from mechanisms.parts.batch_selection import PoissonSampling  # lazy: keeps the registries light
    from mechanisms.parts.noise_addition import GaussianNoise  # lazy: keeps the registries light
    from mechanisms.parts.plan import Parts  # lazy: keeps the registries light

    return Parts(PoissonSampling(dataset_size, 1, epochs), FlatClipping(options.s), GaussianNoise(1.0))


def _gm_factor(delta: float) -> float:
    return math.sqrt(2 * math.log(1.25 / delta))


def local_epsilon(sigma: float, delta: float, options: Options, releases: int) -> float:
    """SeqLDP epsilon of `releases` Gaussian releases at sensitivity S (k releases = ratio sqrt(k) S / sigma)."""
    from mechanisms.accounting.analytic_gaussian import agm_epsilon  # lazy: keeps the registries light

    ratio = math.sqrt(releases) * options.s / sigma
    if options.calibrator == "gm":
        return ratio * _gm_factor(delta)
    return agm_epsilon(1.0, delta, sensitivity=ratio)


def local_sigma(epsilon_seq: float, delta: float, options: Options, releases: int) -> float:
    """The noise the paper's local analysis picks for a SeqLDP budget over `releases` releases."""
    from mechanisms.accounting.analytic_gaussian import amgm_sigma  # lazy: keeps the registries light

    if options.calibrator == "gm":
        return math.sqrt(releases) * options.s * _gm_factor(delta) / epsilon_seq
    return amgm_sigma(epsilon_seq, delta, sensitivity=options.s, releases=releases)


def label_epsilon_central(options: Options, dataset_size: int, delta: float) -> float:
    from mechanisms.catalog.dp_forward import label_rr  # lazy: keeps the registries light

    if options.epsilon_labels is None:
        return 0.0
    return label_rr.shuffled_rr_epsilon(options.epsilon_labels, options.classes, dataset_size, delta)


def claimed_epsilons(sigma: float, spec: PrivacySpec, options: Options) -> dict[str, float]:
    """Every number the paper's analysis gives for this sigma; `epsilon_claimed` picks one by `accounting`."""
    from mechanisms.accounting import epsilon  # lazy: heavy (dp_accounting, numpy, scipy)

    k, delta = spec.epochs, spec.delta
    labels = options.epsilon_labels or 0.0
    per_release = local_epsilon(sigma, delta, options, 1)
    over_epochs = local_epsilon(sigma, delta, options, k)
    gaussian_central = epsilon(central_events(spec.dataset_size, k, options)(sigma), delta, spec.accountant)
    labels_central = label_epsilon_central(options, spec.dataset_size, delta)
    return {
        "epsilon_local_per_release": per_release,
        "epsilon_local_epochs": over_epochs,
        "epsilon_local": (over_epochs if options.local_composition == "epochs" else per_release) + labels,
        "epsilon_central_gaussian": gaussian_central,
        "epsilon_central_labels": labels_central,
        "epsilon_central": gaussian_central + labels_central,  # basic composition (Theorem 4), as the paper
    }


def claimed_sigma(spec: PrivacySpec, options: Options) -> float:
    """Sigma whose claimed epsilon (the selected accounting) equals the target."""
    target, delta, k = float(spec.epsilon), spec.delta, spec.epochs  # type: ignore[arg-type]
    if options.accounting == "local":
        budget = target - (options.epsilon_labels or 0.0)
        releases = k if options.local_composition == "epochs" else 1
    else:
        budget = target - label_epsilon_central(options, spec.dataset_size, delta)
    if not budget > 0:
        raise ValueError(f"dp-forward: the label RR already costs the whole target epsilon {target}; "
                         "lower epsilon_labels or raise epsilon")
    if options.accounting == "local":
        return local_sigma(budget, delta, options, releases)
    from mechanisms.accounting import calibrate_sigma  # lazy: heavy (dp_accounting, numpy, scipy)

    return calibrate_sigma(central_events(spec.dataset_size, k, options), budget, delta, spec.accountant).sigma


# ---- what is really released (certified) --------------------------------------------------------------

def certification_gap(options: Options) -> str | None:
    """Why no sound epsilon exists for these options (None when one does). See docs/mechanisms.md (DP-Forward)."""
    if not options.freeze_pre_noise:
        return ("pre-noise layers are trained with clean per-example gradients, so the released weights of f "
                "are a non-private function of the training data (at `embedding`, exactly the rows of the "
                "tokens seen move); no finite epsilon holds. Set freeze_pre_noise: true")
    if options.epsilon_labels is None:
        return "labels are used in the clear (SeqDP only): example-level DP does not hold. Set epsilon_labels"
    from mechanisms.catalog.dp_forward.forward_noise import parse_position  # lazy: keeps the registries light

    if parse_position(options.position).sequence_level:
        return ("a sequence-level release is not private in its shape and mask: batches are trimmed to their "
                "longest example (the n x d shape depends on other examples) and post-noise layers read each "
                "example's attention mask (its length); only the pooled 1 x d release is certified")
    return None


def release_parts(spec: PrivacySpec, options: Options) -> Parts:
    """What is released per example: its normalised state (norm <= C, so neighbours differ by up to 2C under
    replace-one) with N(0, (sigma C)^2) noise, once per epoch (one shuffled pass), plus its label through RR
    once. Replace-one is the only relation that fits a local release of every example."""
    from mechanisms.catalog.dp_forward import label_rr  # lazy: keeps the registries light
    from mechanisms.parts.noise_addition import GaussianNoise  # lazy: keeps the registries light
    from mechanisms.parts.plan import Parts  # lazy: keeps the registries light

    selection = dataclasses.replace(spec, sampler="shuffle").batch_selection
    labels = () if options.epsilon_labels is None else (label_rr.rr_event(options.epsilon_labels, options.classes),)
    return Parts(selection, FlatClipping(spec.clip), GaussianNoise(spec.clip), extra_events=labels)


def certified_event(sigma: float, epochs: int, options: Options) -> dp_accounting.DpEvent:
    """k Gaussian releases of states bounded by C with noise sigma C + one RR label: the event of
    `release_parts`, accounted under replace-one (dp-accounting's PLD then compares states 2C apart)."""
    from mechanisms.parts.plan import PrivacySpec  # lazy: keeps the registries light

    spec = PrivacySpec(epsilon=None, delta=0.5, dataset_size=1, batch_size=1, epochs=epochs, sigma=sigma,
                       options=options.as_dict())
    return release_parts(spec, options).dp_event(sigma)


def certified_epsilon(sigma: float, epochs: int, delta: float, options: Options) -> float:
    """PLD under replace-one of `certified_event` (any dp-accounting accountant recomputes it)."""
    from mechanisms.accounting import epsilon  # lazy: heavy (dp_accounting, numpy, scipy)
    from mechanisms.parts.plan import PrivacySpec  # lazy: keeps the registries light

    spec = PrivacySpec(epsilon=None, delta=delta, dataset_size=1, batch_size=1, epochs=epochs, sigma=sigma,
                       options=options.as_dict())
    relation = release_parts(spec, options).accounting_relation
    value = epsilon(certified_event(sigma, epochs, options), delta, "pld", relation)
    assert value is not None  # Gaussian and RR events are supported by PLD under replace-one
    return value


class DpForward(ForwardNoiseMechanism):
    ID = ID
    references = ("arXiv:2309.06746",)
    Options = Options
    audit_coordinatewise = False  # normalisation couples the coordinates of a state

    def parts(self, spec: PrivacySpec, options: Options) -> Parts:
        return release_parts(spec, options)

    def claimed_sigma(self, spec: PrivacySpec, options: Options, parts: Parts) -> float:
        return claimed_sigma(spec, options)

    def certification_gap(self, spec: PrivacySpec, options: Options) -> str | None:
        return certification_gap(options)

    def claim(self, sigma: float, spec: PrivacySpec, options: Options, parts: Parts, certified: float | None) -> Claim:
        """The paper's accounting at sensitivity S (central: Table 5's translation; local: SeqLDP), with every
        number it gives, and the true per-release epsilons beside them."""
        from mechanisms.accounting.analytic_gaussian import agm_epsilon  # lazy: keeps the registries light
        from mechanisms.catalog.dp_forward.forward_noise import parse_position  # lazy: keeps the registries light

        claims = claimed_epsilons(sigma, spec, options)
        gap = certification_gap(options)
        claim = (f"Poisson q = 1/{spec.dataset_size}, T = {spec.epochs * spec.dataset_size} at sensitivity "
                 f"{options.sensitivity} ({spec.accountant}) + shuffled RR labels"
                 if options.accounting == "central" else f"SeqLDP at sensitivity {options.sensitivity}")
        verdict = (f"uncertified: {gap}" if gap else "certified = local PLD of k Gaussian releases at sensitivity "
                   "2C + RR labels (replace-one); no shuffling amplification is certified")
        extra = {
            "clip": spec.clip, "num_classes": options.classes, "position": parse_position(options.position).name,
            "noise_std_over_clip": float(sigma), **claims,
            "epsilon_local_true_per_release": agm_epsilon(sigma, spec.delta, TRUE_SENSITIVITY),
            "epsilon_inference_per_query": agm_epsilon(sigma, spec.delta, TRUE_SENSITIVITY),
            "epsilon_inference_per_query_claimed": local_epsilon(sigma, spec.delta, options, 1),
            "label_keep_probability": (None if options.epsilon_labels is None else
                                       1 / (1 + (options.classes - 1) * math.exp(-options.epsilon_labels))),
        }
        return Claim(claims[f"epsilon_{options.accounting}"],
                     f"dp-forward paper, {options.accounting} ({options.calibrator}, S={options.sensitivity})",
                     extra, f"claimed = paper's {options.accounting} accounting ({claim}); {verdict}")

    def install_forward_noise(self, module: Any, data: Any, plan: PrivacyPlan, options: Options,
                              generator: Any) -> Any:
        """Install the noise hooks (training and inference) and randomize the labels once.

        The hooks object is kept as `module.dp_forward` (`.remove()` undoes them; `.releases` counts
        released examples). Noise and RR seeds derive from option `seed`, else from `generator` (the trial's).
        """
        import torch  # lazy: heavy (torch)

        from mechanisms.catalog.dp_forward import label_rr  # lazy: keeps the registries light
        from mechanisms.catalog.dp_forward.forward_noise import install  # lazy: keeps the registries light

        clip = float(plan.extra.get("clip", 1.0))
        seed = options.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
        noise_seed, rr_seed = np.random.SeedSequence(seed).generate_state(2, dtype=np.uint64)
        noise = install(module, options.position, sigma=plan.sigma, clip=clip, normalization=options.normalization,
                        inference_noise=options.inference_noise, seed=int(noise_seed) >> 1)
        if options.freeze_pre_noise:
            noise.freeze_pre_noise()
        if options.epsilon_labels is not None:  # the labels are randomized once, before any batch is drawn
            classes = options.num_classes or _head_classes(module) or 2
            if classes != plan.extra.get("num_classes"):
                raise ValueError(f"the model predicts {classes} classes but the plan accounted RR over "
                                 f"{plan.extra.get('num_classes')}: set mechanism_options num_classes: {classes}")
            labels = label_rr.dataset_labels(data)
            noisy = label_rr.randomized_response(labels, options.epsilon_labels, classes,
                                                 np.random.default_rng(rr_seed))
            data = label_rr.relabeled(data, noisy)
        module.dp_forward = noise
        return data

    def bound_release(self, rows: Any, clip: float, options: Options) -> Any:
        """A release's normalisation: `forward_noise`'s (the training hook's), to norm C."""
        from mechanisms.catalog.dp_forward.forward_noise import bound_norm  # lazy: keeps the registries light

        return bound_norm(rows, clip, options.normalization)

    def claimed_step_tradeoff(self, sigma: float, options: Mapping[str, Any]) -> Any:
        """The paper's claim for one release: the Gaussian mechanism at ratio S / sigma, i.e. G_{S/sigma}."""
        from mechanisms.auditing import tradeoff  # lazy: keeps the registries light

        sensitivity = options.get("sensitivity", "2C")
        if sensitivity not in SENSITIVITIES:
            raise ValueError(f"dp-forward sensitivity must be one of {', '.join(SENSITIVITIES)}, got {sensitivity!r}")
        return tradeoff.Gaussian(mu=SENSITIVITIES[sensitivity] / sigma)

    def audit_cases(self, dim: int, clip: float, rng: np.random.Generator, options: Mapping[str, Any]) -> list[Any]:
        """The replace-one worst case: two hidden states that normalise to +C u and -C u (distance 2C).

        Side A holds -C u / 2 and side B -C u / 2 + C u = +C u / 2; normalisation maps them to -C u and +C u.
        A claim at sensitivity C (the released code) is violated by exactly this pair.
        """
        from mechanisms.auditing.cases import AuditCase  # lazy: keeps the registries light

        u = rng.standard_normal(dim)
        u /= np.linalg.norm(u)
        return [AuditCase("antipodal", clip * u, -0.5 * clip * u,
                          note="states normalising to -Cu and +Cu: the 2C replace-one sensitivity")]


def _head_classes(model: Any) -> int | None:
    """Output width of the model's last Linear layer (classification heads are registered last)."""
    from torch import nn  # lazy: heavy (torch)

    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return linears[-1].out_features if linears else None


mechanism = DpForward()
