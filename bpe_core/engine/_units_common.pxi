# _units.pyx, part 1 of 9 (``include``d: compiled into the module as if written there).
# What the unit kernels share: C declarations, hash-table memory, sizes, content hashes.


cdef extern from *:
    void __builtin_prefetch(const void* addr) noexcept nogil
    int __builtin_ctzll(unsigned long long x) noexcept nogil

cdef extern from "<sys/mman.h>" nogil:
    int madvise(void* addr, size_t length, int advice)
    int MADV_HUGEPAGE

cdef extern from "<stdlib.h>" nogil:
    int posix_memalign(void** memptr, size_t alignment, size_t size)


cdef void* _table_alloc(size_t nbytes, int fill) noexcept nogil:
    """A hash table's memory, every byte ``fill``; 2 MiB aligned and asked for as huge pages when
    large (random probes then miss the TLB far less; a hint only), NULL when out of memory."""
    cdef void* p = NULL
    if nbytes >= (<size_t>1 << 21):
        if posix_memalign(&p, <size_t>1 << 21, nbytes) != 0:
            return NULL
        madvise(p, nbytes, MADV_HUGEPAGE)
    else:
        p = malloc(nbytes if nbytes > 0 else 1)
        if p == NULL:
            return NULL
    memset(p, fill, nbytes)
    return p

cdef enum:
    BATCH = 32          # pretokens found ahead of their lookups (chunk_unit_stream)
    LONG_PIECE = 6      # cut_pieces lists pieces of this many symbols or more as they come (_PieceTable)

#: Pieces of this many symbols or more are listed by ``cut_pieces`` as they come (not looked up, so
#: one that comes again is listed again); the shorter ones are distinct.
CUT_LONG_PIECE = LONG_PIECE

cdef uint64_t FNV_OFFSET = 1469598103934665603u
cdef uint64_t FNV_PRIME = 1099511628211u


cdef inline uint64_t _mix(uint64_t h) noexcept nogil:
    h ^= h >> 33
    h *= <uint64_t>0xff51afd7ed558ccdu
    h ^= h >> 33
    h *= <uint64_t>0xc4ceb9fe1a85ec53u
    h ^= h >> 33
    return h


cdef inline uint64_t _hash_bytes(const uint8_t* p, int64_t n) noexcept nogil:
    cdef uint64_t h = FNV_OFFSET
    cdef int64_t i
    for i in range(n):
        h = (h ^ p[i]) * FNV_PRIME
    return _mix(h ^ <uint64_t>n)


ctypedef fused sym_t:
    # stage 2's units: uint32 ids, or uint16 (``id_unit_stream(narrow=True)``); the same values hash,
    # sketch and cut the same either way
    uint16_t
    uint32_t


cdef inline uint64_t _hash_ids(const sym_t* p, int64_t n) noexcept nogil:
    cdef uint64_t h = FNV_OFFSET
    cdef int64_t i
    for i in range(n):
        h = (h ^ p[i]) * FNV_PRIME
        h ^= h >> 29
    return _mix(h ^ <uint64_t>n)


def hash_ids(const uint32_t[::1] ids):
    """The 64-bit content hash ``UnitCounter`` uses for sampling (stable across runs and platforms)."""
    return _hash_ids(&ids[0] if ids.shape[0] > 0 else NULL, ids.shape[0])

