# The C API of the encoder core (bpe_core/_encode.pyx) at a glance.
#
# A RankTable maps a pair of token ids to its merge rank (open addressing over pack_pair keys) and
# a rank to the id of the token the merge builds. An Encoder owns one pretoken -> ids cache and the
# scratch buffers of one thread; it merges pretokens by rank, exactly as reference.encode_pretoken.
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libcpp.vector cimport vector

cimport cython

from bpe_core._typedefs cimport pair_key_t, token_id_t


@cython.final
cdef class RankTable:
    cdef vector[pair_key_t] slot_keys   # open addressing; EMPTY_KEY marks a free slot
    cdef vector[uint32_t] slot_ranks
    cdef vector[token_id_t] merged_ids  # rank -> id of the token the merge builds
    cdef token_id_t byte_ids[256]       # byte value -> id of its single-byte token
    cdef uint64_t slot_mask
    cdef int shift
    cdef readonly Py_ssize_t n_merges   # ranks are 0 .. n_merges - 1 (some may be unreachable)
    cdef readonly Py_ssize_t n_pairs    # pairs held (reachable merges, first rank of a pair kept)

    cdef uint32_t rank_of(self, token_id_t left, token_id_t right) noexcept nogil


@cython.final
cdef class Encoder:
    cdef readonly RankTable table
    # pretoken -> ids cache (cleared whole when full): open addressing, slot_info 0 = empty,
    # else (arena offset << 24) | (key length << 12) | n_ids; arena = uint32 ids then key bytes
    cdef vector[uint64_t] slot_hash
    cdef vector[uint64_t] slot_info
    cdef vector[uint8_t] arena
    cdef uint64_t cache_mask
    cdef Py_ssize_t n_entries
    cdef readonly Py_ssize_t max_entries
    cdef readonly Py_ssize_t max_cached_len
    cdef readonly int64_t misses
    # scratch of the heap path and the output buffer
    cdef vector[token_id_t] toks
    cdef vector[uint32_t] pair_ranks
    cdef vector[int64_t] nexts
    cdef vector[int64_t] prevs
    cdef vector[uint64_t] heap
    cdef vector[uint64_t] deferred
    cdef vector[token_id_t] out

    cdef int _merge_scan(self, const uint8_t* piece, Py_ssize_t n, vector[token_id_t]& out) except -1 nogil
    cdef int _merge_heap(self, const uint8_t* piece, Py_ssize_t n, vector[token_id_t]& out) except -1 nogil
    cdef int _encode_piece(self, const uint8_t* piece, Py_ssize_t n, vector[token_id_t]& out) except -1 nogil
    cdef void _push(self, uint32_t rank, Py_ssize_t pos, uint32_t cur) noexcept nogil
    cdef void _flush_deferred(self) noexcept nogil
    cdef int _cache_grow(self) except -1 nogil
    cdef void _cache_clear(self) noexcept nogil
