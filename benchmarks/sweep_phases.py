"""A sweep's phase split and the accelerator's busy fraction (issue 19).

Runs a grid with `python -m orchestrator sweep run GRID --store TMP --max-concurrent SLOTS` in a fresh
process (its own local Ray), then reads the records: the seconds each phase took summed over the
trials (`plan_s` once per distinct plan, `accelerator_s`, `analysis_s`), the sum of `train_s`, and

    busy fraction = sum of accelerator phases / (wall x SLOTS)

the share of the accelerator slots' time that trials held them (on a GPU: the GPUs; on CPU the slots
are CPU trials at once, so this measures the driver's scheduling, not a GPU). `train busy` divides the
summed training time the same way. The default grid is a small digits grid (mlp; nonprivate, dpsgd,
dpsgd-gdp; epsilon 1 and 8; 2 seeds; audits on).

    python benchmarks/sweep_phases.py [--grid GRID.yaml] [--slots 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS = """name: phases
seeds: [0, 1]
grid: {dataset: [digits], model: [mlp], mechanism: [nonprivate, dpsgd, dpsgd-gdp], epsilon: [1, 8]}
train: {epochs: 4, batch_size: 64, lr: 0.5}
audit: {mode: both, canaries: 500}
resources: {cpus: 1, gpus: auto}
"""


def measure(grid: Path, slots: int) -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    from storage.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "run", str(grid), "--store", str(store),
                        "--max-concurrent", str(slots)], check=True, cwd=ROOT,
                       env=os.environ | {"PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        st = Store(store)
        records = [r for name in st.sweep_names() for r in st.records(name)]
        st.close()
    metrics = [r["metrics"] for r in records if r["status"] == "finished"]
    total = {k: sum(float(m.get(k) or 0.0) for m in metrics) for k in ("accelerator_s", "analysis_s", "train_s")}
    plans = {m["plan_s"] for m in metrics}  # one value per shared plan
    return {"trials": len(metrics), "wall_s": wall, "slots": slots, "plan_s": sum(plans), **total,
            "busy_fraction": total["accelerator_s"] / (wall * slots), "train_busy": total["train_s"] / (wall * slots)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=Path, help="grid file (default: a small digits grid)")
    parser.add_argument("--slots", type=int, default=2, help="--max-concurrent of the sweep")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        grid = args.grid
        if grid is None:
            grid = Path(tmp) / "phases.yaml"
            grid.write_text(DIGITS)
        result = measure(grid, args.slots)
    for key, value in result.items():
        print(f"{key:>14}: {value:.3f}" if isinstance(value, float) else f"{key:>14}: {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
