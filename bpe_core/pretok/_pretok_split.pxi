# _pretok.pyx, part 8 of 11 (``include``d: compiled into the module as if written there).
# The Python entry points for splitting: split_ends, the piece cache of split_pieces, special
# tokens (find_special, special_spans).

# ==== Python entry points ==========================================================================


def _check_pattern_id(int pattern_id):
    if pattern_id not in (PATTERN_GPT2, PATTERN_CL100K, PATTERN_O200K):
        raise ValueError(f"unknown pattern id {pattern_id}; expected one of {PATTERN_IDS}")


def split_ends(const uint8_t[::1] buf, int pattern_id):
    """End offsets of the pretokens of ``buf`` under a named pattern, in order.

    Contract: ``buf`` is a C-contiguous uint8 buffer (``bytes``, ``bytearray``, ``np.memmap``);
    ``pattern_id`` is ``PATTERN_IDS[name]``. Returns an int64 array ``ends`` with
    ``ends[-1] == len(buf)`` (empty for an empty buffer); pretoken k is ``buf[ends[k-1]:ends[k]]``.

    >>> split_ends(b"Hi  there!", PATTERN_IDS["gpt2"]).tolist()
    [2, 3, 9, 10]

    Plain equivalent: the cumulative byte lengths of
    ``regex.findall(pattern, bytes(buf).decode("utf-8", "surrogateescape"))``, each piece encoded
    back with ``surrogateescape`` (``pretokenize.pretoken_ends`` does exactly that for a user regex).
    """
    _check_pattern_id(pattern_id)
    cdef Py_ssize_t n = buf.shape[0], pos = 0, n_ends = 0, cap = n // 4 + 16, got
    cdef int64_t[::1] ends_view
    ends = np.empty(cap, dtype=np.int64)
    cdef const uint8_t* s = &buf[0] if n > 0 else NULL
    while pos < n:
        if n_ends == cap:  # average pretokens are > 4 bytes: rarely taken
            cap = cap * 2
            grown = np.empty(cap, dtype=np.int64)
            grown[:n_ends] = ends[:n_ends]
            ends = grown
        ends_view = ends
        with nogil:
            got = _split_ends(pattern_id, s, &pos, n, &ends_view[n_ends], cap - n_ends)
        n_ends += got
    ends_view = None  # release the buffer so the array can shrink in place
    ends.resize(n_ends, refcheck=False)
    return ends


cdef enum:
    PIECES_CAP = 1024  # pretoken ends scanned per batch by split_pieces
    PREFETCH = 16  # split_pieces prefetches objects this many pretokens ahead, buckets twice as far
    PIECE_CACHE = 1 << 17  # most slots of split_pieces' cache of short pretokens (4 MiB)


# A short pretoken already turned into a bytes object (split_pieces): its zero-padded first 16
# bytes and length identify it.
cdef struct CachedPiece:
    PyObject* obj  # borrowed (the items array holds every object made in the call), or NULL
    uint64_t w0
    uint64_t w1
    Py_ssize_t length


