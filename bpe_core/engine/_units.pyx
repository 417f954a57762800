# cython: language_level=3
"""Kernels for multi-pretoken units (SuperBPE stage 2, SupraTok): word lookup, unit counting,
expansion to token ids, and merging a token-id sequence by rank.

- ``WordIndex`` maps pretoken bytes to their row in a sorted word table (open addressing over the
  table's arena; no Python object per pretoken).
- ``UnitCounter`` counts unique sequences of uint32 ids (units) with int64 counts; a deterministic
  64-bit content hash decides membership in a sample (``keep_below``), so a sample does not depend on
  worker count or order.
- ``expand_units`` replaces every word id of a unit by the word's token ids (a CSR segmentation).
- ``RankMerger`` applies ranked merges to an id sequence: repeatedly the lowest rank present, all
  of its occurrences left to right without overlap, exactly as training rewrote its words.

Each kernel names its plain equivalent in its docstring.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy, memmove, memset
from libcpp.algorithm cimport sort
from libcpp.vector cimport vector

cimport cython

import numpy as np

from bpe_core.runtime.memmon import prefault
from bpe_core.pretok._pretok cimport (PATTERN_CL100K, PATTERN_GPT2, PATTERN_O200K, _next_cl100k, _next_gpt2,
                                      _next_o200k, lend_items, lend_u32)

# The parts of this module, in order (``include``: one compiled module, every cdef function inlined
# as before; each part's first lines say its job):
include "_units_common.pxi"     # C declarations, table memory, content hashes
include "_units_words.pxi"      # WordIndex: bytes -> word-table row
include "_units_scan.pxi"       # chunk_unit_stream: units by a scan
include "_units_record.pxi"     # id_unit_stream, record_rows; unit writer
include "_units_counter.pxi"    # UnitCounter, expand_units, strip_marks
include "_units_pairs.pxi"      # stage-2 pair counts and levels
include "_units_sketch.pxi"     # stage-2 pair sketch
include "_units_cut.pxi"        # stage-2 pieces: cut_pieces
include "_units_rank.pxi"       # RankMerger: merging by rank
