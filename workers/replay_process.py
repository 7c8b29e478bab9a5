"""The state replay's own process (`python -m workers.replay_process`, started by `workers.replay.replay_apart`).

Apart from `workers.replay` because it needs the trial's preparation (`workers.trial`), which itself calls
`replay_apart`: one module for each side keeps the two files free of an import cycle.
"""

from __future__ import annotations

import pickle
import sys

import mechanisms
from mechanisms.framework.integrity.verdict import replay_state
from workers.trial import _prepare, as_config


def main() -> None:
    path, config, plan, trace = pickle.loads(sys.stdin.buffer.read())
    sys.path[:] = path
    # imported only after sys.path is the parent's, so that the parent's privbench and plugins are found

    trial = as_config(config)
    _prepare(trial)
    finding = replay_state(mechanisms.get(trial.mechanism), plan, trace)
    sys.stdout.buffer.write(pickle.dumps(finding))


if __name__ == "__main__":
    main()
