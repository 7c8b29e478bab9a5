"""Sound accountants as pure functions of a DpEvent: `(event, delta) -> epsilon | None`.

PLD (dp-accounting) is the reference used for `epsilon_certified`; RDP is a looser cross-check and PRV a
tight one (guarded, see `prv.py`). `None` means the accountant cannot analyse the event (never a guess);
`inf` means no privacy.

Fixed-size batches (`SampledWithoutReplacementDpEvent`, replace-one adjacency): RDP analyses them
directly (Wang, Balle, Kasiviswanathan 2019). dp-accounting's PLD cannot, so PLD and PRV use the
dominating pair of sampling without replacement under replace-one (Zhu, Dong, Wang 2022): the same as
Poisson sampling at rate b/n of the same (already replace-one-scaled) Gaussian. This is the reduction
jax_privacy uses for its fixed-batch accounting; the report's note says when it was applied.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable

import dp_accounting
from dp_accounting import dp_event, rdp

from mechanisms.accounting import adaptive_pld
from mechanisms.accounting.analytic_gaussian import gaussian_epsilon
from mechanisms.accounting.prv import PrvAccountant

# PLD discretisation: 1e-3 is within 0.13% of 1e-4 on sigma (measured on this project's 2-core CPU) and 3-10x faster;
# refined automatically where small epsilons would otherwise be over-reported (see adaptive_pld.py).
PLD_DISCRETIZATION = adaptive_pld.COARSE
NeighborRel = dp_accounting.NeighboringRelation


def pld_accountant() -> dp_accounting.PrivacyAccountant:
    return adaptive_pld.AdaptivePldAccountant()


def rdp_accountant(neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
                   ) -> dp_accounting.PrivacyAccountant:
    return rdp.RdpAccountant(neighboring_relation=neighboring_relation)


def _pld_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    return float(pld_accountant().compose(event).get_epsilon(delta))


def prv_accountant() -> PrvAccountant:
    return PrvAccountant(fallback=_pld_epsilon)


FRESH: dict[str, Callable[[], dp_accounting.PrivacyAccountant]] = {
    "pld": pld_accountant,
    "rdp": rdp_accountant,
    "prv": prv_accountant,
}


@contextlib.contextmanager
def _quiet_absl():
    """dp-accounting's RDP logs a warning per fractional order it drops (harmless: it is excluded)."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _contains_without_replacement(event: dp_accounting.DpEvent) -> bool:
    if isinstance(event, dp_event.SampledWithoutReplacementDpEvent):
        return True
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return _contains_without_replacement(event.event)
    if isinstance(event, dp_event.ComposedDpEvent):
        return any(_contains_without_replacement(e) for e in event.events)
    return False


