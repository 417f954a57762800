"""Stage 3: the merge engine over word tables (Cython: ``_engine``, ``_units``).

- ``merge``: ``MergeEngine`` (pair counts, lazy max-heap, greedy rewrite with exact deltas) and
  ``train_words``, the merge loop over a ``WordTable``;
- ``units``: multi-pretoken units for the curricula that cross pretoken boundaries.
"""
from .merge import MergeEngine, train_words

__all__ = ["MergeEngine", "train_words"]
