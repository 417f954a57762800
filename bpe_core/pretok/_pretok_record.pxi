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


cdef int _flush_rec(CountTable* t, const Pending* queue, Py_ssize_t n_pending,
                    IdBuf* rec) noexcept nogil:
    """``_flush``, appending each pretoken's entry number to rec (room for the batch: the caller)."""
    cdef Py_ssize_t k, e
    _prefetch_entries(t, queue, n_pending)
    for k in range(n_pending):
        e = _table_add_id(t, &queue[k])
        if e < 0:
            return -1
        rec.data[rec.n] = <uint32_t>e  # < 2**32 - 1: _table_add refuses more entries
        rec.n += 1
    return 0


cdef int _count_span_rec(int pattern_id, const uint8_t* s, Py_ssize_t i, Py_ssize_t n,
                         const uint8_t* limit, CountTable* table, IdBuf* rec) noexcept nogil:
    """``_count_span`` that also appends the entry number of each pretoken, in order, to rec.

    A twin of ``_count_span`` rather than a flag in it, so the plain count's loop stays as it is.
    """
    cdef Pending queue[BATCH]
    cdef int64_t ends[SCAN_CAP]
    cdef Py_ssize_t k, got, start = i, n_pending = 0
    while i < n:
        got = _split_ends(pattern_id, s, &i, n, ends, SCAN_CAP)
        for k in range(got):
            _pend(&queue[n_pending], s + start, ends[k] - start, limit, table)
            start = ends[k]
            n_pending += 1
            if n_pending == BATCH:
                if _ids_reserve(rec, BATCH) != 0 or _flush_rec(table, queue, n_pending, rec) != 0:
                    return -1
                n_pending = 0
    if _ids_reserve(rec, n_pending) != 0:
        return -1
    return _flush_rec(table, queue, n_pending, rec)
