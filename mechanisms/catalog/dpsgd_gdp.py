"""DP-SGD whose noise multiplier is chosen with the mu-GDP central limit theorem (Bu, Dong, Long, Su,
arXiv 1911.11607).

Training is exactly `dpsgd` (same parts); only the claimed analysis differs. The CLT is an approximation:
with few steps or small q*T it under-reports epsilon, so the sigma it picks is certified by PLD at that
same sigma and the leaderboard shows both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mechanisms.catalog.dpsgd import DpSgd, Options
from mechanisms.framework.mechanism import Claim

if TYPE_CHECKING:
    from mechanisms.auditing.tradeoff import TradeOff
    from mechanisms.parts.plan import Parts, PrivacySpec

ID = "dpsgd-gdp"


def _gdp_sampler(sampler: str) -> str:
    return "poisson" if sampler == "poisson" else "uniform"


class DpSgdGdp(DpSgd):
    ID = ID
    references = ("arXiv:1911.11607",)
    Options = Options

    def claimed_sigma(self, spec: PrivacySpec, options: Any, parts: Parts) -> float:
        """The paper's choice: the CLT's sigma for the target."""
        from mechanisms.accounting import gdp  # lazy: keeps the registries light

        return gdp.sigma_for_epsilon(spec.epsilon, spec.delta, parts.sampler.sample_rate, parts.sampler.steps,
                                     _gdp_sampler(parts.sampler.name))

    def claim(self, sigma: float, spec: PrivacySpec, options: Any, parts: Parts, certified: float | None) -> Claim:
        from mechanisms.accounting import gdp  # lazy: keeps the registries light

        sampler = _gdp_sampler(parts.sampler.name)
        mu = gdp.mu_of(sigma, parts.sampler.sample_rate, parts.sampler.steps, sampler)
        claimed = gdp.epsilon_from_mu(mu, spec.delta)
        notes = "CLT under-reports epsilon here" if certified is not None and certified > claimed else ""
        return Claim(claimed, f"gdp-clt ({sampler})", {"mu_claimed": mu}, notes)

    def claimed_step_tradeoff(self, sigma: float, options: Mapping[str, Any]) -> TradeOff:
        """The CLT formula at q = 1, T = 1: mu = sqrt(e^{1/sigma^2} - 1) (> 1/sigma: conservative for one step)."""
        from mechanisms.accounting import gdp  # lazy: keeps the registries light
        from mechanisms.auditing import tradeoff  # lazy: keeps the registries light

        return tradeoff.Gaussian(mu=gdp.mu_poisson(sigma, 1.0, 1))


mechanism = DpSgdGdp()

__all__ = ["ID", "DpSgdGdp", "mechanism"]
