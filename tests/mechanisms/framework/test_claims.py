"""claim_status: one pure function, precedence violated > overclaimed > uncertified > ok."""

import math

import pytest

from mechanisms.framework.claims import claim_status


@pytest.mark.parametrize("claimed, certified, audited, violated, expected", [
    (2.0, 2.0, 1.0, False, "ok"),
    (2.0, 2.0015, None, False, "ok"),  # within the 1e-3 relative tolerance
    (2.0, 2.1, None, False, "overclaimed"),
    (2.0, None, None, False, "uncertified"),
    (None, None, None, False, "uncertified"),
    (2.0, 3.0, 2.5, False, "violated"),  # audited above claimed beats overclaimed
    (2.0, 2.0, 0.1, True, "violated"),  # a curve-level audit verdict
    (2.0, None, None, True, "violated"),
    (2.0, math.inf, None, False, "overclaimed"),
])
def test_precedence(claimed, certified, audited, violated, expected):
    assert claim_status(claimed, certified, audited, audit_violated=violated) == expected


def test_nonprivate_has_no_status():
    assert claim_status(None, None, None, private=False) is None
