"""A large grid's run path holds no list of its trials (issue 40, item 4): `sweep run` reads a grid as a `Trials`
sequence, opens the sweep's ledger rows from a stream made once, and feeds the driver the unfinished trials batch
by batch. Measured here by counting the trials made; the 10^6-trial figures are `benchmarks/grid_scale.py`'s."""

from __future__ import annotations

import itertools
import json

import pytest

from orchestrator import grid as grids
from orchestrator import runner
from storage.location import resolve
from storage.store import Store


def grid_text(seeds: int, epsilons: int, name: str = "big") -> str:
    return (f"name: {name}\nmax_trials: {2 * seeds * epsilons}\nseeds: [{', '.join(map(str, range(seeds)))}]\n"
            "grid: {dataset: [digits], model: [mlp], mechanism: [nonprivate, dpsgd], epsilon: ["
            + ", ".join(f"{1 + i / 10:g}" for i in range(epsilons)) + "]}\n")


@pytest.fixture
def made(monkeypatch):
    """How many trials the grid module has made so far (every trial comes from `_expand`)."""
    count = [0]
    expand = grids._expand

    def counting(*args, **kwargs):
        for trial in expand(*args, **kwargs):
            count[0] += 1
            yield trial

    monkeypatch.setattr(grids, "_expand", counting)
    return count


def test_a_large_grid_is_read_without_making_its_trials(made):
    spec = runner.load_grid(grid_text(1000, 100))  # 1,000 x (1 + 100) = 101,000 trials
    assert len(spec.trials) == 101_000 and spec.trials.lazy
    assert made[0] == 0
    samples = grids.samples(spec.trials)
    assert [(t.mechanism, t.seed) for t in samples] == [("nonprivate", 0), ("dpsgd", 0)]
    first = spec.trials[1]
    assert (first.mechanism, first.seed) == ("nonprivate", 1)
    assert made[0] == 2 + 2  # the samples and the first two trials, nothing more


def test_a_small_grid_is_made_once_and_kept(made):
    spec = runner.load_grid(grid_text(3, 2))
    assert not spec.trials.lazy and len(spec.trials) == 9 and made[0] == 9
    assert list(spec.trials) == list(spec.trials) and made[0] == 9


def test_a_large_grid_opens_from_a_stream_and_its_todo_is_read_in_batches(tmp_path, made, monkeypatch):
    """The ledger gets every trial from one pass (keys) and one stream (rows); reopening reads no row stream; the
    trials to run come private first, each once, and a finished one is left out: the order and resume of a small
    grid's run, without a list of the grid."""
    monkeypatch.setattr(grids, "MATERIALISE", 50)
    spec = runner.load_grid(grid_text(40, 3, name="streamed"))  # 40 x (1 + 3) = 160 trials
    assert spec.trials.lazy and made[0] == 0
    st = Store(resolve(str(tmp_path / "store")), create=True)
    streamed = [0]

    def rows():
        for t in spec.trials:
            streamed[0] += 1
            yield t.to_dict()

    st.open_sweep(spec.name, spec.text, rows(), key_of=grids.stored_key, keys=[t.trial_key for t in spec.trials])
    assert streamed[0] == 160 and st.status_counts(spec.name) == {"pending": 160}
    streamed[0] = 0
    st.open_sweep(spec.name, spec.text, rows(), key_of=grids.stored_key, keys=[t.trial_key for t in spec.trials])
    assert streamed[0] == 0  # every key known: the rows are not made again

    monkeypatch.setattr("storage.ledger.KEY_BATCH", 7)  # several batches, one smaller at the end of each group
    todo = runner._Todo(st, spec.name, spec.trials, 160)
    order = [t.trial_key for t in todo]
    expected = [t.trial_key for t in spec.trials if t.private] + [t.trial_key for t in spec.trials if not t.private]
    assert order == expected and len(set(order)) == 160

    done = next(t for t in spec.trials if t.private)
    record = {"sweep": spec.name, "trial_key": done.trial_key, "status": "finished", "config": done.to_dict(),
              "metrics": {"accuracy": 0.5}}
    assert st.claim(spec.name, done.trial_key) and st.record(record)
    before = made[0]
    left = list(itertools.islice(runner._Todo(st, spec.name, spec.trials, 159), 5))
    assert done.trial_key not in [t.trial_key for t in left] and len(left) == 5
    assert made[0] - before <= 2 + 7  # the samples and one batch of private trials: not the grid
    st.close()


