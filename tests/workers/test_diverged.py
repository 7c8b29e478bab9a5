"""A trial whose loss becomes NaN/inf is `failed` with error `diverged`, never `finished`."""

from __future__ import annotations

import dataclasses

from orchestrator import grid
from workers.trial import run_trial


def test_exploding_lr_is_recorded_as_diverged():
    spec = grid.parse("name: boom\nseeds: [0]\ngrid: {dataset: [digits], model: [mlp], mechanism: [nonprivate]}\n"
                      "train: {epochs: 1, batch_size: 64, lr: 1000, max_train_examples: 256}\n"
                      "audit: {enabled: false}\nresources: {cpus: 1, gpus: 0}\n")
    config = spec.trials[0]
    train = dataclasses.replace(config.train, epochs=3)
    object.__setattr__(train, "lr", 1e38)  # past the grid's bound on purpose: the loss overflows to inf/NaN
    config = dataclasses.replace(config, train=train)
    record = run_trial(config)
    assert record["status"] == "failed"
    assert record["error"].startswith("diverged")
