"""Regenerate the result tables of docs/results.md (and the README's quickstart table) from real runs.

Every table sits between `<!-- results: NAME -->` and `<!-- /results -->`. For each NAME asked for, this
runs `privbench sweep run examples/NAME.yaml` into one store (resuming what is already there), then
`privbench leaderboard SWEEP --format markdown --columns all` (SWEEP: the grid's `name`), and writes the command lines,
the wall time of the run and the table into every block of that name. Nothing in a block is typed by
hand, so the docs cannot drift from what the commands print (tests/test_docs.py checks their columns).

A wall time is written only for trials that ran in this call: a rerun on a store that already holds the
whole sweep runs nothing, so the block keeps the time it has (and without one, nothing is written); a
resume that ran some trials says how many.

A grid that reproduces a published table (`COMPARISONS`) gets that table beside the leaderboard: the
paper's cell, ours (mean +- std over the seeds the store holds), the difference, and each way's sigma,
claimed, certified and audited epsilon, verdict and time, with every cell the store does not hold marked
`not measured`. `--no-run` writes the blocks from what the store holds without running the grids (for a
grid too long for one sitting, run in parts into the same store with `privbench sweep run GRID --only ...`),
and says how many trials that is.

    python scripts/results.py [--store DIR] [--no-run] [--print] [quickstart gredp ...]   # default: every block
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "docs" / "results.md", ROOT / "README.md"]
BLOCK = re.compile(r"(<!-- results: ([\w-]+) -->\n)(.*?)(<!-- /results -->)", re.S)


def privbench(*args: str, capture: bool = False) -> str:
    done = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=ROOT, text=True, check=False,
                          stdout=subprocess.PIPE if capture else None)
    if done.returncode != 0:
        raise SystemExit(f"`privbench {' '.join(args)}` exited {done.returncode}")
    return done.stdout or ""


def machine(load_before: float) -> str:
    """Where the numbers were taken, so that a newcomer can tell another machine from a defect (a `step x` of
    1.14 here read 1.58 on a busy 2-core laptop): the CPU, its cores and memory, the GPU, and the load average
    before the run and at its end."""
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                 "CPU")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores of {model}, {memory:.0f} GiB, {device}, load average {load_before:.1f} before "
            f"and {os.getloadavg()[0]:.1f} at the end")


# The docs' tables show every column (the terminal's default is the compact set).
LEADERBOARD_ARGS = ("--format", "markdown", "--columns", "all")
TIMING = re.compile(r"^`privbench sweep run [^`]+` \((.*?)\), then ", re.M)


def finished(sweep: str, store: str) -> tuple[int, int]:
    """(finished, total) trials of the sweep in the store; (0, 0) when the store does not hold it yet."""
    done = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "status", sweep, "--store", store,
                           "--json"], cwd=ROOT, text=True, capture_output=True, check=False)
    try:
        counts = json.loads(done.stdout)["counts"]
    except (ValueError, KeyError):  # no such sweep in the store (yet): one error line, no JSON
        return 0, 0
    return counts.get("finished", 0), sum(counts.values())


def timing(ran: int, total: int, wall: float, previous: str | None, where: str) -> str:
    """The parenthesis after the run command: the wall time of what ran in this call, never a no-op
    resume's (then the block's previous timing stays, and without one there is nothing true to write)."""
    minutes, seconds = divmod(round(wall), 60)
    if ran <= 0:
        if previous is None:
            raise SystemExit("nothing ran (the store already holds the whole sweep), so there is no wall time to "
                             "write: rerun with a fresh --store to time it")
        return previous
    part = "" if ran >= total else f" for {ran} of {total} trials (the rest were resumed from the store)"
    return (f"{minutes} min {seconds:02d} s wall{part} on {where}; a rerun on a store that already holds the "
            "sweep only resumes")


class Comparison(NamedTuple):
    """A published table an example grid reproduces: the paper's cells, and what each mechanism of the grid
    stands for (its label, in the order shown; the first is the way that reproduces the paper's setting).
    A NamedTuple, not a dataclass: tests load this script by path, outside `sys.modules`."""

    reference: str
    published: dict[tuple[str, str], float]  # (dataset, model) -> the paper's test accuracy
    ways: dict[str, str]  # mechanism -> label


COMPARISONS = {
    "tramer_boneh": Comparison(
        "Tramèr & Boneh, ICLR 2021 (arXiv 2011.11660), test accuracy at (3, 1e-5)",
        {("mnist", "cnn-tanh"): 0.981, ("mnist", "scatternet-linear"): 0.987, ("mnist", "scatternet-cnn"): 0.987,
         ("fashion-mnist", "cnn-tanh"): 0.860, ("fashion-mnist", "scatternet-linear"): 0.897,
         ("fashion-mnist", "scatternet-cnn"): 0.890},
        {"dpsgd-shuffle-rdp": "as published", "dpsgd": "as certified"}),
}
NOT_MEASURED = "not measured"


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def comparison(comp: Comparison, board: list[dict]) -> str:
    """The paper's table beside ours (accuracy in points), then each way's privacy and time, from the rows of
    `privbench leaderboard --format json` (with `per_trial`'s means); a cell without a finished trial is
    `not measured`. The last column is what a stopping rule reading the test set reports (not a result: the
    paper's code selected its epoch that way)."""
    rows = {(r["dataset"], r["model"], r["mechanism"]): r for r in board if r.get("n_finished")}
    ways = list(comp.ways)
    head = "| dataset | model | paper | " + " | ".join(f"{comp.ways[w]} (`{w}`) | difference" for w in ways) + \
        f" | {comp.ways[ways[0]]}, best epoch by test accuracy |"
    lines = [head, "|" + "---|" * (4 + 2 * len(ways))]
    for (dataset, model), paper in comp.published.items():
        cells = [dataset, model, f"{100 * paper:.1f}"]
        for way in ways:
            row = rows.get((dataset, model, way))
            if row is None:
                cells += [NOT_MEASURED, "-"]
                continue
            n = row["n_finished"]
            spread = f" ± {100 * row['utility_std']:.2f} ({n} seeds)" if n > 1 else " (1 seed)"
            cells += [f"{100 * row['utility_mean']:.2f}{spread}",
                      f"{100 * (row['utility_mean'] - paper):+.2f}"]
        best = rows.get((dataset, model, ways[0]), {}).get("best_epoch_accuracy")
        cells.append(NOT_MEASURED if best is None else f"{100 * best:.2f} ({100 * (best - paper):+.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| dataset | model | way | sampler | sigma | eps claimed | eps certified | eps audited (one step) | "
              "mu claimed/audited (one step) | verdict | trial s | training share |", "|" + "---|" * 12]
    for dataset, model in comp.published:
        for way in ways:
            row = rows.get((dataset, model, way))
            if row is None:
                lines.append(f"| {dataset} | {model} | {comp.ways[way]} | {NOT_MEASURED} |" + " - |" * 8)
                continue
            trial_s = sum(row.get(k) or 0.0 for k in ("plan_s", "accelerator_s", "analysis_s"))
            share = f"{row['train_s'] / trial_s:.0%}" if row.get("train_s") and trial_s else "-"
            mu = f"{_num(row.get('mu_claimed'))}/{_num(row.get('mu_audited'))}"
            lines.append(f"| {dataset} | {model} | {comp.ways[way]} | {row.get('sampler') or '-'} | "
                         f"{_num(row['sigma'], 4)} | {_num(row['epsilon_claimed'])} | {_num(row['epsilon_certified'])} "
                         f"| {_num(row.get('epsilon_audited_step'))} | {mu} | {row.get('claim_status') or '-'} | "
                         f"{trial_s:.0f} | {share} |")
    return "\n".join(lines) + "\n"


@functools.cache
def exported(sweep: str, store: str) -> list[dict]:
    """Every trial record of the sweep (`privbench export`), read once per call of this script: a block reads
    it after its sweep has run, for its timing and its comparison alike."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "export.json"
        privbench("export", sweep, "--store", store, "--format", "json", "--out", str(out), capture=True)
        return json.loads(out.read_text())


def span(records: list[dict]) -> str:
    """Where and over how long the store's finished trials ran: their devices, and the seconds from the first
    trial's start to the last one's end (what a --no-run block can say of a sweep run elsewhere)."""
    done = [r["environment"] for r in records if r.get("status") == "finished" and r.get("environment")]
    if not done:
        return "no finished trial"
    devices = ", ".join(sorted({e.get("device", "?") for e in done}))
    hosts = len({e.get("hostname") for e in done})
    seconds = max(e["finished_at"] for e in done) - min(e["started_at"] for e in done)
    minutes, rest = divmod(round(seconds), 60)
    where = f"on {devices} ({hosts} host{'s' if hosts > 1 else ''})"
    return f"{where}, {minutes} min {rest:02d} s from the first trial's start to the last one's end"


def per_trial(records: list[dict]) -> dict[tuple[str, str, str], dict[str, float]]:
    """Means over the finished trials per (dataset, model, mechanism) of what the leaderboard does not carry,
    from `privbench export`: the training seconds (`train_s`) and the best epoch's test accuracy (what a
    stopping rule that reads the test set, as Tramèr & Boneh's code did, would report)."""
    found: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for r in records:
        if r.get("status") != "finished":
            continue
        c, cell = r["config"], {}
        if (r.get("metrics") or {}).get("train_s") is not None:
            cell["train_s"] = r["metrics"]["train_s"]
        if (r.get("curves") or {}).get("test_accuracy"):
            cell["best_epoch_accuracy"] = max(r["curves"]["test_accuracy"])
        for name, value in cell.items():
            found.setdefault((c["dataset"], c["model"], c["mechanism"]), {}).setdefault(name, []).append(value)
    return {key: {name: sum(v) / len(v) for name, v in values.items()} for key, values in found.items()}


def grid_size(grid: str) -> int:
    sys.path.insert(0, str(ROOT))
    from orchestrator import grid as grid_lib

    return len(grid_lib.load(ROOT / grid).trials)


def block(name: str, store: str, previous: str | None, run: bool = True) -> str:
    import yaml

    grid = f"examples/{name}.yaml"
    sweep = yaml.safe_load((ROOT / grid).read_text())["name"]
    before, _ = finished(sweep, store)
    if run:
        load = os.getloadavg()[0]
        start = time.monotonic()
        privbench("sweep", "run", grid, "--store", store)
        wall = time.monotonic() - start
        after, total = finished(sweep, store)
        when = timing(after - before, total, wall, previous, machine(load))
    else:
        total = grid_size(grid)
        rest = ", the rest are `not measured`" if before < total else ""
        when = (f"not run by this script: the store holds {before} of its {total} trials{rest}, run "
                f"{span(exported(sweep, store))}; each trial's seconds are below")
    table = privbench("leaderboard", sweep, *LEADERBOARD_ARGS, "--store", store, capture=True)
    text = (f"`privbench sweep run {grid}` ({when}), then `privbench leaderboard {sweep} "
            f"{' '.join(LEADERBOARD_ARGS)}`:\n\n{table.strip()}\n")
    if name in COMPARISONS:
        comp = COMPARISONS[name]
        board = json.loads(privbench("leaderboard", sweep, "--format", "json", "--store", store, capture=True))
        extra = per_trial(exported(sweep, store))
        board = [r | extra.get((r["dataset"], r["model"], r["mechanism"]), {}) for r in board]
        text += (f"\nBeside {comp.reference} (accuracy in points; `privbench leaderboard {sweep} --format json` and "
                 f"`privbench export {sweep}`):\n\n{comparison(comp, board)}")
    if "tune" in yaml.safe_load((ROOT / grid).read_text()):  # a tuned grid: its selections too
        tuned = privbench("leaderboard", sweep, "--view", "tuned", "--format", "markdown", "--store", store,
                          capture=True)
        text += f"\nand `privbench leaderboard {sweep} --view tuned --format markdown`:\n\n{tuned.strip()}\n"
    return text


def previous_timing(name: str) -> str | None:
    """The timing text of the first existing block called `name` (None when it has none)."""
    for page in PAGES:
        for m in BLOCK.finditer(page.read_text()):
            found = TIMING.search(m[3]) if m[2] == name else None
            if found:
                return found[1]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="blocks to regenerate (default: all)")
    parser.add_argument("--store", default=str(ROOT / "privbench-store"), help="store the sweeps run in")
    parser.add_argument("--no-run", action="store_true", help="write what the store holds; run no grid")
    parser.add_argument("--print", action="store_true", help="print the blocks; leave the docs as they are")
    args = parser.parse_args()
    known = {m[2] for page in PAGES for m in BLOCK.finditer(page.read_text())}
    unknown = set(args.names) - known
    if unknown:
        raise SystemExit(f"no result block named {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    made: dict[str, str] = {}
    for name in args.names or sorted(known):
        made[name] = block(name, args.store, previous_timing(name), run=not args.no_run)
        if args.print:
            print(made[name])
            continue
        for page in PAGES:  # written after each sweep, into the page as it is now: nothing done is lost
            page.write_text(BLOCK.sub(lambda m: m[1] + made[m[2]] + m[4] if m[2] in made else m[0],
                                      page.read_text()))
        print(f"{name}: regenerated", file=sys.stderr)


if __name__ == "__main__":
    main()
