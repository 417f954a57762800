"""Multi-pretoken units (SuperBPE stage 2, SupraTok): the public face of the ``_units`` kernels.

- ``WordIndex``: pretoken bytes -> row of a word table;
- ``chunk_unit_stream``: the units of a chunk as runs of word ids (or their stage-1 tokens), in text order
  (what SuperBPE's stage 2 uses); ``id_unit_stream``: the same from the text's word ids (recorded
  when it was counted) instead of its bytes; ``record_rows``: a recorded chunk's pretokens as rows of
  the word table, cut into its spans; ``find_rows``: a recorded chunk's own words as rows of the word
  table (a walk through both sorted tables);
- ``expand_units``: word-id units -> stage-1 token units; ``strip_marks``: the encoded marks taken off;
- ``RankMerger``: merges id sequences in rank order (the stage-1 encoder of units);
- ``unit_sums``: per-unit sums of a per-token value (the encoded-data test); ``units_in_encoded_regions``:
  SupraTok's encoded-unit test on word ids;
- ``pair_levels``, ``pair_sketch``, ``cut_pieces``: SuperBPE stage 2's pieces (units cut where no merge
  can cross; the exact count of each window's pair, or a sketch's bound of it); the ``_parts`` forms
  take the units in two arrays (one thread each); ``unit_halves``: units cut in the two halves
  ``cut_pieces(threads=2)`` and ``pair_sketch(threads=2)`` take;
- ``hash_ids``: the deterministic hash a unit sample is drawn with.
"""
from ._units import (CUT_LONG_PIECE, ENCODED_MARK, RankMerger, UnitCounter, WordIndex, chunk_unit_stream, cut_pieces,
                     units_in_encoded_regions,
                     SKETCH_MAX, cut_pieces_parts, expand_units, hash_ids, id_unit_stream, pair_levels,
                     pair_counts, pair_sketch, pair_sketch_parts, record_rows, find_rows, sketch_bounds, strip_marks, unit_halves,
                     unit_sums)

__all__ = ["CUT_LONG_PIECE", "ENCODED_MARK", "SKETCH_MAX", "RankMerger", "UnitCounter", "WordIndex", "chunk_unit_stream", "cut_pieces",
           "cut_pieces_parts", "expand_units", "find_rows", "hash_ids", "id_unit_stream", "pair_counts", "pair_levels",
           "pair_sketch",
           "pair_sketch_parts", "record_rows", "sketch_bounds", "strip_marks", "unit_sums",
           "unit_halves", "units_in_encoded_regions"]
