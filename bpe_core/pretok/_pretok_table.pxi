# _pretok.pyx, part 4 of 11 (``include``d: compiled into the module as if written there).
# Counting, part one: the head words and hash of a pretoken, and the count table (init, grow, add,
# batched flush).

# ==== Counting =====================================================================================


cdef enum:
    SCAN_CAP = 128  # pretoken ends the counters scan ahead of hashing them (1 KiB: stays in L1)


cdef uint64_t _HEAD_MASKS[17][2]  # [min(length, 16)] -> the masks of the two head words
cdef int _k
for _k in range(17):
    _HEAD_MASKS[_k][0] = 0xFFFFFFFFFFFFFFFFULL if _k >= 8 else (<uint64_t>1 << (8 * _k)) - 1
    _HEAD_MASKS[_k][1] = (0xFFFFFFFFFFFFFFFFULL if _k >= 16
                          else ((<uint64_t>1 << (8 * (_k - 8))) - 1 if _k > 8 else 0))


cdef inline void _head16(const uint8_t* p, Py_ssize_t length, const uint8_t* limit,
                         uint64_t* w0, uint64_t* w1) noexcept nogil:
    """The first 16 bytes of p[0:length], zero-padded, as two little-endian words.

    Reads 16 bytes at once when they lie before ``limit`` (the end of the whole buffer), then
    masks them with a table lookup rather than branches on the length.
    """
    cdef uint8_t tmp[16]
    cdef uint64_t a, b
    cdef Py_ssize_t k
    if p + 16 <= limit:
        a = bpe_load_le64(p)
        b = bpe_load_le64(p + 8)
    else:
        for k in range(16):
            tmp[k] = p[k] if k < length else 0
        a = bpe_load_le64(tmp)
        b = bpe_load_le64(tmp + 8)
    k = length if length < 16 else 16
    a &= _HEAD_MASKS[k][0]
    b &= _HEAD_MASKS[k][1]
    w0[0] = a
    w1[0] = b


cdef inline uint64_t _hash(uint64_t w0, uint64_t w1, const uint8_t* p,
                           Py_ssize_t length) noexcept nogil:
    """64-bit hash of a word from its head words (and, past 16 bytes, the rest of p)."""
    cdef uint64_t h = (w0 * 0x9E3779B97F4A7C15ULL) ^ ((w1 + <uint64_t>length) * 0xC2B2AE3D27D4EB4FULL)
    cdef Py_ssize_t i = 16
    cdef uint8_t tmp[8]
    cdef Py_ssize_t k
    while i < length:
        if i + 8 <= length:
            h = (h ^ bpe_load_le64(p + i)) * 0xBF58476D1CE4E5B9ULL
        else:
            for k in range(8):
                tmp[k] = p[i + k] if i + k < length else 0
            h = (h ^ bpe_load_le64(tmp)) * 0xBF58476D1CE4E5B9ULL
        h ^= h >> 31
        i += 8
    h ^= h >> 32
    h *= 0xD6E8FEB86659FD93ULL
    h ^= h >> 32
    return h


cdef int _table_init(CountTable* t, Py_ssize_t capacity) noexcept nogil:
    t.slots = <uint64_t*>bpe_table_alloc(capacity * sizeof(uint64_t))
    t.mask = capacity - 1
    t.cap_entries = capacity // 2
    # the entries are written as words come and never read past ``n_entries``: plain ``malloc``, so
    # a page is touched only when a word reaches it (no zeroing, no huge page asked for), and the
    # table grows by ``realloc`` (a large block is moved by remapping, not copied): SuperBPE's record
    # counts each chunk in a fresh table of its own, which zeroed and copied ~8 MB a 7.5 MB chunk
    t.entries = <Entry*>malloc(t.cap_entries * sizeof(Entry))
    t.n_entries = 0
    return 0 if (t.slots != NULL and t.entries != NULL) else -1


cdef void _table_free(CountTable* t) noexcept nogil:
    free(t.slots)
    free(t.entries)
    t.slots = NULL
    t.entries = NULL


