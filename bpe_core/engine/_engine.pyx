# cython: language_level=3
"""The BPE merge engine: pair counting, a lazy max-heap and greedy merge rewriting.

Words are a CSR table of token ids (``offsets`` int64, one int64 ``count`` per word). A merge
rewrites symbols where they stand: the right half of a merged pair is marked dead, never moved. A
pair is ``(left_id, right_id)``; the engine keeps, per pair, its count (the sum over words of count
times occurrences, every window counted: ``aaa`` holds ``(a, a)`` twice) and the list of positions
where it may occur.

**Memory layout** (``docs/memory.md``; 4 bytes of anonymous memory per position):

- one uint32 *cell* per position. Bit 31: dead (inside a merged token, not its first position);
  bit 30: the last position of its word (fixed); bits 0-29: the token id of a live position, or, in
  the first and the last cell of a token longer than one position, the token's length in positions.
  So the next live position of ``i`` is ``i + length`` and the previous one is found from the cell
  just before ``i``, both in O(1), with no link fields and no word id per position.
- the word of a position comes from a block index (the word holding every 64th position) and the
  word records (end, count), a scan of a few records.
- the pair of a window is looked up in the pair map from its two symbols (no pair id per position);
  a listed position is stale when its window no longer holds the pair's symbols.
- read-only arrays (word records, the initial per-pair position lists) live in anonymous memory, or,
  beyond ``map_threshold`` bytes, in files under ``spill_dir`` that are written sequentially and
  memory-mapped read-only (page cache, reclaimable; the files are unlinked once mapped). Everything
  that changes during the merge loop (cells, pair counts, the pair map, positions added by merges,
  the heap) is anonymous memory.

One merge step (``_apply_merge``) visits only the positions listed for the winning pair (in position
order when both halves are the same token, so that within a word it merges greedily left to right
without overlap: ``aaa`` -> ``[aa, a]``); a listed position that no longer holds the pair is skipped.
Each merge at position ``i`` (left neighbour ``h``, right neighbour ``k`` of the pair) applies exact
count deltas: ``-(h, a) -(a, b) -(b, k) +(h, t) +(t, k)``. Consecutive sites in one word see the
previous site's new token as their neighbour, so the result equals a full recount
(``reference.get_pair_counts``) after every step. The cost of a step is proportional to the pair's
occurrences, not to the length of the words holding it, so words may be long (SuperBPE stage-2
units, training without pre-tokenization).

A position enters a pair's list only when its window becomes that pair, and a window never returns
to a pair it left (each change makes the window's bytes longer), so no position is listed twice for
one pair. A list that is full drops its stale entries, and grows only when it is still more than half full.

The heap is lazy: an entry ``(count, pair)`` is pushed whenever a pair's count rises, and never
updated in place. Invariant: every live pair has an entry whose count is >= its current count. On pop,
an entry whose count equals the current count is the true maximum; a stale entry (count went down)
is pushed back with the current count, so a pair whose count fell can still win later (the stale-heap
bug of ``shared/papers/superbpe_reimplementation_notes.txt`` cannot happen).

Ties: the highest count wins; among equal counts, the greatest ``(left_bytes, right_bytes)`` tuple,
left compared first, then right, both as Python compares bytes. With ``tie_break="hf"`` (chosen at
construction; the comparator looks at it only when two counts are equal) the smallest pair of HF
``tokenizers`` ranks wins instead (``hf_byte_rank`` for bytes, then ids in the order tokens are made).

Symbols are canonical by bytes: when a merge builds bytes that an existing token already has (e.g.
``(a, bc)`` after ``(ab, c)``), the words get the existing id, exactly as a trainer that keys pairs
by bytes (``reference.py``) would see it. The merge still counts as one vocabulary entry.

Equivalent to ``reference.train_on_counts`` (tested on random and adversarial input, with the
read-only arrays in RAM and in mapped files).
"""
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int8_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.math cimport sqrt
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy, memmove, memset
from libcpp.algorithm cimport inplace_merge, is_sorted, sort
from libcpp.vector cimport vector

import array as _array
import gc as _gc
import os
import time as _time

from cpython cimport array

from bpe_core.runtime.lazy import np  # numpy on first use (a small run never imports it)

# Templates of the ``array.array`` memory of an engine built from ``array.array`` symbols (a small
# run: no numpy imported): uint8, uint32.
cdef array.array _U8 = _array.array("B")
cdef array.array _U32 = _array.array("I")

from bpe_core.runtime.memmon import prefault
from bpe_core.runtime.atomic import new_temp_file
from bpe_core.runtime.writeback import WriteBehind
from bpe_core.engine._typedefs cimport (count_t, pack_pair, pair_id_t, pair_key_t, pair_left, pair_right,
                                 token_id_t, word_id_t)

# The parts of this module, in order (``include``: one compiled module, every cdef function inlined
# as before; each part's first lines say its job):
include "_engine_layout.pxi"    # cell bits, records, C declarations, huge pages
include "_engine_pairmap.pxi"   # _PairMap: pair -> pair id
include "_engine_spill.pxi"     # _SpillMap: read-only arrays in mapped files
include "_engine_threads.pxi"   # a thread's share of a merge; thread entries
include "_engine_merge.pxi"     # MergeEngine: build, heap, merge steps
include "_engine_pool.pxi"      # the list pool's pages given back (_pool_compact)
