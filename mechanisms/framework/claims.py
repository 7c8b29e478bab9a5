"""`claim_status`: one pure function from the three epsilons (and an audit verdict) to a verdict."""

from __future__ import annotations

import math

STATUSES = ("ok", "overclaimed", "uncertified", "violated")
# What the target epsilon is met by: the mechanism's own (claimed) analysis, or the certified one.
CALIBRATIONS = ("claimed", "certified")
REL_TOL = 1e-3
# The one significance policy of privbench's step audits (`privbench audit`, a trial's step audit, and the
# family-wise rate of a sweep's audits under Holm, storage/verdicts.py). At 5% a correct mechanism would be
# called `violated` in 1 audit of 20 (its claim is exactly the Gaussian curve the audit tests): the textbook
# DP-SGD step at sigma 1 was, at its default seed. At 0.1% it is 1 in 1,000, while a broken noise step
# (GReDP's sigma / sqrt 2, half the noise) is still refuted with p-values below 1e-10.
AUDIT_SIGNIFICANCE = 0.001


def _above(a: float | None, b: float | None) -> bool:
    """a > b beyond the relative tolerance (None never compares)."""
    if a is None or b is None:
        return False
    if math.isinf(a) or math.isinf(b):
        return a > b
    return a > b * (1 + REL_TOL) + 1e-12


def claim_status(
    epsilon_claimed: float | None, epsilon_certified: float | None, epsilon_audited: float | None = None,
    *, audit_violated: bool = False, private: bool = True, epsilon_audited_input: float | None = None,
) -> str | None:
    """Precedence violated > overclaimed > uncertified > ok. None for nonprivate trials.

    A NaN epsilon raises: it means an analysis broke, and no verdict may rest on it. An infinite certified
    epsilon (a direction without noise) is above any finite claim: `overclaimed`.
    `audit_violated` carries a curve-level verdict of the auditor (a measured error pair below the
    claimed trade-off curve), which can fire even when the scalar epsilon bound does not exceed the claim.
    `epsilon_audited_input` is the input canaries' lower bound (the whole pipeline's): above the claim, it
    refutes it as the white-box bound does.
    """
    if not private:
        return None
    for name, value in (("claimed", epsilon_claimed), ("certified", epsilon_certified), ("audited", epsilon_audited),
                        ("audited_input", epsilon_audited_input)):
        if value is not None and math.isnan(value):
            raise ValueError(f"epsilon_{name} is NaN: an undefined epsilon is an error, never a verdict")
    if audit_violated or _above(epsilon_audited, epsilon_claimed) or _above(epsilon_audited_input, epsilon_claimed):
        return "violated"
    if epsilon_claimed is None:
        return "uncertified"
    if _above(epsilon_certified, epsilon_claimed):
        return "overclaimed"
    if epsilon_certified is None:
        return "uncertified"
    return "ok"
