"""The state replay in a process of its own: `replay_apart` starts `python -m workers.replay_process`, which
reads (sys.path, trial config, plan, trace) as a pickle on stdin, loads the trial's plugins and its mechanism
fresh, replays the state from the recorded releases alone (`mechanisms.framework.integrity.verdict.replay_state`) and
writes the `Finding` as a pickle on stdout.

A process of its own, started from nothing (not forked), so that nothing the training process kept in memory
(a plugin's module global, a cached trajectory) can reach the replay.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from mechanisms.framework.integrity import Finding

REPLAY_TIMEOUT_S = 600


def replay_apart(config: Mapping[str, Any], plan: Any, trace: Mapping[str, Any]) -> Finding:
    """The replay's finding from a fresh Python process (a replay that cannot run is a failed finding)."""
    payload = pickle.dumps((list(sys.path), dict(config), plan, dict(trace)))
    # this process's import path, privbench's folders included (a Ray worker has them from its runtime_env,
    # not from the environment), so `-m workers.replay_process` resolves in the child as here
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        done = subprocess.run([sys.executable, "-m", "workers.replay_process"], input=payload, capture_output=True,
                              timeout=REPLAY_TIMEOUT_S, check=False, env=env)
    except subprocess.TimeoutExpired:
        return Finding("state_replay", False, f"the replay did not finish in {REPLAY_TIMEOUT_S} s")
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        return Finding("state_replay", False, f"the replay could not run: {tail[0]}")
    return pickle.loads(done.stdout)
