# _pretok.pyx, part 6 of 11 (``include``d: compiled into the module as if written there).
# Counting, part three: record mode, the entry number of every pretoken in text order.

# ---- Record mode: also the entry number of every pretoken, in text order ----


cdef struct IdBuf:  # a growable uint32 array (libc memory)
    uint32_t* data
    Py_ssize_t n
    Py_ssize_t cap


cdef int _ids_reserve(IdBuf* rec, Py_ssize_t more) noexcept nogil:
    """Room for ``more`` further ids (capacity doubles); 0, or -1 when out of memory."""
    cdef Py_ssize_t cap = rec.cap
    cdef uint32_t* data
    if rec.n + more <= cap:
        return 0
    if cap < (1 << 16):
        cap = 1 << 16
    while cap < rec.n + more:
        cap *= 2
    data = <uint32_t*>realloc(rec.data, cap * sizeof(uint32_t))
    if data == NULL:
        return -1
    rec.data = data
    rec.cap = cap
    return 0


cdef inline Py_ssize_t _table_add_id(CountTable* t, const Pending* q) noexcept nogil:
    """``_table_add(t, q, 1)`` that returns the word's entry number (or -1 when out of memory).

    A twin rather than a change to ``_table_add``: the plain count's code stays as it was.
    """
    cdef uint64_t tag = q.h & 0xFFFFFFFF00000000ULL, slot
    cdef Py_ssize_t idx = q.h & t.mask, length = q.length, i
    cdef Entry* e
    while True:
        slot = t.slots[idx]
        if slot == 0:
            break
        if (slot & 0xFFFFFFFF00000000ULL) == tag:
            i = <Py_ssize_t>(slot & 0xFFFFFFFFULL) - 1
            e = &t.entries[i]
            if (e.w0 == q.w0 and e.w1 == q.w1 and e.length == length
                    and (length <= 16 or memcmp(e.ptr + 16, q.ptr + 16, length - 16) == 0)):
                e.count += 1
                return i
        idx = (idx + 1) & t.mask
    if t.n_entries >= t.cap_entries:  # keep the slots at most half full
        if t.n_entries >= <Py_ssize_t>0xFFFFFFFFLL or _table_grow(t) != 0:
            return -1
        return _table_add_id(t, q)
    e = &t.entries[t.n_entries]
    e.w0 = q.w0
    e.w1 = q.w1
    e.ptr = q.ptr
    e.length = length
    e.count = 1
    t.n_entries += 1
    t.slots[idx] = tag | <uint64_t>t.n_entries
    return t.n_entries - 1


cdef inline void _front_take(FrontSlot* f, CountTable* t, uint64_t w0, uint64_t w1, Py_ssize_t length,
                             Py_ssize_t e) noexcept nogil:
    """Word ``e`` of ``t`` (its key ``w0``, ``w1``: ``_count_front.h``) takes front slot ``f``: the
    counts the word it evicts saw while there go to that word's entry first."""
    if f.pending != 0:
        t.entries[f.idx].count += f.pending
    f.w0 = w0
    f.w1 = w1
    f.length = <uint32_t>length
    f.idx = <uint32_t>e
    f.pending = 0


cdef void _front_drain_rec(WordCounter* c, CountTable* t) noexcept nogil:
    """Every front slot's pending counts into its entry of ``t`` (record mode's front slots name
    entries of the table, not short slots); the front cache emptied."""
    cdef Py_ssize_t k
    cdef FrontSlot* f
    for k in range(<Py_ssize_t>c.front_mask + 1):
        f = &c.front[k]
        if f.pending != 0:
            t.entries[f.idx].count += f.pending
    memset(c.front, 0, (c.front_mask + 1) * sizeof(FrontSlot))


cdef int _count_span_rec(int pattern_id, const uint8_t* s, Py_ssize_t i, Py_ssize_t n,
                         const uint8_t* limit, CountTable* table, WordCounter* c, IdBuf* rec) noexcept nogil:
    """Count the pretokens of s[i:n] into ``table`` and append the entry number of each, in order, to
    ``rec``, through the plain count's front cache (``c.front``; its other parts unused).

    The plain count's scan and front cache (``_key_ends``, ``bpe_front_hits``: a recent word of up
    to 15 bytes is found by its key, an increment, without hashing its bytes or reading the table),
    but a front slot names the word's *entry* in ``table`` (entries never move: the number stays
    valid when the table grows), so a hit also gives the pretoken's id. The hits of a batch are
    counted (pending) and their ids written first, from the slots as they were; then the misses,
    in order, are looked up in the table BATCH at a time (``_table_add_id``, their slots and
    entries requested ahead), each id written, and a short word takes its front slot (the evicted
    word's pending counts go to its entry). Before the table is read every pending count is added
    (``_front_drain_rec``). Counts are sums: the same table and ids as one lookup per pretoken.
    """
    cdef int64_t ends[SCAN_CAP + 64]
    cdef uint64_t heads[2 * (SCAN_CAP + 64)]
    cdef uint32_t fronts[SCAN_CAP + 64]
    cdef uint32_t misses[SCAN_CAP + 64]
    cdef Pending queue[BATCH]
    cdef Py_ssize_t j, k, m, b, got, n_misses, base, e, start = i
    cdef int64_t a
    cdef FrontSlot* front = c.front
    while i < n:
        got = _key_ends(pattern_id, s, &i, n, limit, c, ends, heads, fronts)
        if _ids_reserve(rec, got) != 0:
            return -1
        n_misses = bpe_front_hits(heads, fronts, got, <bpe_front_slot*>front, misses)
        base = rec.n
        for k in range(got):        # a miss's id is written over below
            rec.data[base + k] = front[fronts[k]].idx
        rec.n += got
        j = 0
        while j < n_misses:
            m = n_misses - j if n_misses - j < BATCH else BATCH
            for b in range(m):
                k = misses[j + b]
                a = ends[k - 1] if k > 0 else start
                _pend(&queue[b], s + a, ends[k] - a, limit, table)
            _prefetch_entries(table, queue, m)
            for b in range(m):
                e = _table_add_id(table, &queue[b])
                if e < 0:
                    return -1
                k = misses[j + b]
                rec.data[base + k] = <uint32_t>e  # < 2**32 - 1: _table_add_id refuses more entries
                if queue[b].length <= BPE_SHORT_MAX:
                    _front_take(&front[fronts[k]], table, heads[2 * k], heads[2 * k + 1], queue[b].length, e)
            j += m
        if got > 0:
            start = ends[got - 1]
    return 0
