"""Accountants: reference (sound, for `epsilon_certified`), claimed (each paper's), calibrators."""

from mechanisms.accountants.calibration import Calibration, calibrate_sigma
from mechanisms.accountants.events import DpsgdEvents, dpsgd_event
from mechanisms.accountants.reference import epsilon

__all__ = ["Calibration", "DpsgdEvents", "calibrate_sigma", "dpsgd_event", "epsilon"]
