# _pretok.pyx, part 9 of 11 (``include``d: compiled into the module as if written there).
# The Python entry point for counting (count_pretokens) and its outputs: a table's entries as
# arrays, lent buffers, the record ids.

cdef object _table_to_arrays(CountTable* t, bint presorted=False, bint numpy=True,
                             const uint32_t* sorted_order=NULL):
    """Sort the entries by bytes (unless ``presorted``) and copy them out as (arena, offsets, counts):
    numpy arrays, or ``array.array`` (``"B"``, ``"q"``, ``"q"``) when not ``numpy``.

    The sort orders entry numbers by 24-byte keys (``bpe_sort_keys``), then the copy reads the
    entries in that order: the entries themselves are not moved. ``sorted_order``: that order,
    made by the caller (``_record_to_arrays``; not freed here): no sort.
    """
    cdef Py_ssize_t i, n_words = t.n_entries, n_bytes = 0, pos = 0
    cdef Entry* entries = t.entries
    cdef Entry* e
    cdef uint32_t* order = NULL
    cdef const uint32_t* by = sorted_order
    cdef int status = 0
    cdef uint8_t[::1] arena_view
    cdef int64_t[::1] offsets_view
    cdef int64_t[::1] counts_view
    cdef uint8_t* out
    if n_words > 1 and not presorted and by == NULL:
        order = <uint32_t*>malloc(n_words * sizeof(uint32_t))
        if order == NULL:
            raise MemoryError("count_pretokens: cannot allocate the sort order of the table")
    try:
        with nogil:
            if order != NULL:
                status = bpe_sort_keys[Entry, EntryLess](order, n_words, entries, _entry_less)
                by = order
            for i in range(n_words):
                n_bytes += entries[i].length
        if status != 0:
            raise MemoryError("count_pretokens: cannot allocate the sort keys of the table")
        arena, offsets, counts = _table_arrays(n_bytes, n_words, numpy)
        arena_view = arena
        offsets_view = offsets
        counts_view = counts
        out = &arena_view[0] if n_bytes > 0 else NULL
        with nogil:
            for i in range(n_words):
                e = &entries[by[i] if by != NULL else i]
                offsets_view[i] = pos
                counts_view[i] = e.count
                memcpy(out + pos, e.ptr, e.length)
                pos += e.length
            offsets_view[n_words] = pos
        return arena, offsets, counts
    finally:
        free(order)


cdef class _OwnedIds:
    """A malloc'd uint32 array lent to numpy as an array's memory (freed with this object)."""
    cdef uint32_t* data
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __cinit__(self):
        self.data = NULL
        self.shape[0] = 0
        self.strides[0] = sizeof(uint32_t)

    def __dealloc__(self):
        free(self.data)

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        lend_u32(buffer, self, self.data, self.shape, self.strides)

    def __releasebuffer__(self, Py_buffer* buffer):
        pass


cdef uint32_t _NO_ID = 0


cdef int lend_u32(Py_buffer* buffer, object owner, uint32_t* data, Py_ssize_t* shape,
                  Py_ssize_t* strides) except -1:
    """Fill ``buffer`` for a 1-d writable uint32 array of ``shape[0]`` items at ``data`` (NULL when
    empty) owned by ``owner``: the body of a ``__getbuffer__`` that lends C memory to numpy."""
    return lend_items(buffer, owner, <void*>data, sizeof(uint32_t), b"I", shape, strides)


cdef int lend_items(Py_buffer* buffer, object owner, void* data, Py_ssize_t itemsize, char* fmt,
                    Py_ssize_t* shape, Py_ssize_t* strides) except -1:
    """:func:`lend_u32` for items of any size and ``struct`` format (``b"q"``: int64)."""
    strides[0] = itemsize
    buffer.buf = data if data != NULL else <void*>&_NO_ID
    buffer.format = fmt
    buffer.internal = NULL
    buffer.itemsize = itemsize
    buffer.len = shape[0] * itemsize
    buffer.ndim = 1
    buffer.obj = owner
    buffer.readonly = 0
    buffer.shape = shape
    buffer.strides = strides
    buffer.suboffsets = NULL
    return 0


