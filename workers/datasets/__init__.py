"""The dataset registry: name -> `Dataset` (a loader returning deterministic `Splits`, see `base.py`).

Datasets are found through `privbench.datasets` entry points, privbench's own as well as plugins', the
first time a name is asked for; importing this package loads nothing else. `hf:<name>[:<config>]` is
served by the Hugging Face dataset (a prefix entry).
"""

from workers.datasets.contract import (
    DATASETS,
    Dataset,
    PublicSplits,
    Splits,
    dataset,
    describe,
    get_loader,
    load,
    names,
    option_problems,
    register,
    unit_count,
)

__all__ = ["DATASETS", "Dataset", "PublicSplits", "Splits", "dataset", "describe", "get_loader", "load", "names",
           "option_problems", "register", "unit_count"]