def poisson_dominating(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
    """Replace each fixed-size sample (b of n, replace-one) by Poisson sampling at rate b/n (same event)."""
    if isinstance(event, dp_event.SampledWithoutReplacementDpEvent):
        return dp_event.PoissonSampledDpEvent(event.sample_size / event.source_dataset_size, event.event)
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return dp_event.SelfComposedDpEvent(poisson_dominating(event.event), event.count)
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([poisson_dominating(e) for e in event.events])
    return event


def gaussian_ratio(event: dp_accounting.DpEvent) -> float | None:
    """sqrt(sum 1/sigma_i^2) if `event` composes only Gaussians (no sampling), else None.

    Privacy-loss variables of Gaussians are N(eta, 2 eta) and add under composition, so such an event is
    *exactly* one Gaussian with this sensitivity-to-noise ratio: PLD/PRV would only approximate it (and
    PLD takes ~10 s for 1000 full-batch steps).
    """
    if isinstance(event, dp_event.GaussianDpEvent):
        return math.inf if event.noise_multiplier == 0 else 1.0 / event.noise_multiplier
    if isinstance(event, dp_event.SelfComposedDpEvent):
        inner = gaussian_ratio(event.event)
        return None if inner is None else math.sqrt(event.count) * inner
    if isinstance(event, dp_event.ComposedDpEvent):
        parts = [gaussian_ratio(e) for e in event.events]
        return None if any(p is None for p in parts) else math.sqrt(sum(p * p for p in parts))
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpsilonReport:
    """An epsilon with its provenance: which accountant produced the number, and any caveat."""

    epsilon: float | None
    accountant: str  # the accountant asked for
    computed_by: str  # the accountant whose number this is (differs after a PRV fallback)
    note: str = ""


def _replace_one_pld() -> dp_accounting.PrivacyAccountant:
    """A fresh PLD accountant under replace-one adjacency (dp-accounting doubles a Gaussian's unit sensitivity)."""
    return dp_accounting.pld.PLDAccountant(NeighborRel.REPLACE_ONE, value_discretization_interval=PLD_DISCRETIZATION)


def _pld_event(event: dp_accounting.DpEvent) -> tuple[dp_accounting.DpEvent, str]:
    """The event PLD (and PRV) analyse, and the note saying so: fixed-size batches become their Poisson
    dominating pair."""
    if _contains_without_replacement(event):
        return poisson_dominating(event), "fixed-size batches: Poisson dominating pair at rate b/n (replace-one)"
    return event, ""


def pld_supports(event: dp_accounting.DpEvent, relation: NeighborRel) -> bool:
    if relation == NeighborRel.REPLACE_ONE and not _contains_without_replacement(event):
        return _replace_one_pld().supports(event)
    if relation not in (NeighborRel.ADD_OR_REMOVE_ONE, NeighborRel.REPLACE_ONE):
        return False
    return dp_accounting.pld.PLDAccountant().supports(_pld_event(event)[0])


def pld_report(event: dp_accounting.DpEvent, delta: float, relation: NeighborRel, name: str = "pld") -> EpsilonReport:
    """PLD's epsilon: exact for a composition of unsubsampled Gaussians, replace-one events in dp-accounting's
    replace-one PLD, fixed-size batches by their dominating pair, the rest by the adaptive-grid PLD."""
    ratio = gaussian_ratio(event) if relation == NeighborRel.ADD_OR_REMOVE_ONE else None
    if ratio is not None:
        return EpsilonReport(epsilon=gaussian_epsilon(ratio, delta), accountant=name, computed_by="exact",
                             note="composition of Gaussians: exact analytic curve")
    if relation == NeighborRel.REPLACE_ONE and not _contains_without_replacement(event):
        value = float(_replace_one_pld().compose(event).get_epsilon(delta))
        return EpsilonReport(epsilon=value, accountant=name, computed_by="pld", note="replace-one")
    event, note = _pld_event(event)
    return EpsilonReport(epsilon=_pld_epsilon(event, delta), accountant=name, computed_by="pld", note=note)


def rdp_supports(event: dp_accounting.DpEvent, relation: NeighborRel) -> bool:
    """Add-or-remove events, and fixed-size batches (analysed under replace-one whatever the relation)."""
    if relation != NeighborRel.ADD_OR_REMOVE_ONE and not _contains_without_replacement(event):
        return False
    return _rdp_for(event).supports(event)


def _rdp_for(event: dp_accounting.DpEvent) -> dp_accounting.PrivacyAccountant:
    """RDP under replace-one for fixed-size batches (Wang, Balle, Kasiviswanathan 2019), add-or-remove otherwise."""
    if _contains_without_replacement(event):
        return rdp_accountant(NeighborRel.REPLACE_ONE)
    return rdp_accountant()


def rdp_report(event: dp_accounting.DpEvent, delta: float) -> EpsilonReport:
    note = "fixed-size batches: RDP of sampling without replacement (replace-one)" \
        if _contains_without_replacement(event) else ""
    with _quiet_absl():
        value = float(_rdp_for(event).compose(event).get_epsilon(delta))
    return EpsilonReport(epsilon=value, accountant="rdp", computed_by="rdp", note=note)


def prv_supports(event: dp_accounting.DpEvent, relation: NeighborRel) -> bool:
    """PRV's own support (Gaussians, Poisson-subsampled or not); replace-one events are PLD's to answer."""
    if relation == NeighborRel.REPLACE_ONE and not _contains_without_replacement(event):
        return _replace_one_pld().supports(event)
    return relation == NeighborRel.ADD_OR_REMOVE_ONE and prv_accountant().supports(_pld_event(event)[0])


def prv_report(event: dp_accounting.DpEvent, delta: float, relation: NeighborRel) -> EpsilonReport:
    """PRV's epsilon; PLD answers under replace-one (PRV has no such adjacency) and where PRV is known to fail."""
    if relation == NeighborRel.REPLACE_ONE and not _contains_without_replacement(event):
        return dataclasses.replace(pld_report(event, delta, relation, "prv"), computed_by="pld")
    ratio = gaussian_ratio(event) if relation == NeighborRel.ADD_OR_REMOVE_ONE else None
    if ratio is not None:
        return EpsilonReport(epsilon=gaussian_epsilon(ratio, delta), accountant="prv", computed_by="exact",
                             note="composition of Gaussians: exact analytic curve")
    event, note = _pld_event(event)
    acc = prv_accountant()
    value = float(acc.compose(event).get_epsilon(delta))
    notes = [n for n in (note, acc.note) if n]
    return EpsilonReport(epsilon=value, accountant="prv", computed_by="pld" if acc.note else "prv",
                         note="; ".join(notes))