cdef object _record_to_arrays(CountTable* t, IdBuf* rec, bint by_entry=False):
    """``_table_to_arrays`` plus ``ids``: each recorded entry number as its row in the sorted table.

    Sorts an index array rather than the entries (``bpe_sort_keys``: 24-byte keys, the heads decide
    nearly every comparison), so it knows where each entry went (``rank[old] = new``), copies the
    entries out in that order (``_table_to_arrays(sorted_order=)``: the entries are not moved, which
    took a fresh copy of them, 40 B a word, each chunk), then maps the ids through ``rank`` in place;
    the ids' buffer becomes the array's memory (taken from ``rec``: no copy). ``by_entry``: the ids
    stay entry numbers (in the order the words were first seen) and ``rank`` comes after them, the
    row of each.
    """
    cdef Py_ssize_t i, n_words = t.n_entries, n_ids = rec.n
    cdef int status = 0
    cdef uint32_t* order = NULL
    cdef uint32_t* rank = NULL
    cdef uint32_t* data = rec.data
    cdef _OwnedIds held
    cdef uint32_t[::1] rows_view
    try:
        if n_words > 0:
            order = <uint32_t*>malloc(n_words * sizeof(uint32_t))
            rank = <uint32_t*>malloc(n_words * sizeof(uint32_t))
            if order == NULL or rank == NULL:
                raise MemoryError("count_pretokens: cannot allocate the sort order of the table")
            with nogil:
                status = bpe_sort_keys[Entry, EntryLess](order, n_words, t.entries, _entry_less)
            if status != 0:
                raise MemoryError("count_pretokens: cannot allocate the sort keys of the table")
            with nogil:
                for i in range(n_words):
                    rank[order[i]] = <uint32_t>i
        out = _table_to_arrays(t, False, True, order)
        if by_entry:
            id_rows = np.empty(n_words, dtype=np.uint32)
            if n_words > 0:
                rows_view = id_rows
                memcpy(&rows_view[0], rank, n_words * sizeof(uint32_t))
        else:
            with nogil:
                for i in range(n_ids):
                    data[i] = rank[data[i]]
        held = _OwnedIds()
        held.data = data
        held.shape[0] = n_ids
        rec.data = NULL             # the array owns it now
        rec.n = rec.cap = 0
        out = out + (np.frombuffer(held, dtype=np.uint32),)
        return out + (id_rows,) if by_entry else out
    finally:
        free(order)
        free(rank)



cdef tuple _table_arrays(Py_ssize_t n_bytes, Py_ssize_t n_words, bint numpy):
    """The arena, offsets and counts of a sorted table, to be filled: numpy arrays, or
    ``array.array`` on a small run (no numpy)."""
    if numpy:
        return (np.empty(n_bytes, dtype=np.uint8), np.empty(n_words + 1, dtype=np.int64),
                np.empty(n_words, dtype=np.int64))
    return array.clone(_U8, n_bytes, False), array.clone(_I64, n_words + 1, False), array.clone(_I64, n_words, False)

