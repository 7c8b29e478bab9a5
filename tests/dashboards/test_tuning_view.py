"""The leaderboard's side of tuning: which candidate a cell selects, what the default and the tuned views
show, and the "best of N, tuning unaccounted" flag with its N-fold composition."""

from __future__ import annotations

import re

import dp_accounting
import pytest

from dashboards import figures, tuned_cells
from dashboards import leaderboard as lb
from mechanisms.accounting.compare import DpsgdSetting
from mechanisms.accounting.sound import epsilon as certified_epsilon
from mechanisms.accounting.tuning_cost import TUNABLE

FAMILY = DpsgdSetting.poisson(64 / 1258, 100, 1e-5).parts()


def record(candidate: int | None, val: float | None, test: float, *, runs: int = 3, status: str = "finished",
           cell: str = "c0", mechanism: str = "dpsgd", lr: float = 0.5, sigma: float = 2.0, sweep: str = "s",
           eps_tuned: float = 0.99) -> dict:
    config = {"dataset": "digits", "model": "mlp", "mechanism": mechanism, "epsilon": 1.0, "seed": 7,
              "train": {"lr": lr, "batch_size": 64}}
    privacy = {"delta": 1e-5, "sigma": sigma, "epsilon_certified": 0.5, "claim_status": "ok",
               "effective_event": repr(FAMILY(sigma))}
    if candidate is not None:
        config["tuning"] = {"cell": cell, "candidate": candidate, "runs": runs, "params": {"lr": lr},
                            "cell_seed": 0, "spec": {}}
        privacy |= {"epsilon_certified_run": 0.5, "epsilon_certified_tuned": eps_tuned, "tuning_runs": runs,
                    "tuning_distribution": "poisson(mean 8)", "tuning_budget": "total"}
    return {"sweep": sweep, "status": status, "config": config, "privacy": privacy,
            "metrics": {"accuracy": test, "val_accuracy": val} if status == "finished" else {}}


def test_the_best_validation_score_is_selected_ties_to_the_lowest_index():
    cell = [record(0, 0.7, 0.60), record(1, 0.8, 0.50), record(2, 0.8, 0.90)]
    (selection,) = tuned_cells.selections(cell)
    assert selection.complete and selection.selected is cell[1]  # never the best test score


def test_failed_candidates_count_toward_k_but_are_never_selected():
    cell = [record(0, 0.6, 0.6), record(1, None, 0.0, status="failed"), record(2, 0.5, 0.9)]
    (selection,) = tuned_cells.selections(cell)
    assert selection.selected is cell[0]
    (incomplete,) = tuned_cells.selections(cell[:2])
    assert not incomplete.complete and incomplete.selected is None


def test_the_default_view_shows_only_the_selected_candidate_and_marks_the_cell():
    cell = [record(0, 0.7, 0.61), record(1, 0.9, 0.52), record(2, 0.8, 0.95)]
    (row,) = lb.rows(cell)
    assert row.utility_mean == pytest.approx(0.52) and row.n_finished == 1
    assert row.tuning == "tuned (poisson(mean 8), budget total): eps incl. tuning 0.99"
    assert lb.rows(cell[:2]) == []  # an incomplete cell shows no test score yet


def test_the_tuned_view_ranks_by_epsilon_including_tuning():
    records = [record(0, 0.7, 0.80, runs=1, eps_tuned=2.5, mechanism="dpsgd-gdp", cell="g"),
               record(0, 0.6, 0.70, runs=2, eps_tuned=0.99, cell="d"),
               record(1, 0.9, 0.75, runs=2, eps_tuned=0.99, cell="d")]
    rows = tuned_cells.rows(records + [record(0, 0.5, 0.5, cell="x", runs=4)])  # incomplete cell x
    assert [r.mechanism for r in rows] == ["dpsgd", "dpsgd-gdp"]
    dp = rows[0]
    assert dp.utility_mean == pytest.approx(0.75) and dp.epsilon_tuned == 0.99 and dp.cells == 2
    assert dp.incomplete == 1 and dp.selected_params == "lr 0.5"
    text = tuned_cells.markdown(rows)
    assert text.splitlines()[0].startswith("| dataset | model | mechanism | eps target | utility (selected)")
    # written as every output writes utility and epsilon (an upper bound: 2 decimals, rounded up)
    assert "| dpsgd-gdp | 1 | 80.0 ± 0.0 | 2.50 | 0.50 |" in text


def test_untuned_runs_at_several_settings_are_best_of_n_with_their_composition():
    runs = [record(None, None, 0.6, lr=0.1, sweep="a"), record(None, None, 0.7, lr=0.5, sweep="b"),
            record(None, None, 0.65, lr=1.0, sweep="c", sigma=3.0)]
    board = lb.rows(runs)
    assert len(board) == 3
    composed = certified_epsilon(dp_accounting.ComposedDpEvent([FAMILY(2.0), FAMILY(2.0), FAMILY(3.0)]), 1e-5, "pld")
    flag = tuned_cells.unaccounted(runs)[("digits", "mlp", "dpsgd", 1.0)]
    assert flag.settings == 3 and flag.epsilon_fixed_runs == pytest.approx(composed)
    assert all(r.tuning == flag.note() and r.tuning.startswith("best of 3, tuning unaccounted") for r in board)
    # an upper bound, written as every output writes a certified epsilon: two decimals, rounded up (was `.3g`)
    shown = flag.note().rsplit("certify eps ", 1)[1]
    assert re.fullmatch(r"\d+\.\d\d", shown) and float(shown) >= composed, flag.note()
    assert lb.rows(runs[:1])[0].tuning is None  # one setting: nothing was picked
    same = [record(None, None, 0.6, sweep="a"), record(None, None, 0.7, sweep="b")]
    assert all(r.tuning is None for r in lb.rows(same))  # seeds or sweeps at one setting are not tuning


def test_events_are_rebuilt_from_their_repr_and_nothing_else_is_evaluated():
    event = dp_accounting.ComposedDpEvent([FAMILY(1.3), DpsgdSetting.of("shuffle", 100, 10, 1, 1e-5).parts()(2.0)])
    assert tuned_cells.event_from_repr(repr(event)) == event
    for text in ("__import__('os').system('true')", "GaussianDpEvent(noise_multiplier=open('x'))", "1 + 1"):
        with pytest.raises(ValueError):
            tuned_cells.event_from_repr(text)


def test_the_settings_list_is_the_accountants():
    assert tuned_cells.SETTINGS == TUNABLE


def test_the_figure_joins_each_epsilon_per_run_to_the_one_including_tuning():
    records = [record(0, 0.7, 0.80, runs=1, eps_tuned=2.5, cell="g"), record(0, 0.6, 0.7, runs=1, cell="d",
                                                                            mechanism="dpsgd-gdp")]
    (ax,) = figures.tuning(records).axes
    assert ax.get_xscale() == "log" and ax.get_title() == "digits / mlp"
    joins = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
    assert sorted(tuple(ln.get_xdata()) for ln in joins) == [(0.5, 0.99), (0.5, 2.5)]
    assert figures.tuning([]).texts[0].get_text() == "no complete tuned cells"
