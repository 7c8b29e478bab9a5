"""The model registry: name -> builder returning a `ModelBundle` (see `base.py`)."""

from workers.models import transformers, vision  # noqa: E402,F401  (registers its builders)
from workers.models.base import ModelBundle, build, describe, get_entry, names, option_problems, register, supports

__all__ = ["ModelBundle", "build", "describe", "get_entry", "names", "option_problems", "register", "supports"]
