"""The model registry: name -> builder returning a `ModelBundle` (see `base.py`)."""

from workers.models.base import ModelBundle, build, describe, get_entry, names, register, supports
from workers.models import transformers, vision  # noqa: E402,F401  (registers its builders)

__all__ = ["ModelBundle", "build", "describe", "get_entry", "names", "register", "supports"]
