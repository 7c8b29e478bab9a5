"""The model registry: name -> `Model` (a builder returning a `ModelBundle`, see `base.py`).

Models are found through `privbench.models` entry points, privbench's own (`catalog.py`) as well as
plugins', the first time a name is asked for; importing this package loads no torch.
"""

from workers.models.contract import (
    MODELS,
    Model,
    ModelBundle,
    build,
    describe,
    get_entry,
    model,
    names,
    option_problems,
    register,
    supports,
)

__all__ = ["MODELS", "Model", "ModelBundle", "build", "describe", "get_entry", "model", "names", "option_problems",
           "register", "supports"]
