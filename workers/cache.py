"""What a worker process keeps between the trials it runs: the datasets it loaded, in a small bounded LRU.

Why: Ray reuses its task workers, so the second trial a worker runs finds torch, privbench and its kernels already
imported; only the data would be read and decoded again (1.4-2.3 CPU seconds for Fashion-MNIST, for every phase of
every trial). The cache holds at most `PRIVBENCH_WORKER_CACHE` datasets (default 2; 0 turns it off), the least
recently used one dropped first, so a worker's memory stays bounded whatever the sweep. A loaded `Splits` is
shared by the trials that ask for it, as the loaders' own disk caches share files: the phases read it and build their
tensors from it, never change it in place (its arrays are not made read-only: torch warns on every tensor viewed
from a read-only array). Nothing happens at import: the cache fills on first use.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any

_DATASETS: OrderedDict[Hashable, Any] = OrderedDict()


def capacity() -> int:
    """How many datasets a worker keeps (`PRIVBENCH_WORKER_CACHE`, default 2)."""
    try:
        return max(0, int(os.environ.get("PRIVBENCH_WORKER_CACHE", "2")))
    except ValueError:
        return 2


def dataset_key(name: str, options: Mapping[str, Any]) -> str:
    return json.dumps([name, dict(options)], sort_keys=True, default=str)


def cached_dataset(name: str, options: Mapping[str, Any], load: Callable[[], Any]) -> tuple[Any, bool]:
    """The splits `load()` returns for (name, options), from the cache when there (True: it was); never during a
    neighbouring-data check, whose loads are the neighbour's."""
    from workers.datasets.contract import in_neighbour_check  # lazy: heavy (numpy)

    size = capacity()
    if size == 0 or in_neighbour_check():
        return load(), False
    key = dataset_key(name, options)
    if key in _DATASETS:
        _DATASETS.move_to_end(key)
        return _DATASETS[key], True
    splits = load()
    _DATASETS[key] = splits
    while len(_DATASETS) > size:
        _DATASETS.popitem(last=False)
    return splits, False


def clear() -> None:
    _DATASETS.clear()


__all__ = ["cached_dataset", "capacity", "clear", "dataset_key"]
