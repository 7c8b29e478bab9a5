"""Privacy plans cached by what they depend on, in the store (`privbench_calibrations`): a sweep whose trials share
the settings of a plan made before reads it (milliseconds) instead of calibrating and accounting again (seconds).

Privacy code is safety code, so the key is everything the plan is a function of (`view`):
- the trial's plan settings (`TrialConfig.plan_key`: mechanism and options, target epsilon or sigma, delta,
  accountant, calibration, sampler, the training set (dataset, options, `max_train_examples`), batch size, epochs,
  clip, model and options, a tuned candidate's selection), from which the sampling rate and the steps follow;
- the code that computes it: a digest of privbench's mechanisms (calibration, accountants, parts, catalog) and of
  the dataset and model code that sizes the training set and the tensors, the plugins' code (`TrialConfig.code`),
  and the versions of the libraries the accountants use (dp-accounting, numpy, scipy).
A change in any of them is another key: a miss, and a new plan. And a hit is still checked where it matters: the
accelerator phase refuses a plan whose spec (training set size, tensor sizes, released statistics) is not the one
of the process it runs, as it does a plan task's.

A plan is stored pickled and read back by an unpickler that builds only privbench's, dp-accounting's, numpy's and
plain Python's types (anything else is a miss): a ledger row cannot make the driver run code. Off with
`PRIVBENCH_PLAN_CACHE=0`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import io
import json
import os
import pickle
import time
from pathlib import Path
from typing import Any

from workers.config import TrialConfig
from workers.trial import Planned

ROOT = Path(__file__).resolve().parents[1]
CODE = ("mechanisms", "workers/datasets", "workers/models", "workers/trial.py", "workers/tuning_candidates.py",
        "workers/config.py", "workers/neighbours.py")
LIBRARIES = ("dp-accounting", "numpy", "scipy")
_ALLOWED = ("mechanisms.", "workers.", "dp_accounting.", "numpy", "collections", "copyreg", "_codecs")
_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "float", "int", "complex", "bool", "str", "bytes",
             "object", "slice", "range", "getattr"}


def enabled() -> bool:
    return os.environ.get("PRIVBENCH_PLAN_CACHE", "1") != "0"


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 of the source of the code a plan is computed by (`CODE`) and of the accountants' library versions."""
    h = hashlib.sha256()
    for entry in CODE:
        path = ROOT / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(ROOT)).encode())
            h.update(f.read_bytes())
    for name in LIBRARIES:
        try:
            h.update(f"{name}=={importlib.metadata.version(name)}".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{name} absent".encode())
    return h.hexdigest()


def view(config: TrialConfig) -> dict[str, Any]:
    """What the cached plan of `config` depends on (module docstring), readable."""
    t = config.train
    return {"plan_key": config.plan_key, "mechanism": config.mechanism, "epsilon": config.epsilon,
            "sigma": config.sigma, "delta": config.delta_written, "accountant": config.accountant,
            "calibration": config.calibration, "sampler": config.sampler, "dataset": config.dataset,
            "max_train_examples": t.max_train_examples, "batch_size": t.batch_size, "epochs": t.epochs,
            "clip": t.clip, "model": config.model, "tuning": bool(config.tuning), "code": code_digest(),
            "plugins": dict(config.code)}


def key(config: TrialConfig) -> str:
    return hashlib.sha256(json.dumps(view(config), sort_keys=True, default=str).encode()).hexdigest()[:32]


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module == "builtins" and name in _BUILTINS) or module.startswith(_ALLOWED):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a type a cached plan holds")


def lookup(st: Any, config: TrialConfig) -> Planned | None:
    """The cached plan of `config` (marked `cached`, its seconds the lookup's), or None: not cached, unreadable, or
    made for another mechanism (a miss, never an error: the plan is made again)."""
    if not enabled():
        return None
    t0 = time.perf_counter()
    try:
        blob = st.calibration(key(config))
        planned = _Unpickler(io.BytesIO(blob)).load() if blob is not None else None
    except Exception:  # noqa: BLE001 - an unreadable entry is a miss
        return None
    if not isinstance(planned, Planned) or planned.plan.mechanism != config.mechanism:
        return None
    seconds = time.perf_counter() - t0
    return Planned(planned.plan, planned.spec, seconds, 0.0, planned.tuning, {"calibration_s": seconds},
                   time.time(), cached=True, findings=tuple(getattr(planned, "findings", ())))


def keep(st: Any, config: TrialConfig, planned: Planned) -> None:
    """Store a plan a plan task made (not one read from the cache)."""
    if not enabled() or planned.cached:
        return
    entry = Planned(planned.plan, planned.spec, planned.seconds, planned.calibration_s, planned.tuning,
                    findings=planned.findings)  # the neighbouring-data checks are cached with the plan
    st.add_calibration(key(config), view(config), pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL))


__all__ = ["code_digest", "enabled", "keep", "key", "lookup", "view"]