# Reference-counting helpers on raw pointers: split_pieces fills a C array of new references that
# then becomes the list, so no Python object passes through Cython's own reference counting.
cdef extern from *:
    """
    static inline PyObject* bpe_bytes_new(const uint8_t* p, Py_ssize_t n) {
        return PyBytes_FromStringAndSize((const char*)p, n);
    }
    static inline void bpe_incref(PyObject* o) { Py_INCREF(o); }
    static inline void bpe_xdecref(PyObject* o) { Py_XDECREF(o); }

    /* The list of items[0:n] (new references; items allocated with PyMem_Malloc/PyMem_Realloc,
     * cap entries). On CPython's default build the array becomes the list's own item array, as
     * list.append would have grown it (no copy); elsewhere the references move into PyList_New(n).
     * items is consumed either way; on failure (NULL, MemoryError set) the references are
     * released. */
    static PyObject* bpe_list_adopt(PyObject** items, Py_ssize_t n, Py_ssize_t cap) {
        Py_ssize_t i;
    #if !defined(PYPY_VERSION) && !defined(Py_GIL_DISABLED) && !defined(Py_LIMITED_API)
        PyListObject* list = (PyListObject*)PyList_New(0);
        if (list != NULL) {
            if (n == 0) {
                PyMem_Free(items);
                return (PyObject*)list;
            }
            if (cap / 2 > n) {  /* give back the room of an estimate far off */
                PyObject** fitted = (PyObject**)PyMem_Realloc(items, (size_t)n * sizeof(PyObject*));
                if (fitted != NULL) {
                    items = fitted;
                    cap = n;
                }
            }
            list->ob_item = items;
            list->allocated = cap;
            Py_SET_SIZE(list, n);
            return (PyObject*)list;
        }
    #else
        PyObject* list = PyList_New(n);
        if (list != NULL) {
            for (i = 0; i < n; i++) PyList_SET_ITEM(list, i, items[i]);
            PyMem_Free(items);
            return list;
        }
    #endif
        for (i = 0; i < n; i++) Py_DECREF(items[i]);
        PyMem_Free(items);
        return NULL;
    }
    """
    PyObject* bpe_bytes_new(const uint8_t* p, Py_ssize_t n)
    void bpe_incref(PyObject* o)
    void bpe_xdecref(PyObject* o)
    object bpe_list_adopt(PyObject** items, Py_ssize_t n, Py_ssize_t cap)


cdef void _piece_keys(const uint8_t* s, Py_ssize_t start, const int64_t* ends, Py_ssize_t got,
                      const uint8_t* limit, uint64_t* keys, CachedPiece* cache,
                      uint64_t mask) noexcept nogil:
    """Head words and cache slot of each of a batch of pretokens (keys[3j..3j+2] = w0, w1, slot),
    prefetching the slots: the lookups that follow then rarely wait for memory."""
    cdef Py_ssize_t j, length
    cdef uint64_t w0, w1, h
    for j in range(got):
        length = ends[j] - start
        _head16(s + start, length, limit, &w0, &w1)
        h = (_hash(w0, w1, s + start, length if length <= 16 else 16) & mask) * 2
        keys[3 * j] = w0
        keys[3 * j + 1] = w1
        keys[3 * j + 2] = h
        start = ends[j]


cdef Py_ssize_t _pieces(const uint8_t* s, Py_ssize_t start, const int64_t* ends, Py_ssize_t got,
                        const uint64_t* keys, CachedPiece* cache, PyObject** items) noexcept:
    """A new reference to ``bytes(s[a:b])`` for each pretoken of a batch, into items[0:got].

    A pretoken of up to 16 bytes goes through its cache slot (keys from ``_piece_keys``): most are
    frequent short words, so most get (a new reference to) a bytes object made before instead of
    allocating and copying one. Bytes are immutable: sharing is safe. Returns how many items were
    written: ``got``, or fewer when out of memory (MemoryError set).
    """
    cdef Py_ssize_t j, length
    cdef CachedPiece* slot
    cdef CachedPiece spare
    cdef PyObject* obj
    cdef uint64_t w0, w1
    for j in range(min(2 * PREFETCH, got)):
        bpe_prefetch(&cache[keys[3 * j + 2]])
    for j in range(got):
        # Two stages ahead, spread evenly over the loop: the bucket of a later pretoken, and the
        # object of a nearer one (a hit touches its refcount).
        if j + 2 * PREFETCH < got:
            bpe_prefetch(&cache[keys[3 * (j + 2 * PREFETCH) + 2]])
        if j + PREFETCH < got:
            obj = cache[keys[3 * (j + PREFETCH) + 2]].obj
            if obj != NULL:
                bpe_prefetch(obj)
        length = ends[j] - start
        slot = &cache[keys[3 * j + 2]]  # a bucket of two ways, one cache line
        w0 = keys[3 * j]
        w1 = keys[3 * j + 1]
        if length <= 16 and slot[0].w0 == w0 and slot[0].w1 == w1 and slot[0].length == length:
            obj = slot[0].obj
            bpe_incref(obj)
        elif length <= 16 and slot[1].w0 == w0 and slot[1].w1 == w1 and slot[1].length == length:
            obj = slot[1].obj  # the recent way first
            bpe_incref(obj)
            spare = slot[0]
            slot[0] = slot[1]
            slot[1] = spare
        else:
            obj = bpe_bytes_new(s + start, length)
            if obj == NULL:
                return j
            if length <= 16:  # the older way goes
                slot[1] = slot[0]
                slot[0].obj = obj
                slot[0].w0 = w0
                slot[0].w1 = w1
                slot[0].length = length
        items[j] = obj
        start = ends[j]
    return got


