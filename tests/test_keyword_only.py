"""The settings and results that cross privbench's layers are frozen and keyword-only: a call names each field,
so adding or reordering one never silently shifts a value into the wrong place (a delta into a sigma)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from mechanisms.accounting.calibration import Calibration
from mechanisms.accounting.compare import DpsgdSetting
from mechanisms.accounting.events import DpsgdRun
from mechanisms.accounting.reference import EpsilonReport
from mechanisms.auditing.step_audit import CaseResult, StepAudit
from mechanisms.auditing.white_box import CanaryDesign
from mechanisms.parts.plan import PrivacyPlan, PrivacySpec
from orchestrator.grid import CheckedGrid
from workers.config import AuditConfig, Resources, TrainConfig, TrialConfig
from workers.tuning_candidates import TuningSetting

CROSSING = (PrivacySpec, PrivacyPlan, DpsgdSetting, DpsgdRun, EpsilonReport, Calibration, StepAudit, CaseResult,
            CanaryDesign, CheckedGrid, TrialConfig, TrainConfig, AuditConfig, Resources, TuningSetting)


@pytest.mark.parametrize("cls", CROSSING, ids=lambda c: c.__name__)
def test_frozen_and_keyword_only(cls):
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    kinds = {p.kind for p in inspect.signature(cls).parameters.values()}
    assert kinds == {inspect.Parameter.KEYWORD_ONLY}, cls.__name__


def test_a_positional_call_is_refused():
    with pytest.raises(TypeError):
        EpsilonReport(1.0, "pld", "pld")  # type: ignore[misc]
