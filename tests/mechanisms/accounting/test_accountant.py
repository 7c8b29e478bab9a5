"""The accountant contract (`Accountant`): a plugin's accountant named by a factory answers as dp-accounting does,
`report` gives inf for a non-private event and None with a reason (never a guess) for one it cannot analyse, a
claimed accountant reads only DP-SGD runs, and an accountant that could not be sound cannot calibrate sigma."""

from __future__ import annotations

import dataclasses

import dp_accounting
import pytest

from mechanisms.accounting.accountant import GDP, PLD, Accountant, described

PLUGIN = Accountant("plugin-pld", "dp-accounting's PLD, as a plugin names it",
                    factory="dp_accounting.pld:PLDAccountant")
GAUSSIAN = dp_accounting.GaussianDpEvent(2.0)


def test_a_factory_accountant_answers_as_dp_accounting():
    report = PLUGIN.report(GAUSSIAN, 1e-5)
    exact = dp_accounting.gaussian_mechanism.get_epsilon_gaussian(2.0, 1e-5)  # closed form, no PLD
    assert report.epsilon == pytest.approx(exact, rel=1e-3) and report.epsilon >= exact
    assert report.computed_by == "plugin-pld" and PLUGIN.kind == "sound"


def test_non_private_and_unanalysable_events():
    assert PLUGIN.report(dp_accounting.NonPrivateDpEvent(), 1e-5).epsilon == float("inf")
    unknown = PLUGIN.report(dp_accounting.UnsupportedDpEvent(), 1e-5)
    assert unknown.epsilon is None and "no sound analysis" in unknown.note
    tree = dp_accounting.SingleEpochTreeAggregationDpEvent(2.0, 8)  # dp-accounting's PLD has no analysis of it
    assert not PLUGIN.supports(tree)
    assert PLUGIN.report(tree, 1e-5).epsilon is None
    replace = PLUGIN.report(GAUSSIAN, 1e-5, dp_accounting.NeighboringRelation.REPLACE_ONE)
    assert replace.epsilon is None and "add-or-remove-one only" in replace.note


def test_claimed_accountants_read_dpsgd_runs_only():
    report = GDP.report(GAUSSIAN, 1e-5)
    assert report.epsilon is None and "DP-SGD" in report.note
    assert described(GDP).startswith("claimed: ") and described(PLD).startswith("sound: ")


def test_bad_accountants_and_delta_are_refused():
    with pytest.raises(ValueError, match="needs a name"):
        Accountant("", "nameless")
    with pytest.raises(ValueError, match="only a sound accountant may calibrate"):
        dataclasses.replace(GDP, calibrates=True)
    with pytest.raises(ValueError, match="no factory"):
        Accountant("bare", "no way to compute").make()
    with pytest.raises(ValueError, match="delta"):
        PLUGIN.report(GAUSSIAN, 0.0)