cdef Py_ssize_t _find_all(const uint8_t* s, Py_ssize_t n, const uint8_t* tok, Py_ssize_t m,
                          int64_t* starts, Py_ssize_t cap, Py_ssize_t* pos) noexcept nogil:
    """Up to cap starts of the non-overlapping occurrences of tok (m >= 1 bytes) in s[*pos:n], left
    to right; advances *pos past the last one written (or to n). Returns how many.

    ``memchr`` finds each candidate first byte (vectorized: special tokens start with a rare byte
    such as ``<``), ``memcmp`` checks the rest.
    """
    cdef Py_ssize_t i = pos[0], k = 0
    cdef const uint8_t* hit
    cdef uint8_t first = tok[0]
    while k < cap and n - i >= m:
        hit = <const uint8_t*>memchr(s + i, first, n - i - m + 1)
        if hit == NULL:
            i = n
            break
        i = hit - s
        if memcmp(hit + 1, tok + 1, m - 1) == 0:
            starts[k] = i
            k += 1
            i += m
        else:
            i += 1
    pos[0] = i if n - i >= m else n
    return k


def find_special(const uint8_t[::1] buf, const uint8_t[::1] token):
    """The ``[start, end)`` spans of the non-overlapping occurrences of ``token`` in ``buf``, left
    to right, as an int64 ``(k, 2)`` array.

    >>> find_special(b"a<s>b<s><s", b"<s>").tolist()
    [[1, 4], [5, 8]]

    Plain equivalent: the loop ``pos = buf.find(token, pos)`` / ``pos += len(token)`` (what
    ``corpus.specials.split_on_specials`` finds for a single special token).
    """
    cdef Py_ssize_t n = buf.shape[0], m = token.shape[0], pos = 0, total = 0, got, cap = 256, k
    if m == 0:
        raise ValueError("find_special: the token is empty")
    cdef int64_t[::1] view
    starts = np.empty(cap, dtype=np.int64)
    while pos < n:
        if total == cap:
            cap *= 2
            grown = np.empty(cap, dtype=np.int64)
            grown[:total] = starts[:total]
            starts = grown
        view = starts
        with nogil:
            got = _find_all(&buf[0], n, &token[0], m, &view[total], cap - total, &pos)
        total += got
    spans = np.empty((total, 2), dtype=np.int64)
    if total:
        spans[:, 0] = starts[:total]
        spans[:, 1] = spans[:, 0] + m
    return spans


cdef Py_ssize_t _match_any(const uint8_t* s, Py_ssize_t i, Py_ssize_t end, const uint8_t** toks,
                           const Py_ssize_t* lens, Py_ssize_t n_toks) noexcept nogil:
    """The length of the first of the tokens (longest first) that occurs at s[i] within s[:end], or 0."""
    cdef Py_ssize_t t
    for t in range(n_toks):
        if lens[t] <= end - i and s[i] == toks[t][0] and memcmp(s + i, toks[t], lens[t]) == 0:
            return lens[t]
    return 0


