"""The driver's cost of recording one trial (`Store.record`), without Ray or training.

Opens a fresh folder store, registers N trials, claims and records them one by one (as `sweep run`
does) and prints the wall and CPU time per record for the first and the last 50: if the driver read the
whole sweep per record, the last would cost more than the first.

    python benchmarks/record_cost.py --n 60 300 1000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storage.location import resolve
from storage.store import Store


def fake_record(i: int) -> dict:
    cfg = {"sweep": "bench", "trial_key": f"k{i:05d}", "mechanism": "nonprivate", "dataset": "digits",
           "model": "mlp", "seed": i, "epsilon": None, "delta": 1e-5,
           "train": {"epochs": 1, "batch_size": 64, "lr": 0.5, "max_train_examples": 64},
           "audit": {"enabled": False}, "resources": {"cpus": 1, "gpus": 0}}
    now = time.time()
    return {"sweep": "bench", "trial_key": cfg["trial_key"], "status": "finished", "config": cfg,
            "metrics": {"accuracy": 0.5, "val_accuracy": 0.5, "loss": 1.0, "wall_s": 0.06, "train_s": 0.02,
                        "step_time_s": 0.01, "n_train": 64.0},
            "curves": {"loss": [1.2], "val_accuracy": [0.5]},
            "privacy": {"epsilon_claimed": None, "epsilon_certified": None, "claim_status": "nonprivate"},
            "environment": {"hostname": "h", "pid": 1, "device": "cpu", "started_at": now - 0.1, "finished_at": now,
                            "versions": {"python": "3.11", "torch": "2", "mlflow": "3"}}}


def measure(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="privbench-record-") as tmp:
        st = Store(resolve(str(Path(tmp) / "store")), create=True)
        records = [fake_record(i) for i in range(n)]
        st.open_sweep("bench", "name: bench", [r["config"] for r in records])
        times, cpu = [], []
        for r in records:
            start, start_cpu = time.perf_counter(), time.process_time()
            assert st.claim("bench", r["trial_key"])
            assert st.record(r) is not None
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        k = min(50, n)
        return {"n": n, "first_ms": 1000 * statistics.median(times[:k]),
                "last_ms": 1000 * statistics.median(times[-k:]), "mean_ms": 1000 * statistics.mean(times),
                "cpu_ms": 1000 * statistics.mean(cpu)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[60, 300, 1000])
    args = parser.parse_args()
    print("| N | median ms/record, first 50 | median ms/record, last 50 | mean ms/record | driver CPU ms/record |")
    print("|---|---|---|---|---|")
    for n in args.n:
        row = measure(n)
        print(f"| {n} | {row['first_ms']:.1f} | {row['last_ms']:.1f} | {row['mean_ms']:.1f} | {row['cpu_ms']:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
