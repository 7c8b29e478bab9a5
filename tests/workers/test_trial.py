"""A real trial trains with the book-keeping engine by default, records the mode, and measures memory."""

from __future__ import annotations

import pytest

from workers.trial import run_trial


@pytest.mark.parametrize("mechanism", ["dpsgd", "gredp"])
def test_trial_defaults_to_bk_and_records_it(mechanism):
    rec = run_trial({"sweep": "t", "trial_key": f"k-{mechanism}", "seed": 0, "delta": 1e-5, "sigma": 1.0,
                     "dataset": "digits", "model": "mlp", "model_options": {"hidden": 16}, "mechanism": mechanism,
                     "train": {"epochs": 1, "batch_size": 64, "lr": 0.5}, "audit": {"mode": "off"},
                     "resources": {"cpus": 1, "gpus": 0}})
    assert rec["status"] == "finished", rec.get("traceback")
    assert rec["privacy"]["grad_sample_mode"] == "bk" and rec["privacy"]["bk_fallback"] is None
    assert rec["metrics"]["accuracy"] > 0.3  # it learns (chance is 0.1)
    assert rec["metrics"]["peak_memory_mb"] is not None and rec["metrics"]["peak_memory_mb"] >= 0
