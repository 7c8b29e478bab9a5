"""The audit's neighbouring pairs (`AuditCase`): a pair that does not differ, or whose halves differ in shape, is
refused where it is made."""

import numpy as np
import pytest

from mechanisms.auditing import AuditCase


def test_cases_are_validated():
    with pytest.raises(ValueError, match="non-zero"):
        AuditCase("zero", np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        AuditCase("bad", np.ones(3), np.zeros(4))
