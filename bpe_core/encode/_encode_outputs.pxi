# _encode.pyx, part 5c of 10 (``include``d: compiled into the module as if written there).
# The hand-over of an encoder's ids: a uint32 array (``Encoder._take_out``), the corpus encoder's
# narrowed and counted chunk (``Encoder._take_counted``), the buffer emptied after. Module-level
# functions over an ``Encoder`` (the class keeps the methods, as thin wrappers over these).

# ==== A spare buffer of ids ==================================================================
# A handed-over buffer (``_hand_over``) becomes the array's memory; when the array is freed, the
# buffer is kept as the process's spare (one, from 2 to 64 MiB) and the next call that needs such
# a buffer takes it: its pages are already mapped. A fresh buffer costs a mapping, faults of its
# huge pages, the kernel's zeroing of them and an unmapping: 0.5-0.7 ms of system time a call of
# 5 MB of text to an array, ~5% of the call.

cdef token_id_t* _spare_buf = NULL
cdef Py_ssize_t _spare_cap = 0         # its ids
cdef long _spare_lock = 0

cdef enum:
    SPARE_MIN_IDS = 1 << 19            # 2 MiB
    SPARE_MAX_IDS = 1 << 24            # 64 MiB


cdef token_id_t* _spare_take(Py_ssize_t need, Py_ssize_t* cap) noexcept nogil:
    """The spare buffer when it holds at least ``need`` ids (its size in ``cap[0]``), else NULL."""
    global _spare_buf, _spare_cap
    cdef token_id_t* p = NULL
    if _spare_buf == NULL:                 # (a plain read: a hint; the lock decides)
        return NULL
    spin_lock(&_spare_lock)
    if _spare_buf != NULL and _spare_cap >= need:
        p = _spare_buf
        cap[0] = _spare_cap
        _spare_buf = NULL
        _spare_cap = 0
    spin_unlock(&_spare_lock)
    return p


cdef void _spare_give(token_id_t* p, Py_ssize_t cap) noexcept nogil:
    """Free the buffer ``p`` of ``cap`` ids, or keep it as the spare (the larger of it and the
    spare held, within SPARE_MIN_IDS .. SPARE_MAX_IDS, is kept; the other freed)."""
    global _spare_buf, _spare_cap
    cdef token_id_t* q
    cdef Py_ssize_t c
    if p != NULL and SPARE_MIN_IDS <= cap <= SPARE_MAX_IDS:
        spin_lock(&_spare_lock)
        if _spare_buf == NULL or _spare_cap < cap:
            q, c = _spare_buf, _spare_cap
            _spare_buf, _spare_cap = p, cap
            p = q
        spin_unlock(&_spare_lock)
    free(p)


def _spare_info():
    """The spare buffer's size in ids (0: none); for tests."""
    return int(_spare_cap) if _spare_buf != NULL else 0


# ==== Handing the ids over ===================================================================


cdef inline void _out_taken(Encoder enc) noexcept:
    """The ids were taken out of ``enc``'s buffer: empty it, and free it when huge (not kept alive
    between calls)."""
    enc.out_n = 0
    if enc.out_cap > (1 << 24):
        free(enc.out_buf)
        enc.out_buf = NULL
        enc.out_cap = 0


cdef object _take_out_of(Encoder self):
    """The ids written so far as a new uint32 ndarray; keeps the buffer unless it is huge. From
    ``HAND_OVER_IDS`` ids on, the buffer itself becomes the array (no copy; the next call
    starts a new one)."""
    if self.out_n >= HAND_OVER_IDS:
        return _hand_over(self, self.out_n)
    result = np.empty(self.out_n, dtype=np.uint32)
    cdef uint32_t[::1] view = result
    if self.out_n:
        memcpy(&view[0], self.out_buf, self.out_n * sizeof(token_id_t))
    _out_taken(self)
    return result


cdef object _take_counted_of(Encoder self, const int64_t[::1] lengths, bint narrow, int64_t* n_bytes):
    """``_take_out`` fused with the corpus encoder's conservation sum and its narrowing: the
    ids are written as uint16 (``narrow``) or uint32 into the new array and ``lengths[id]`` of
    each is summed. ``n_bytes[0]`` is the sum, or -1 when an id is outside ``lengths``
    (the caller's check then fails; the ids are still all copied, narrowed modulo 2**16). Narrowing needs ``len(lengths) <= 65536``, so every id it
    keeps fits."""
    cdef Py_ssize_t k, n = self.out_n, m = lengths.shape[0]
    cdef int64_t total = 0
    cdef uint32_t x, top = 0
    cdef bint bad = False
    cdef const token_id_t* src = self.out_buf
    cdef const int64_t* lens = &lengths[0] if m else NULL
    cdef uint16_t* d16 = NULL
    cdef uint32_t* d32 = NULL
    cdef uint16_t[::1] v16
    cdef uint32_t[::1] v32
    result = np.empty(n, dtype=np.uint16 if narrow else np.uint32)
    if n:
        if narrow:
            v16 = result
            d16 = &v16[0]
        else:
            v32 = result
            d32 = &v32[0]
        # Two passes, each without a branch a id: the copy (narrowed) with the largest id,
        # which the compiler vectorizes, then the sum over the copy when every id is inside
        # ``lengths`` (one pass that checked each id cost ~10 instructions an id, now ~5).
        with nogil:
            if narrow:
                for k in range(n):
                    x = src[k]
                    d16[k] = <uint16_t>x
                    top = x if x > top else top
            else:
                for k in range(n):
                    x = src[k]
                    d32[k] = x
                    top = x if x > top else top
            if top >= <uint64_t>m:
                bad = True
            elif narrow:
                for k in range(n):
                    total += lens[d16[k]]
            else:
                for k in range(n):
                    total += lens[d32[k]]
    n_bytes[0] = -1 if bad else total
    _out_taken(self)
    return result