def count_pretokens(const uint8_t[::1] buf, const int64_t[:, ::1] spans, int pattern_id,
                    bint record=False, bint numpy=True, CountScratch scratch=None,
                    int64_t[::1] span_ends=None, bint by_entry=False):
    """Count the pretokens of every ``[start, end)`` span of ``buf``: the sorted word table.

    Contract: each row of ``spans`` (int64, shape ``(k, 2)``, C order) is a text range of ``buf``
    between special tokens; spans are pre-tokenized independently (each one as a whole text).
    Every pretoken is hashed straight into a C hash table (no Python object per pretoken). Returns
    ``(arena, offsets, counts)``: uint8, int64 ``n_words + 1``, int64 ``n_words``; word i is
    ``arena[offsets[i]:offsets[i+1]]``, seen ``counts[i]`` times; words are unique and sorted in
    Python ``bytes`` order.

    >>> a, o, c = count_pretokens(b"a a<|>a", np.array([[0, 3], [6, 7]]), PATTERN_IDS["gpt2"])
    >>> [bytes(a[o[i]:o[i + 1]]) for i in range(len(c))], c.tolist()
    ([b' a', b'a'], [1, 2])

    With ``record`` it returns ``(arena, offsets, counts, ids)``: ``ids`` (uint32, one per pretoken,
    ``ids.size == counts.sum()``) gives, in text order (the spans in the order given, each left to
    right), the row of each pretoken in the table: the k-th pretoken is
    ``arena[offsets[ids[k]]:offsets[ids[k] + 1]]``. The plain count's loop is untouched by this;
    recording uses a twin of it (``_count_span_rec``).

    >>> a, o, c, ids = count_pretokens(b"a a<|>a", np.array([[0, 3], [6, 7]]),
    ...                                PATTERN_IDS["gpt2"], record=True)
    >>> ids.tolist(), [bytes(a[o[i]:o[i + 1]]) for i in ids]
    ([1, 0, 1], [b'a', b' a', b'a'])

    ``span_ends`` (with ``record``; int64, one per span): filled with where each span's pretokens
    end in ``ids`` (``[2, 3]`` above), so a reader of the ids knows the spans without their bytes.

    ``by_entry`` (with ``record``): the ids are the words' numbers in the order each was first seen
    (no pass over the ids to renumber them), and a fifth array gives the row of each (uint32:
    ``id_rows[ids[k]]`` is the k-th pretoken's row).

    >>> a, o, c, ids, id_rows = count_pretokens(b"a a<|>a", np.array([[0, 3], [6, 7]]),
    ...                                         PATTERN_IDS["gpt2"], record=True, by_entry=True)
    >>> ids.tolist(), id_rows[ids].tolist()
    ([0, 1, 0], [1, 0, 1])

    ``numpy=False`` (not with ``record``): the three tables are ``array.array`` (``"B"``, ``"q"``,
    ``"q"``) with the same items, and numpy is not imported (a small run, ``pretok.counting``).

    ``scratch`` (a :class:`CountScratch`, not with ``record``): the counter's front cache and short
    table are taken from it and put back into it when done, so that a worker counting chunk after
    chunk allocates them once; the result is the same.

    Plain equivalent: ``sorted(Counter(p for start, end in spans for p in
    pretokenize(buf[start:end], pattern)).items())``; with ``record``, ``ids`` is
    ``[row[p] for start, end in spans for p in pretokenize(buf[start:end], pattern)]``.
    """
    _check_pattern_id(pattern_id)
    if record and not numpy:
        raise ValueError("count_pretokens: record=True returns numpy arrays (numpy=False is not supported)")
    if by_entry and not record:
        raise ValueError("count_pretokens: by_entry needs record=True")
    if span_ends is not None and (not record or span_ends.shape[0] != spans.shape[0]):
        raise ValueError("count_pretokens: span_ends needs record=True and one entry per span")
    cdef Py_ssize_t n = buf.shape[0], k, start, end, i
    cdef const uint8_t* s = &buf[0] if n > 0 else NULL
    if spans.shape[1] != 2:
        raise ValueError(f"spans must have shape (k, 2), got ({spans.shape[0]}, {spans.shape[1]})")
    for k in range(spans.shape[0]):
        if not (0 <= spans[k, 0] <= spans[k, 1] <= n):
            raise ValueError(f"span {k} = [{spans[k, 0]}, {spans[k, 1]}) is not inside the buffer"
                             f" of {n} bytes")
    cdef CountTable table
    cdef WordCounter counter
    cdef IdBuf rec
    cdef Py_ssize_t span_bytes = 0, n_front
    cdef int status = 0
    rec.data = NULL
    rec.n = 0
    rec.cap = 0
    table.slots = NULL
    table.entries = NULL
    memset(&counter, 0, sizeof(WordCounter))
    for k in range(spans.shape[0]):
        span_bytes += spans[k, 1] - spans[k, 0]
    try:
        if record:
            # a slot per 64 bytes of the spans to begin with (as the plain count's short table;
            # 2**14 to 2**18): seldom a rehash of the words as the table grows
            n_front = 1 << 14
            while n_front < (1 << 18) and n_front < span_bytes // 64:
                n_front *= 2
            if _table_init(&table, n_front) != 0:
                raise MemoryError("count_pretokens: cannot allocate the hash table")
            # room for a pretoken per 4 bytes of the spans at the start (English: ~1 per 4.5): address
            # space only until written, and seldom a copy to grow
            if _ids_reserve(&rec, span_bytes // 4 + 1) != 0:
                raise MemoryError("count_pretokens: cannot allocate the ids")
            # the plain count's front cache (sized as there), its slots naming entries of the table
            n_front = 64
            while n_front < FRONT_SLOTS and n_front < span_bytes // 32:
                n_front *= 2
            counter.front = <FrontSlot*>bpe_lines_alloc(n_front * sizeof(FrontSlot))
            counter.front_mask = n_front - 1
            if counter.front == NULL:
                raise MemoryError("count_pretokens: cannot allocate the front cache")
            with nogil:
                for k in range(spans.shape[0]):
                    status = _count_span_rec(pattern_id, s, spans[k, 0], spans[k, 1], s + n,
                                             &table, &counter, &rec)
                    if status != 0:
                        break
                    if span_ends is not None:
                        span_ends[k] = rec.n
                _front_drain_rec(&counter, &table)
            if status != 0:
                raise MemoryError("count_pretokens: out of memory growing the hash table or the ids")
            return _record_to_arrays(&table, &rec, by_entry)
        if scratch is not None:
            status = _counter_take(&counter, span_bytes, scratch)
        else:
            status = _counter_init(&counter, span_bytes)
        if status != 0:
            raise MemoryError("count_pretokens: cannot allocate the hash table")
        with nogil:
            for k in range(spans.shape[0]):
                status = _count_span(pattern_id, s, spans[k, 0], spans[k, 1], s + n, &counter)
                if status != 0:
                    break
            if status == 0:
                _counter_drain(&counter)
        if status != 0:
            raise MemoryError("count_pretokens: out of memory growing the hash table")
        return _counter_to_arrays(&counter, numpy)
    finally:
        _table_free(&table)
        if scratch is not None and not record:
            _counter_give(&counter, scratch)
        else:
            _counter_free(&counter)
        free(rec.data)
