"""Privacy accountants: sound ones certify (`reference`), the papers' own ones claim (`gdp`,
`fenton_wilkinson`, `moments_accountant`, `composition`), and calibrators pick noise (`calibration`,
`analytic_gaussian`). Every function here is pure: mechanisms describe their noise as a DpEvent (or
plain parameters) and get numbers back; bad input raises ValueError."""

from mechanisms.accountants import composition, fenton_wilkinson, gdp, moments_accountant
from mechanisms.accountants.analytic_gaussian import (
    agm_delta,
    agm_epsilon,
    agm_sigma,
    amgm_epsilon,
    amgm_is_private,
    amgm_scale,
    amgm_sigma,
    analytic_bound,
)
from mechanisms.accountants.calibration import Calibration, calibrate, calibrate_sigma
from mechanisms.accountants.compare import DpsgdSetting, epsilon_of, epsilons, sigma_for
from mechanisms.accountants.events import SAMPLER_ADJACENCY, DpsgdEvents, dpsgd_event
from mechanisms.accountants.reference import EpsilonReport, epsilon, epsilon_report

__all__ = [
    "Calibration", "DpsgdEvents", "DpsgdSetting", "EpsilonReport", "SAMPLER_ADJACENCY", "agm_delta",
    "agm_epsilon", "agm_sigma", "amgm_epsilon", "amgm_is_private", "amgm_scale", "amgm_sigma",
    "analytic_bound", "calibrate", "calibrate_sigma", "composition", "dpsgd_event", "epsilon",
    "epsilon_of", "epsilon_report", "epsilons", "fenton_wilkinson", "gdp", "moments_accountant",
    "sigma_for",
]