cdef int _table_grow(CountTable* t) noexcept nogil:
    """Double the capacity: a new slot array, the entries array extended (``realloc``: the
    entries stay where their numbers say, only their block may move)."""
    cdef Py_ssize_t cap = (t.mask + 1) * 2, i, idx
    cdef uint64_t h
    cdef uint64_t* slots = <uint64_t*>bpe_table_alloc(cap * sizeof(uint64_t))
    cdef Entry* entries
    if slots == NULL:
        return -1
    entries = <Entry*>realloc(t.entries, (cap // 2) * sizeof(Entry))
    if entries == NULL:         # (t.entries is still the table's, freed with it)
        free(slots)
        return -1
    for i in range(t.n_entries):
        h = _hash(entries[i].w0, entries[i].w1, entries[i].ptr, entries[i].length)
        idx = h & (cap - 1)
        while slots[idx] != 0:
            idx = (idx + 1) & (cap - 1)
        slots[idx] = (h & 0xFFFFFFFF00000000ULL) | <uint64_t>(i + 1)
    free(t.slots)
    t.slots = slots
    t.entries = entries
    t.mask = cap - 1
    t.cap_entries = cap // 2
    return 0


cdef inline void _pend(Pending* q, const uint8_t* p, Py_ssize_t length, const uint8_t* limit,
                       CountTable* t) noexcept nogil:
    """Record a scanned pretoken with its hash, and start loading its first probe slot."""
    q.ptr = p
    q.length = length
    _head16(p, length, limit, &q.w0, &q.w1)
    q.h = _hash(q.w0, q.w1, p, length)
    bpe_prefetch(&t.slots[q.h & t.mask])


cdef inline int _table_add(CountTable* t, const Pending* q, int64_t count) noexcept nogil:
    """Add count to the entry of the word q, inserting it if new; 0, or -1 when out of memory.

    A slot is 8 bytes (hash tag, entry number), so the probe array stays small; entries are
    dense in first-seen order, so the frequent words, seen early, share cache lines; each keeps
    its first 16 bytes inline, and only words longer than that compare the rest in the buffer.
    """
    cdef uint64_t tag = q.h & 0xFFFFFFFF00000000ULL, slot
    cdef Py_ssize_t idx = q.h & t.mask, length = q.length
    cdef Entry* e
    while True:
        slot = t.slots[idx]
        if slot == 0:
            break
        if (slot & 0xFFFFFFFF00000000ULL) == tag:
            e = &t.entries[(slot & 0xFFFFFFFFULL) - 1]
            if (e.w0 == q.w0 and e.w1 == q.w1 and e.length == length
                    and (length <= 16 or memcmp(e.ptr + 16, q.ptr + 16, length - 16) == 0)):
                e.count += count
                return 0
        idx = (idx + 1) & t.mask
    if t.n_entries >= t.cap_entries:  # keep the slots at most half full
        if t.n_entries >= <Py_ssize_t>0xFFFFFFFFLL or _table_grow(t) != 0:
            return -1
        return _table_add(t, q, count)
    e = &t.entries[t.n_entries]
    e.w0 = q.w0
    e.w1 = q.w1
    e.ptr = q.ptr
    e.length = length
    e.count = count
    t.n_entries += 1
    t.slots[idx] = tag | <uint64_t>t.n_entries
    return 0


cdef inline void _prefetch_entries(const CountTable* t, const Pending* queue,
                                   Py_ssize_t n_pending) noexcept nogil:
    """Request the entries a batch of pending pretokens will look up (their slots were requested
    when they were scanned), so that the batch's cache misses overlap (the three ``_flush``)."""
    cdef Py_ssize_t k
    cdef uint64_t slot
    for k in range(n_pending):
        slot = t.slots[queue[k].h & t.mask]
        if slot != 0:
            bpe_prefetch(&t.entries[(slot & 0xFFFFFFFFULL) - 1])


cdef int _flush(CountTable* t, const Pending* queue, Py_ssize_t n_pending) noexcept nogil:
    """Count a batch of pending pretokens.

    The slots were requested when the pretokens were scanned; the entries they name are requested
    now, all at once, and only then are the lookups done: the cache misses of a batch overlap
    instead of stalling one after another (the table outgrows the caches on real corpora).
    """
    cdef Py_ssize_t k
    _prefetch_entries(t, queue, n_pending)
    for k in range(n_pending):
        if _table_add(t, &queue[k], 1) != 0:
            return -1
    return 0
