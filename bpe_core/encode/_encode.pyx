# cython: language_level=3
"""The encoder core: special tokens, pre-tokenization and merging of a whole text in one native call.

Semantics (equivalent to ``reference.encode``): special tokens are found first, left to right,
longest match first; the text between them is pre-tokenized (the native scanners of
``_pretok.pxd``, byte-identical to ``regex``); each pretoken is merged by rank
(``reference.encode_pretoken``): a pretoken starts as its bytes, one token each; repeatedly, the
pair with the lowest merge rank present is merged at all of its occurrences, greedily left to right
without overlap (``aaa`` with ``(a, a)`` gives ``[aa, a]``); stop when no adjacent pair is a merge.
Token ids are canonical by bytes (``reference.token_ids``: the smallest id holding the bytes), so a
pair of ids names a pair of byte strings and ``RankTable`` can key on ids.

Why "all occurrences, then the next rank", and ranks only ever rising: this is the reference's
replay (``reference.encode_pretoken``: every merge in rank order, once, to the whole pretoken, as
training rewrote its words). It differs from "lowest rank present, repeat" (tiktoken, GPT-2's
``encoder.py``) only when a merge creates a pair whose rank is *lower* than the merge being
applied, which happens when two merges build the same bytes (``(a, bc)`` and ``(ab, c)``): the
replay has passed that rank, so such a pair merges only at a later rank of the same pair (the
same pair merged again, ``RankTable.rank_after``), or never. Vocabularies without two paths to a
token (GPT-2's, cl100k) give the same ids either way.

Two merge paths, the same result (tests run both on the same input):

- ``_merge_scan`` (pieces up to ``SHORT_PIECE`` bytes): find the lowest rank by a linear scan,
  rewrite the piece in one pass, look up only the pairs that touch a merged token. O(n) a merge.
- ``_merge_heap`` (longer pieces): tokens in a doubly linked list over byte positions; a min-heap
  of ``(rank << 32) | position`` entries. An entry is valid while ``pair_ranks[position]`` still
  equals its rank (a dead position has ``NO_RANK``); stale entries are skipped on pop (invalidate,
  don't delete, as tiktoken's ``_byte_pair_merge_large``). Within one rank, entries pop in position
  order, which is the left-to-right rewrite. O(n log n): ``b"a" * 100_000`` takes milliseconds.

Where the time goes, and what the layout does about it (``docs/encoding.md`` has the figures): a
corpus is mostly a few hundred thousand distinct pretokens, so nearly every pretoken is a cache hit
and the cost is memory latency, not merging. The cache is open addressing over 32-byte slots (two
per cache line) that hold the pretoken's first 8 bytes, its length, and up to 4 ids inline; only a
pretoken longer than 8 bytes or with more than 4 ids has a record in an arena (its ids, then its
bytes after the first 8). So a hit on a short pretoken reads one slot and nothing else. The
lookups are pipelined by blocks of ``BLOCK`` pretokens: the next block is hashed and its slots
prefetched (``hash_block``, a C loop of its own), then the current one is probed (``probe_block``,
another C loop, over what the hashing wrote of each piece), so the cache misses overlap. Pre-tokenization writes
the ends of up to ``ENDS_CAP`` pretokens into a scratch buffer that stays in L1, and
``encode_text`` does a whole text (special tokens, scanning, merging) without the GIL and without
a Python object per document or per pretoken.

The cache is cleared whole when it holds ``max_entries`` pretokens or its arena outgrows
``ARENA_MAX``, so memory stays bounded (at most ~16 MiB of slots plus the arena). An ``Encoder`` is
not thread-safe (it owns the cache and scratch buffers); ``Tokenizer`` keeps one per thread.
"""
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.exc cimport PyErr_Clear
from cpython.ref cimport PyObject
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.math cimport pow
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memchr, memcmp, memcpy, memmove, memset
from libcpp.algorithm cimport pop_heap, push_heap
from libcpp.algorithm cimport sort as cpp_sort
from libcpp.utility cimport pair as cpp_pair
from libcpp.vector cimport vector

cimport cython

import numpy as np

from bpe_core.pretok._pretok cimport _split_ends
from bpe_core.engine._typedefs cimport pack_pair, pair_key_t, token_id_t
from bpe_core.engine._units cimport RankEntry, RankMerger


# The parts of this module, in order (``include``: one compiled module, every cdef function inlined
# as before; each part's first lines say its job):
include "_encode_layout.pxi"         # C helpers, cache slot and record layouts, constants
include "_encode_cache.pxi"          # hashing; the cache's slot probe
include "_encode_ranks.pxi"          # RankTable: pair of ids -> merge rank
include "_encode_specials.pxi"       # SpecialTable: special tokens, longest match
include "_encode_encoder.pxi"        # Encoder: merge paths, cache hits and misses, whole-text encoding
include "_encode_encoder_cache.pxi"  # the Encoder's cache: slots, insert, grow, shared insert, absorb, copy
include "_encode_outputs.pxi"        # the hand-over of an encoder's ids: arrays, counted corpus chunks
include "_encode_batch.pxi"          # single tokens; BatchJob: a batch worker's share
include "_encode_stage2_table.pxi"   # SuperBPE stage 2: character flags, Stage2Table
include "_encode_stage2.pxi"         # SuperBPE stage 2: cross-pretoken merging
include "_encode_utf8.pxi"           # the UTF-8 of a str; bytes the ids stand for
include "_encode_tokens.pxi"         # TokenTable: decoding, Python lists of ids
