"""Where a sweep's wall time went: the trials' breakdowns (`timing`, workers/timing.py) set beside the drivers' own
accounts (`privbench_driver_runs`), for `privbench sweep status --timing`.

How the wall time is explained. A driver run's wall time is its start (Ray, the store), its loop and its end (leases,
summary files); `run_all`'s own setup outside the loop is left unexplained. In the loop, the accelerator slots' time
(slots x loop) is the trials' accelerator spans (each submission to the driver's receipt of its output, made of the
parts in `workers.timing.PARTS`) plus the slots' idle time, both measured by the driver. What none of these covers,
in seconds of wall time, is the unexplained share: the driver's gaps, the difference between the slots' busy time
and the trials' spans, and each span's seconds no part covers, over the slots. The plan tasks, the analyses and the
driver's writes run beside the accelerator slots (on the CPU slots, in the driver) and are shown beside them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workers.timing import BESIDE, PARTS

GOAL = 0.05  # the unexplained share a sweep's breakdown should stay under


def sweep_timing(records: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The breakdown of a sweep's wall time (module docstring): per part, its slot-seconds summed over the trials
    and its CPU seconds; the drivers' parts; the unexplained seconds and share. Trials recorded before the first
    driver run with an account (older privbench) are left out."""
    first = min((float(r["started_at"]) for r in runs), default=None)
    timed = [r for r in records if (r.get("timing") or {}).get("span_s") is not None
             and (first is None or float((r.get("environment") or {}).get("started_at") or 0.0) >= first - 1.0)]
    parts = {p: sum(float(r["timing"].get(p) or 0.0) for r in timed) for p in (*PARTS, *BESIDE)}
    cpu = {p: sum(float((r["timing"].get("cpu") or {}).get(p) or 0.0) for r in timed) for p in (*PARTS, *BESIDE)}
    spans = sum(float(r["timing"]["span_s"]) for r in timed)
    inside = sum(max(0.0, float(r["timing"]["span_s"]) - sum(float(r["timing"].get(p) or 0.0) for p in PARTS))
                 for r in timed)
    driver = {k: sum(float(r["timing"].get(k) or 0.0) for r in runs)
              for k in ("startup_s", "loop_s", "run_all_s", "end_s", "record_s", "save_s", "submit_s",
                        "memory_probe_s", "idle_slot_s", "busy_slot_s")}
    wall = sum(float(r["wall_s"]) for r in runs)
    slots = max((int(r["timing"].get("slots") or 1) for r in runs), default=1)
    gaps = max(0.0, wall - driver["startup_s"] - driver["run_all_s"] - driver["end_s"]) \
        + max(0.0, driver["run_all_s"] - driver["loop_s"])
    unexplained = gaps + (abs(driver["busy_slot_s"] - spans) + inside) / slots
    return {"wall_s": wall, "driver_runs": len(runs), "trials": len(timed), "slots": slots,
            "driver": driver, "parts_slot_s": parts, "parts_cpu_s": cpu, "spans_slot_s": spans,
            "unexplained_in_spans_slot_s": inside, "driver_gaps_s": gaps, "unexplained_s": unexplained,
            "unexplained_share": unexplained / wall if wall > 0 else None,
            "per_trial": [{"trial_key": r["trial_key"]} | {k: (r.get("config") or {}).get(k)
                                                            for k in ("mechanism", "epsilon", "seed")}
                          | {p: r["timing"].get(p) for p in (*PARTS, *BESIDE, "span_s")} for r in timed]}


def lines(name: str, t: Mapping[str, Any]) -> list[str]:
    """The breakdown as text, one part a line (seconds of wall time: slot-seconds over the slots)."""
    if not t["driver_runs"]:
        return [f"sweep {name}: no driver run with a timing account (run by an older privbench, or not run yet)"]
    d, slots = t["driver"], t["slots"]
    out = [f"sweep {name}: {t['wall_s']:.1f} s wall in {t['driver_runs']} driver run(s), {t['trials']} trial(s) "
           f"timed, {slots} accelerator slot(s)",
           f"  driver: start {d['startup_s']:.2f} s (Ray, store), loop {d['loop_s']:.2f} s, end {d['end_s']:.2f} s "
           f"(leases, summary); in the loop: records {d['record_s']:.2f} s, outputs saved {d['save_s']:.2f} s, "
           f"submissions {d['submit_s']:.2f} s; memory probe {d['memory_probe_s']:.2f} s",
           f"  accelerator slots ({slots} x {d['loop_s']:.1f} s), seconds of wall time (slot-s / {slots}) and CPU s:"]
    for p in PARTS:
        if t["parts_slot_s"][p] or t["parts_cpu_s"][p]:
            out.append(f"    {p[:-2]:<15} {t['parts_slot_s'][p] / slots:8.2f} s   cpu {t['parts_cpu_s'][p]:7.2f} s")
    out.append(f"    {'idle':<15} {d['idle_slot_s'] / slots:8.2f} s")
    out.append("  beside (CPU slots, driver): " + ", ".join(
        f"{p[:-2]} {t['parts_slot_s'][p]:.2f} s" for p in BESIDE))
    share = t["unexplained_share"]
    verdict = "" if share is None else (" (within the 5% goal)" if share < GOAL else " (over the 5% goal)")
    out.append(f"  unexplained: {t['unexplained_s']:.2f} s of {t['wall_s']:.1f} s"
               + ("" if share is None else f" = {100 * share:.1f}%") + verdict)
    return out


__all__ = ["GOAL", "lines", "sweep_timing"]
