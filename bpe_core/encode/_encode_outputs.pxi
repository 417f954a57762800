# _encode.pyx, part 5c of 10 (``include``d: compiled into the module as if written there).
# The hand-over of an encoder's ids: a uint32 array (``Encoder._take_out``), the corpus encoder's
# narrowed and counted chunk (``Encoder._take_counted``), the buffer emptied after. Module-level
# functions over an ``Encoder`` (the class keeps the methods, as thin wrappers over these).

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
