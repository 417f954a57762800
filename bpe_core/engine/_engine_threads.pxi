# _engine.pyx, part 4 of 6 (``include``d: compiled into the module as if written there).
# Each thread's share of a merge (NearTable: the neighbour pairs a merge touches) and the entry points of the
# second thread (merges, and the halves of the build).

# ==== A share of a merge ======================================================================

cdef void _share_begin(NearTable* nt) noexcept nogil:
    nt.near.clear()
    nt.sites.clear()
    nt.removed = 0
    nt.oused.clear()
    if nt.slot.size() == 0:
        nt.slot.assign(1024, 0)
        nt.stamp.assign(1024, 0)
        nt.gen = 0
    if nt.ostamp.size() == 0:
        nt.opid.assign(OTHER_SLOTS, 0)
        nt.odelta.assign(OTHER_SLOTS, 0)
        nt.ostamp.assign(OTHER_SLOTS, 0)
        nt.oused.reserve(OTHER_SLOTS // 2)
        nt.stamp.assign(nt.stamp.size(), 0)
        nt.gen = 0
    nt.gen += 1
    if nt.gen == 0:                          # the stamps wrapped: clear them once
        nt.stamp.assign(nt.stamp.size(), 0)
        nt.ostamp.assign(OTHER_SLOTS, 0)
        nt.gen = 1


cdef void _share_reserve(NearTable* nt, uint64_t n_sites, uint64_t n_tokens) noexcept nogil:
    """Room, made by the calling thread, for a share of ``n_sites`` listed sites of a merge whose new
    token is one of ``n_tokens``: the share then never allocates while it runs (the second thread
    never calls malloc, so glibc gives it no arena of its own: an arena's freed room is not given
    back to the OS nor to the main thread, ~64-96 MiB at 15 GB; what it used is this thread's heap,
    reused by the next merge's shares). A site adds at most 2 windows (``sites``) and meets at most
    4 pairs holding the new token (``near``), and there are at most ``2 n_tokens`` of those (``(x, t)``
    and ``(t, y)``); the hash table doubles while it is more than half full, from 1024 slots
    (``_near_index``), so it never holds more than the smallest power of two >= ``2 len(near)``."""
    cdef uint64_t n_near = 4 * n_sites
    cdef uint64_t n_slot = 1024
    if n_near > 2 * n_tokens + 2:
        n_near = 2 * n_tokens + 2
    while n_slot < 2 * n_near:
        n_slot *= 2
    if nt.sites.capacity() < 2 * n_sites:
        nt.sites.reserve(2 * n_sites)
    if nt.near.capacity() < n_near:
        nt.near.reserve(n_near)
    if nt.slot.capacity() < n_slot:
        nt.slot.reserve(n_slot)
    if nt.stamp.capacity() < n_slot:
        nt.stamp.reserve(n_slot)


cdef uint64_t _share_bytes(NearTable* nt) noexcept nogil:
    """The memory a share holds (its vectors keep their room from merge to merge)."""
    return (nt.near.capacity() * sizeof(Near) + nt.slot.capacity() * 4 + nt.stamp.capacity() * 4
            + nt.sites.capacity() * 8 + nt.remap.capacity() * 4
            + nt.opid.capacity() * 4 + nt.odelta.capacity() * sizeof(count_t) + nt.ostamp.capacity() * 4
            + nt.oused.capacity() * 4)


cdef inline uint64_t _near_hash(pair_key_t key, uint64_t mask) noexcept nogil:
    return ((key * <uint64_t>0x9E3779B97F4A7C15u) >> 32) & mask


cdef void _near_grow(NearTable* nt) noexcept nogil:
    cdef uint64_t n = nt.slot.size() * 2, mask = n - 1, h
    cdef size_t q
    nt.slot.assign(n, 0)
    nt.stamp.assign(n, 0)
    for q in range(nt.near.size()):
        h = _near_hash(nt.near[q].key, mask)
        while nt.stamp[h] == nt.gen:
            h = (h + 1) & mask
        nt.slot[h] = <uint32_t>q
        nt.stamp[h] = nt.gen


cdef inline uint32_t _near_index(NearTable* nt, pair_key_t key) noexcept nogil:
    """The index in ``nt.near`` of a pair holding the new token (added, delta 0, when new)."""
    cdef uint64_t mask = nt.slot.size() - 1
    cdef uint64_t h = _near_hash(key, mask)
    cdef uint32_t idx
    cdef Near e
    while nt.stamp[h] == nt.gen:
        idx = nt.slot[h]
        if nt.near[idx].key == key:
            return idx
        h = (h + 1) & mask
    idx = <uint32_t>nt.near.size()
    e.key = key
    e.delta = 0
    e.pid = -1
    e.n = 0
    e.at = 0
    nt.near.push_back(e)
    nt.slot[h] = idx
    nt.stamp[h] = nt.gen
    if 2 * nt.near.size() > nt.slot.size():
        _near_grow(nt)
    return idx


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS tells it; else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


cdef void* _worker_main(void* arg) noexcept nogil:
    (<MergeEngine>arg)._worker_loop()
    return NULL


cdef struct HalvesJob:
    # one thread's half of a build buffer (the cells, the mapped position lists, the mapped word
    # records): ``dst[lo:hi]`` faulted in (stage 0), or copied from the byte symbols ``src`` (stage 1);
    # or (stage 2) ``recs[lo:hi]`` faulted in and written from ``counts`` and ``offsets``
    uint32_t* dst
    const uint8_t* src
    WordRec* recs
    const int64_t* counts
    const int64_t* offsets
    int64_t lo
    int64_t hi
    int stage


cdef void _halves_part(HalvesJob* c) noexcept nogil:
    cdef int64_t i
    if c.stage == 0:
        _populate(c.dst + c.lo, (c.hi - c.lo) * sizeof(uint32_t))
    elif c.stage == 1:
        for i in range(c.lo, c.hi):
            c.dst[i] = c.src[i]
    else:
        _populate(<void*>(c.recs + c.lo), (c.hi - c.lo) * sizeof(WordRec))
        for i in range(c.lo, c.hi):
            c.recs[i].count = c.counts[i]
            c.recs[i].end = <uint32_t>c.offsets[i + 1]


cdef void* _halves_main(void* arg) noexcept nogil:
    _halves_part(<HalvesJob*>arg)
    return NULL


cdef void _halves_two(uint32_t* dst, const uint8_t* src, int64_t n, int stage) noexcept nogil:
    """``_halves_part`` of ``dst[:n]``: the first half here, the second on a native thread (here too,
    after the first, when no thread starts). The pages or the values written are one thread's."""
    cdef HalvesJob first, second
    first.dst = second.dst = dst
    first.src = second.src = src
    first.stage = second.stage = stage
    first.lo = 0
    first.hi = second.lo = (n // 2) & ~(<int64_t>1023)     # (a page of cells, 4 KiB, whole on one side)
    second.hi = n
    _halves_run(&first, &second)


cdef void _records_two(WordRec* recs, const int64_t* counts, const int64_t* offsets, int64_t lo,
                       int64_t hi) noexcept nogil:
    """The word records ``recs[lo:hi]`` (stage 2 of ``_halves_part``) on two threads, as ``_halves_two``."""
    cdef HalvesJob first, second
    first.recs = second.recs = recs
    first.counts = second.counts = counts
    first.offsets = second.offsets = offsets
    first.stage = second.stage = 2
    first.lo = lo
    first.hi = second.lo = lo + (((hi - lo) // 2) & ~(<int64_t>1023))   # (1,024 records: 3 pages)
    second.hi = hi
    _halves_run(&first, &second)


cdef void _halves_run(HalvesJob* first, HalvesJob* second) noexcept nogil:
    cdef pthread_t t
    cdef bint started = bpe_thread_start(&t, <bpe_thread_fn>_halves_main, <void*>second) == 0
    _halves_part(first)
    if started:
        pthread_join(t, NULL)
    else:
        _halves_part(second)


cdef struct HalfCount:
    # The second thread's half of the build (``MergeEngine._count_half`` then ``_fill_half``): its
    # words, where its windows' pair ids go, and its pairs counted on their own (local ids, in the
    # order first seen), joined to the engine's afterwards
    void* engine
    int64_t w_lo
    int64_t w_hi
    pair_id_t* win_pid
    int64_t n_win
    void* local_map                      # a _PairMap
    vector[pair_key_t]* keys
    vector[count_t]* counts
    vector[uint64_t]* lens
    # the fill: local id -> pair id, and where this half's part of each pair's list starts
    const pair_id_t* remap
    const uint64_t* first
    uint32_t* buf
    vector[uint64_t]* fill
    # (symbols all bytes: ``_count_bytes``) this half's count, windows and first window by byte pair
    count_t* bcnt
    uint64_t* blens
    int64_t* bfirst
    int stage                            # 0: count, 1: fill, 2: a pass of the mapped fill (pairs lo:hi),
                                         # 3: the count by byte pair
    uint32_t lo
    uint32_t hi


cdef void* _half_main(void* arg) noexcept nogil:
    cdef HalfCount* h = <HalfCount*>arg
    if h.stage == 0:
        (<MergeEngine>h.engine)._count_half(h)
    elif h.stage == 1:
        (<MergeEngine>h.engine)._fill_half(h)
    elif h.stage == 3:
        (<MergeEngine>h.engine)._count_bytes(h.w_lo, h.w_hi, h.bcnt, h.blens, h.bfirst)
    else:
        (<MergeEngine>h.engine)._fill_pass_half(h)
    return NULL

