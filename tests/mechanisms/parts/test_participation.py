"""Participation schemas: the cyclic patterns are the steps one example joins when the same order runs every
epoch, the min-separation patterns are every admissible step set (against an enumeration of all subsets), the
cyclic schema is within the min-separation one, and bad schemas are refused where they are made."""

from __future__ import annotations

import pytest

from mechanisms.parts.participation import Participation


@pytest.mark.parametrize(("per_epoch", "epochs"), [(1, 3), (4, 3), (5, 1)])
def test_cyclic_patterns_are_one_fixed_order_repeated(per_epoch, epochs):
    joined: dict[int, list[int]] = {}  # position in the order -> the steps it joins
    for step in range(per_epoch * epochs):
        joined.setdefault(step % per_epoch, []).append(step)
    patterns = list(Participation.cyclic(per_epoch, epochs).patterns())
    assert patterns == [tuple(steps) for _, steps in sorted(joined.items())]


@pytest.mark.parametrize(("steps", "k", "sep"), [(6, 2, 3), (7, 3, 2), (5, 1, 1)])
def test_min_separation_patterns_are_every_admissible_set(steps, k, sep):
    admissible = set()
    for mask in range(1, 2**steps):
        chosen = [s for s in range(steps) if mask >> s & 1]
        if len(chosen) <= k and all(b - a >= sep for a, b in zip(chosen, chosen[1:], strict=False)):
            admissible.add(tuple(chosen))
    patterns = list(Participation(steps, k, sep, "min-separation").patterns())
    assert len(patterns) == len(set(patterns)) and set(patterns) == admissible


def test_cyclic_is_within_min_separation():
    cyclic = Participation.cyclic(4, 3)
    wider = Participation(cyclic.steps, cyclic.max_participations, cyclic.min_separation, "min-separation")
    assert set(cyclic.patterns()) < set(wider.patterns())
    assert not cyclic.single and Participation.cyclic(7, 1).single


@pytest.mark.parametrize(("args", "message"), [((0, 1, 1), "steps"), ((4, True, 1), "max_participations"),
                                               ((4, 1, 1.5), "min_separation"), ((4, 1, 1, "random"), "schema"),
                                               ((10, 5, 3), "at most 4 participations")])
def test_bad_schemas_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        Participation(*args)
