# The C API of the unit kernels (bpe_core/engine/_units.pyx) that other kernels use: RankMerger, the
# merging of a token-id sequence by rank (SuperBPE's stage-2 merges of a unit; the stage-aware
# encoder in encode/_encode.pyx calls _merge on each unit of a text without the GIL).
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libcpp.vector cimport vector

cimport cython


cdef struct RankEntry:
    int64_t rank
    int64_t pos


@cython.final
cdef class RankMerger:
    cdef vector[uint64_t] keys
    cdef vector[int64_t] ranks          # per slot: the first rank of the pair
    cdef vector[int64_t] later          # per rank: the next rank of the same pair, or -1
    cdef vector[uint32_t] res_of_rank   # per rank: the id it produces
    cdef vector[uint8_t] side           # per id: 1 a left part of some merge, 2 a right part
    cdef uint64_t mask
    cdef public int64_t n_merges

    cdef void _mark(self, uint32_t tok, uint8_t bit)
    cdef inline int64_t _rank(self, uint32_t a, uint32_t b, int64_t after, uint32_t* out) noexcept nogil
    # Merge s[0:n] in place; returns the new length (symbols compacted to the front).
    cdef int64_t _merge(self, uint32_t* s, int64_t n, vector[int64_t]& nxt, vector[int64_t]& prv,
                        vector[RankEntry]& heap) noexcept nogil