cdef Py_ssize_t _find_specials(const uint8_t* s, Py_ssize_t end, const uint8_t** toks, const Py_ssize_t* lens, Py_ssize_t n_toks,
                               const uint8_t* firsts, int64_t* found, Py_ssize_t cap,
                               Py_ssize_t* pos) noexcept nogil:
    """Up to cap occurrences (start, end pairs into found) of the tokens in s[*pos:end], left to
    right, non-overlapping, the longest token at a position first: ``specials_regex(tokens).finditer``.
    Advances *pos past the last one written (or to end); returns how many.

    When every token starts with one byte (``<|...|>``), ``memchr`` finds the candidates; else
    ``firsts`` (256 flags) is read byte by byte.
    """
    cdef Py_ssize_t i = pos[0], k = 0, m
    cdef const uint8_t* hit
    cdef uint8_t one = toks[0][0]
    cdef bint single = True
    for m in range(256):
        if firsts[m] and m != one:
            single = False
    while k < cap and i < end:
        if single:
            hit = <const uint8_t*>memchr(s + i, one, end - i)
            if hit == NULL:
                i = end
                break
            i = hit - s
        elif not firsts[s[i]]:
            i += 1
            continue
        m = _match_any(s, i, end, toks, lens, n_toks)
        if m > 0:
            found[2 * k] = i
            found[2 * k + 1] = i + m
            k += 1
            i += m
        else:
            i += 1
    pos[0] = i
    return k


def special_spans(const uint8_t[::1] buf, Py_ssize_t start, Py_ssize_t end, tokens):
    """The ``[start, end)`` spans of the special-token occurrences in ``buf[start:end]``, as an int64
    ``(k, 2)`` array: left to right, non-overlapping, at each position the first of ``tokens`` (a
    sequence of non-empty ``bytes``, longest first) that occurs there.

    >>> special_spans(b"<s><s>x<s", 0, 9, [b"<s>x", b"<s>"]).tolist()
    [[0, 3], [3, 7]]

    Plain equivalent: ``[m.span() for m in corpus.specials.specials_regex(tokens).finditer(buf,
    start, end)]`` (the regex alternation tries the tokens in the order given, longest first).
    """
    cdef Py_ssize_t n = buf.shape[0], n_toks = len(tokens), t, total = 0, got, cap = 256, pos = start
    if not 0 <= start <= end <= n:
        raise ValueError(f"special_spans: [{start}, {end}) is not inside the buffer of {n} bytes")
    if n_toks == 0:
        return np.zeros((0, 2), dtype=np.int64)
    held = [bytes(tok) for tok in tokens]
    cdef const uint8_t** toks = <const uint8_t**>malloc(n_toks * sizeof(uint8_t*))
    cdef Py_ssize_t* lens = <Py_ssize_t*>malloc(n_toks * sizeof(Py_ssize_t))
    cdef uint8_t firsts[256]
    cdef int64_t[:, ::1] view
    cdef const uint8_t* s = &buf[0] if n > 0 else NULL
    try:
        if toks == NULL or lens == NULL:
            raise MemoryError("special_spans: out of memory")
        memset(firsts, 0, 256)
        for t in range(n_toks):
            if len(held[t]) == 0:
                raise ValueError("special_spans: a special token is empty")
            if t > 0 and len(held[t]) > len(held[t - 1]):
                raise ValueError("special_spans: the tokens must come longest first")
            toks[t] = <const uint8_t*><char*>held[t]
            lens[t] = len(held[t])
            firsts[toks[t][0]] = 1
        found = np.empty((cap, 2), dtype=np.int64)
        while pos < end:
            if total == cap:
                cap *= 2
                grown = np.empty((cap, 2), dtype=np.int64)
                grown[:total] = found[:total]
                found = grown
            view = found
            with nogil:
                got = _find_specials(s, end, toks, lens, n_toks, firsts, &view[total, 0],
                                     cap - total, &pos)
            total += got
        return found[:total].copy()
    finally:
        free(toks)
        free(lens)


