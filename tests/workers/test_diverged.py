"""A trial whose loss becomes NaN/inf is `failed` with error `diverged`, never `finished`."""

from __future__ import annotations

import dataclasses

from orchestrator import grid
from workers.trial import run_trial


def test_exploding_lr_is_recorded_as_diverged():
    spec = grid.parse("name: boom\nseeds: [0]\ngrid: {dataset: [digits], model: [mlp], mechanism: [nonprivate]}\n"
                      "train: {epochs: 1, batch_size: 64, lr: 1.0e+30, max_train_examples: 256}\n"
                      "audit: {enabled: false}\nresources: {cpus: 1, gpus: 0}\n")
    config = spec.trials[0]
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, lr=1e38, epochs=3))  # inf/NaN loss
    record = run_trial(config)
    assert record["status"] == "failed"
    assert record["error"].startswith("diverged")
