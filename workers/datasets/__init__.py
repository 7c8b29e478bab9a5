"""The dataset registry: name -> loader returning deterministic `Splits` (see `base.py`).

Loaders register themselves with `@register(...)`; this package imports every loader module, so
import order never matters. `hf:<name>[:<config>]` is resolved by the Hugging Face loader.
"""

from workers.datasets import hf, images, mnist5k, text  # noqa: E402,F401  (registers its loaders)
from workers.datasets.base import Splits, describe, get_loader, load, names, option_problems, register

__all__ = ["Splits", "describe", "get_loader", "load", "names", "option_problems", "register"]
