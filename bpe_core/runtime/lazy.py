"""``numpy``, imported on first use: what a small run never touches costs it nothing.

``import numpy`` is ~14 MB of RSS and ~0.1 s of CPU: more than a whole 1 MB training run needs
besides (``docs/benchmarks.md``, "Small runs"). Modules on that run's path bind ``np`` to
:data:`np` instead; the first attribute read imports numpy and copies its namespace into the
proxy, so later reads are plain instance-dict lookups. A path that never reads an attribute of
``np`` never imports numpy (``tests/training/test_small_runs.py`` checks the training path).

>>> from bpe_core.runtime.lazy import np
>>> int(np.arange(4).sum())
6
"""
from __future__ import annotations

import importlib
import sys

__all__ = ["LazyModule", "np", "numpy_loaded"]


class LazyModule:
    """A module imported on the first attribute read (its namespace is then copied in)."""

    def __init__(self, name: str) -> None:
        self.__dict__["_lazy_name"] = name

    def __getattr__(self, attr: str):
        module = importlib.import_module(self.__dict__["_lazy_name"])
        self.__dict__.update(vars(module))
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self.__dict__['_lazy_name']!r}>"


#: ``numpy``, imported when first used.
np = LazyModule("numpy")


def numpy_loaded() -> bool:
    """Whether numpy has been imported (by anyone): a value may then be an ``ndarray``."""
    return "numpy" in sys.modules