@pytest.mark.slow  # 35 s; the default suite checks the streamed path without Ray (the tests above)
@pytest.mark.usefixtures("local_ray")
def test_a_streamed_grid_runs_resumes_and_is_then_done(cli, write_grid, store, monkeypatch):
    """End to end on real Ray and MLflow, with every grid streamed (`MATERIALISE` 1): the early line, every trial
    recorded once, and the rerun reading only the ledger."""
    monkeypatch.setattr(grids, "MATERIALISE", 1)
    grid = write_grid({"seeds": [0, 1], "grid": {"dataset": ["digits"], "model": ["mlp"],
                                                 "mechanism": ["nonprivate"]},
                       "train": {"epochs": 1, "batch_size": 64, "lr": 0.5, "max_train_examples": 64},
                       "audit": {"enabled": False}})
    result = cli("sweep", "run", grid, "--store", store)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "sweep tiny: 2 trials; opening them in the store" in text
    assert "2 trials, 0 already finished, 2 to run" in text
    status = json.loads(cli("sweep", "status", "tiny", "--store", store, "--json").stdout)
    assert status["counts"] == {"finished": 2} and len({t["run_id"] for t in status["trials"]}) == 2
    again = cli("sweep", "run", grid, "--store", store)
    assert again.exit_code == 0 and "nothing to do" in again.output


def test_only_on_a_large_grid_is_a_lazy_part_counted_and_run_from_the_ledger(tmp_path, made, monkeypatch, cli):
    """`--only` on a large grid: one pass finds its values and count (not one per item), the part is made anew
    at each pass and never held, its trials to run and its unrun count come from the ledger in batches, and
    `--dry-run` streams it. A small grid's `--only` is the tuple it was."""
    monkeypatch.setattr(grids, "MATERIALISE", 50)
    spec = runner.load_grid(grid_text(40, 3, name="parted"))  # 160 trials: 40 nonprivate, 120 dpsgd
    part = runner.select(spec, ["mechanism=dpsgd", "epsilon=1.1", "epsilon=1.2"])
    assert part.lazy and len(part) == 80 and made[0] == 160  # one pass for three items
    assert [t.epsilon for t in itertools.islice(part, 3)] == [1.1, 1.2, 1.1]
    with pytest.raises(runner.SweepError, match=r"--only epsilon='9.0': no trial of the grid has it \(it has 1.0, "):
        runner.select(spec, ["epsilon=9"])
    with pytest.raises(runner.SweepError, match="no trial of the grid has all of these"):
        runner.select(spec, ["mechanism=nonprivate", "epsilon=1"])

    st = Store(resolve(str(tmp_path / "store")), create=True)
    st.open_sweep(spec.name, spec.text, (t.to_dict() for t in spec.trials), key_of=grids.stored_key,
                  keys=[t.trial_key for t in spec.trials])
    monkeypatch.setattr("storage.ledger.KEY_BATCH", 7)
    done = next(iter(part))
    assert st.claim(spec.name, done.trial_key) and st.record({
        "sweep": spec.name, "trial_key": done.trial_key, "status": "finished", "config": done.to_dict(),
        "metrics": {"accuracy": 0.5}})
    assert runner._count_in_ledger(st, spec.name, part) == 79
    assert runner._unrun(st, spec.name, st.status_counts(spec.name), part, len(spec.trials)) == 79
    todo = runner._Todo(st, spec.name, part, 79)
    assert [t.trial_key for t in todo] == [t.trial_key for t in part if t.trial_key != done.trial_key]
    st.close()

    small = runner.load_grid(grid_text(3, 2))
    assert isinstance(runner.select(small, ["seed=1"]), tuple)

    grid = tmp_path / "parted.yaml"
    grid.write_text(grid_text(40, 3, name="parted"))
    monkeypatch.setattr("orchestrator.sweep_cli.DRY_RUN_TABLE", 10)  # a line per trial past this many
    listed = cli("sweep", "run", grid, "--dry-run", "--only", "epsilon=1.1", "--store", tmp_path / "s")
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert lines[0] == "sweep parted: 160 trials (40 selected by --only)" and len(lines) == 2 + 40
