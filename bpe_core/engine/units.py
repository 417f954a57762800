"""Multi-pretoken units (SuperBPE stage 2, SupraTok): the public face of the ``_units`` kernels.

- ``WordIndex``: pretoken bytes -> row of a word table;
- ``count_chunk_units``: the units of a chunk as runs of word ids, counted into a ``UnitCounter``;
- ``expand_units``: word-id units -> stage-1 token units;
- ``RankMerger``: merges id sequences in rank order (the stage-1 encoder of units);
- ``hash_ids``: the deterministic hash a unit sample is drawn with.
"""
from ._units import ENCODED_MARK, RankMerger, UnitCounter, WordIndex, count_chunk_units, expand_units, hash_ids

__all__ = ["ENCODED_MARK", "RankMerger", "UnitCounter", "WordIndex", "count_chunk_units", "expand_units", "hash_ids"]
