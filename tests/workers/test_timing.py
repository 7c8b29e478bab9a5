"""workers/timing.py: a stopwatch times its parts on both clocks and round-trips through the record."""

from __future__ import annotations

from workers.timing import Stopwatch, explained


def test_a_stopwatch_adds_the_parts_it_times_on_both_clocks():
    watch = Stopwatch()
    with watch.part("data_s"):
        sum(range(200_000))
    with watch.part("data_s"):
        pass
    watch.add("transfer_s", 0.5)
    again = Stopwatch.from_dict(watch.to_dict())
    assert again.wall == watch.wall and again.cpu == watch.cpu
    assert watch.wall["data_s"] > 0 and watch.cpu["data_s"] > 0 and "transfer_s" not in watch.cpu
    assert explained({"data_s": 1.0, "transfer_s": 0.5, "span_s": 2.0, "audits_s": 9.0}) == (1.5, 2.0)
