# _encode.pyx, part 10 of 10 (``include``d: compiled into the module as if written there).
# The token table (TokenTable): decoding ids to bytes, and Python lists of ids.

# ==== Token table: decoding, and Python lists of ids ===========================================

ctypedef fused id_t:
    uint16_t
    uint32_t
    int64_t


@cython.boundscheck(False)
@cython.wraparound(False)
cdef class TokenTable:
    """The bytes of every token, back to back (``data``, with ``offsets``), and the Python ``int``
    of every id, built once per tokenizer: decoding is one pass over the ids into one
    preallocated ``bytes``, and a list of ids is built from shared ``int`` objects.

    Args:
        decoder: id -> token bytes, ``None`` where the id is unused (a sparse vocabulary).
        max_ints: ids below this get a shared ``int`` object (larger ones are created per use).

    >>> t = TokenTable([b"a", None, b"bc"])
    >>> t.decode([0, 2, 0]), t.decode(np.array([2], np.uint16)), t.decode([1])
    (b'abca', b'bc', None)
    >>> t.to_list(np.array([2, 0, 7], np.uint32))
    [2, 0, 7]
    """

    def __init__(self, decoder, Py_ssize_t max_ints=1 << 20):
        cdef Py_ssize_t n = len(decoder), i, off = 0
        self.n = n
        self.offsets.resize(n + 1)
        self.valid.assign(n, 0)
        parts = []
        for i in range(n):
            b = decoder[i]
            self.offsets[i] = off
            if b is not None:
                self.valid[i] = 1
                parts.append(b)
                off += len(b)
        self.offsets[n] = off
        joined = b"".join(parts)
        self.data.resize(off + 16)          # 16 bytes of slack: short tokens are copied 16 at a time
        if off:
            memcpy(self.data.data(), <const char*>joined, off)
        memset(self.data.data() + off, 0, 16)
        self.ints = list(range(min(n, max_ints)))
        self.n_ints = len(self.ints)
        self.int_ptrs.resize(self.n_ints)
        for i in range(self.n_ints):
            self.int_ptrs[i] = <PyObject*>self.ints[i]

    def lengths(self):
        """The byte length of every id as int64 (0 where the id is unused): what the corpus
        encoder's conservation check sums, from the offsets (no pass over Python objects).

        >>> TokenTable([b"a", None, b"bc"]).lengths().tolist()
        [1, 0, 2]
        """
        out = np.empty(self.n, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef Py_ssize_t i
        for i in range(self.n):
            o[i] = self.offsets[i + 1] - self.offsets[i]
        return out

    def decode(self, ids):
        """The bytes of ``ids`` (a list or tuple of ints, or a 1-D C-contiguous uint16, uint32 or
        int64 array), or None when an id is not in the table (the caller names it)."""
        cdef vector[int64_t] scratch
        cdef Py_ssize_t n, k
        cdef long long v
        cdef list seq
        if isinstance(ids, np.ndarray):
            return self._decode_array(ids)
        seq = ids if type(ids) is list else list(ids)
        n = len(seq)
        scratch.resize(n)
        for k in range(n):
            x = seq[k]                      # a list item, read without bounds checks
            if type(x) is not int:
                try:
                    x = x.__index__()
                except (AttributeError, TypeError):
                    return None
            try:
                v = x
            except OverflowError:
                return None
            scratch[k] = v
        return _decode_ids(self, scratch.data(), n)

    def _decode_array(self, const id_t[::1] ids):
        cdef Py_ssize_t n = ids.shape[0]
        if n == 0:
            return b""
        return _decode_ids(self, &ids[0], n)

    def to_list(self, const uint32_t[::1] ids not None):
        """The ids as a Python list of ints (one pass; ids below ``max_ints`` share their object)."""
        if ids.shape[0] == 0:
            return []
        out = self._list(&ids[0], ids.shape[0])
        gc_track(<PyObject*>out)
        return out

    def split_lists(self, const uint32_t[::1] ids not None, const int64_t[::1] offsets not None):
        """``[ids[offsets[k]:offsets[k + 1]] as a list for each k]``.

        The lists are kept out of the cyclic garbage collector while they are built and handed to
        it together at the end: a batch of thousands of lists otherwise triggers collections that
        walk every id of the lists built so far (a third of the time of this call).
        """
        cdef Py_ssize_t k, m = offsets.shape[0] - 1, built = 0
        cdef list out
        if m < 0 or (m >= 0 and (offsets[0] < 0 or offsets[m] > ids.shape[0])):
            raise ValueError("offsets must lie within ids")
        for k in range(m):
            if offsets[k + 1] < offsets[k]:
                raise ValueError("offsets must be non-decreasing")
        out = [None] * max(m, 0)
        try:
            for k in range(m):
                item = self._list(&ids[offsets[k]] if offsets[k + 1] > offsets[k] else NULL,
                                  offsets[k + 1] - offsets[k])                          # untracked
                out[k] = item
                built = k + 1
        finally:
            for k in range(built):
                gc_track(<PyObject*>out[k])
        return out

    cdef object _list(self, const uint32_t* p, Py_ssize_t n):
        """The ids as a new list, its slots written once (not zeroed first); the list comes back
        untracked by the cyclic collector (the caller tracks it).

        A list of at least a quarter as many ids as there are shared ints (``COUNTED_LIST``) takes
        its references in two passes: the slots are written while the references each int gets are
        counted in ``int_counts`` (4 bytes an id: 0.2 MB for GPT-2's, in L2), then each int's count
        is added once. An incref an id wrote to the int itself, 32 bytes an int read out of order
        from 1.6 MB (GPT-2) or 3.2 MB (cl100k), the prefetched line often not there in time."""
        cdef PyObject* lst = list_unset(n)
        cdef PyObject** items                  # the list's slots (read once: a slot store is not
        cdef PyObject* o                       # taken to change the list, an incref might be)
        cdef Py_ssize_t i, j, head
        cdef uint32_t v
        cdef void** ptrs = self.int_ptrs.data()
        cdef Py_ssize_t n_ints = self.n_ints
        cdef uint32_t* counts
        if lst == NULL:
            raise MemoryError()
        items = list_items(lst)
        if COUNTED_REFS and n >= COUNTED_LIST and n * 4 >= n_ints and n < (<Py_ssize_t>1 << 31):
            if <Py_ssize_t>self.int_counts.size() < n_ints:
                self.int_counts.assign(n_ints, 0)
            counts = self.int_counts.data()
            for i in range(n):
                v = p[i]
                if v < <uint64_t>n_ints:
                    items[i] = <PyObject*>ptrs[v]
                    counts[v] += 1
                else:
                    o = long_from_u32(v)
                    if o == NULL:
                        _add_counted(ptrs, counts, n_ints)
                        _unset_from(lst, items, i, n)
                    items[i] = o
            _add_counted(ptrs, counts, n_ints)
        else:
            head = n - LIST_AHEAD if n > LIST_AHEAD else 0
            for i in range(head):
                j = p[i + LIST_AHEAD]
                if j < n_ints:
                    # the int of an id a few places on, whose count the incref below will write: the
                    # ints of a 50k vocab (1.6 MB) are read out of order, mostly from past the L2 cache
                    prefetch(ptrs[j])
                o = _int_of(p[i], ptrs, n_ints)
                if o == NULL:
                    _unset_from(lst, items, i, n)
                items[i] = o
            for i in range(head, n):                # the last LIST_AHEAD ids: nothing to prefetch
                o = _int_of(p[i], ptrs, n_ints)
                if o == NULL:
                    _unset_from(lst, items, i, n)
                items[i] = o
        result = <object>lst
        decref(lst)
        return result


cdef void _add_counted(void** ptrs, uint32_t* counts, Py_ssize_t n_ints) noexcept:
    """``TokenTable._list``'s second pass: each int gets the references counted for it, and its
    count goes back to 0."""
    cdef Py_ssize_t v
    for v in range(n_ints):
        if counts[v]:
            add_refs(<PyObject*>ptrs[v], counts[v])
            counts[v] = 0


cdef inline PyObject* _int_of(uint32_t v, void** ptrs, Py_ssize_t n_ints) noexcept:
    """A new reference to the int ``v`` (the table's own below ``n_ints``), or NULL (no memory)."""
    cdef PyObject* o
    if v < <uint64_t>n_ints:
        o = <PyObject*>ptrs[v]
        incref(o)
        return o
    return long_from_u32(v)


cdef int _unset_from(PyObject* lst, PyObject** items, Py_ssize_t i, Py_ssize_t n) except -1:
    """``TokenTable._list`` ran out of memory at slot ``i``: the slots from there are set to NULL
    (so the list can be freed), the list is freed, and MemoryError raised."""
    cdef Py_ssize_t j
    for j in range(i, n):
        items[j] = NULL
    decref(lst)
    raise MemoryError()


cdef object _decode_ids(TokenTable t, const id_t* ids, Py_ssize_t n):
    """Two passes: the total length (and every id checked), then the copy into one ``bytes``."""
    cdef const int64_t* offs = t.offsets.data()
    cdef const uint8_t* valid = t.valid.data()
    cdef const uint8_t* data = t.data.data()
    cdef Py_ssize_t k, total = 0, pos = 0, length
    cdef int64_t v
    cdef bint bad = False
    cdef uint8_t* out
    with nogil:
        for k in range(n):
            v = <int64_t>ids[k]
            if v < 0 or v >= t.n or not valid[v]:
                bad = True
                break
            total += offs[v + 1] - offs[v]
    if bad:
        return None
    result = PyBytes_FromStringAndSize(NULL, total)
    out = <uint8_t*>PyBytes_AS_STRING(result)
    with nogil:
        for k in range(n):
            v = <int64_t>ids[k]
            length = offs[v + 1] - offs[v]
            if length <= 16 and pos + 16 <= total:
                memcpy(out + pos, data + offs[v], 16)
            else:
                memcpy(out + pos, data + offs[v], length)
            pos += length
    return result