def split_pieces(const uint8_t[::1] buf, int pattern_id, const int64_t[:, ::1] specials):
    """The pretokens of ``buf`` under a named pattern as a ``list[bytes]``, special tokens kept.

    Contract: ``buf`` as in ``split_ends``; ``specials`` is a ``(k, 2)`` int64 array of the
    ``[start, end)`` spans of the special tokens in ``buf``, sorted and not overlapping (as
    ``patterns.specials_regex(...).finditer`` finds them). The text before, between and after them
    is pre-tokenized span by span; each special token is one item. The items concatenate to
    ``buf``; equal short items may be one shared ``bytes`` object.

    >>> split_pieces(b"Hi  there!<s>ok", PATTERN_IDS["gpt2"], np.array([[10, 13]]))
    [b'Hi', b' ', b' there', b'!', b'<s>', b'ok']

    Plain equivalent: ``patterns.split_on_specials`` and, for each text part, the pieces
    ``buf[ends[k-1]:ends[k]]`` of ``split_ends`` (the regex pieces, see there). The items are
    written straight into the list's item array, batch by batch of ends: no ``tolist()``, no
    slicing and no ``append`` in Python.
    """
    _check_pattern_id(pattern_id)
    cdef Py_ssize_t n = buf.shape[0], n_specials = specials.shape[0], k = 0, pos = 0, seg_end
    cdef Py_ssize_t start, got, j, a, b, prev_end = 0, n_items = 0, cap, done
    cdef int64_t ends[PIECES_CAP]
    cdef uint64_t keys[3 * PIECES_CAP]
    cdef const uint8_t* s = &buf[0] if n > 0 else NULL
    cdef CachedPiece* cache
    cdef void* cache_mem
    cdef PyObject** items
    cdef PyObject** grown
    cdef PyObject* obj
    cdef Py_ssize_t n_slots = 64
    if n_specials > 0 and specials.shape[1] != 2:
        raise ValueError(f"specials must have shape (k, 2), got ({n_specials}, {specials.shape[1]})")
    for k in range(n_specials):
        a = specials[k, 0]
        b = specials[k, 1]
        if not prev_end <= a < b <= n:
            raise ValueError(f"special span {k} = [{a}, {b}) is empty, out of order or not inside "
                             f"the buffer of {n} bytes")
        prev_end = b
    while n_slots < PIECE_CACHE and n_slots < n // 16:  # a small input gets a small cache
        n_slots *= 2
    cap = n // 4 + n_specials + PIECES_CAP  # most text averages over 4 bytes a pretoken
    cache_mem = calloc(n_slots * sizeof(CachedPiece) + 64, 1)  # buckets aligned to cache lines
    cache = <CachedPiece*>((<size_t>cache_mem + 63) & ~(<size_t>63))
    items = <PyObject**>PyMem_Malloc(cap * sizeof(PyObject*))
    try:
        if cache_mem == NULL or items == NULL:
            raise MemoryError()
        k = 0
        while True:
            seg_end = specials[k, 0] if k < n_specials else n
            while pos < seg_end:
                start = pos
                got = _split_ends(pattern_id, s, &pos, seg_end, ends, PIECES_CAP)
                if cap - n_items < got + 1:  # room for the batch and a special token
                    grown = <PyObject**>PyMem_Realloc(items, 2 * cap * sizeof(PyObject*))
                    if grown == NULL:
                        raise MemoryError()
                    items = grown
                    cap *= 2
                _piece_keys(s, start, ends, got, s + n, keys, cache, n_slots // 2 - 1)
                done = _pieces(s, start, ends, got, keys, cache, items + n_items)
                n_items += done
                if done < got:
                    raise MemoryError()
            if k == n_specials:
                break
            obj = bpe_bytes_new(s + seg_end, specials[k, 1] - seg_end)
            if obj == NULL:
                raise MemoryError()
            items[n_items] = obj
            n_items += 1
            pos = specials[k, 1]
            k += 1
        out = bpe_list_adopt(items, n_items, cap)  # consumes items, also on failure
        items = NULL
        return out
    finally:
        if items != NULL:
            for j in range(n_items):
                bpe_xdecref(items[j])
            PyMem_Free(items)
        free(cache_mem)
