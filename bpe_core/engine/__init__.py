"""Stage 3: the merge engine over word tables (Cython: ``_engine``, ``_units``).

- ``merge``: ``MergeEngine`` (pair counts, lazy max-heap, greedy rewrite with exact deltas) and
  ``train_words``, the merge loop over a ``WordTable``;
- ``units``: multi-pretoken units for the curricula that cross pretoken boundaries.
"""
__all__ = ["MergeEngine", "train_words"]


def __getattr__(name: str):
    """``MergeEngine`` and ``train_words`` (``merge``), and the modules (``merge``, ``units``),
    imported when first used."""
    if name in __all__:
        from . import merge

        return getattr(merge, name)
    if name in ("merge", "units"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
