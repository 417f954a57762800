# _units.pyx, part 2 of 9 (``include``d: compiled into the module as if written there).
# WordIndex: pretoken bytes -> row of a sorted word table (open addressing over its arena).

# ==== Word index ==============================================================================

cdef struct WordSlot:
    # The first 16 bytes of the word inline (zero-padded), so a probe rarely touches the arena.
    uint64_t w0
    uint64_t w1
    int64_t tag         # -1: empty; else word id << 8 | min(length, 255)


cdef inline void _load16(const uint8_t* p, int64_t n, uint64_t* w0, uint64_t* w1) noexcept nogil:
    cdef uint64_t a = 0, b = 0
    cdef int64_t m = n if n < 16 else 16
    if m >= 8:
        memcpy(&a, p, 8)
        memcpy(&b, p + 8, m - 8)
    else:
        memcpy(&a, p, m)
    w0[0] = a
    w1[0] = b


cdef inline uint64_t _hash16(uint64_t w0, uint64_t w1, int64_t n) noexcept nogil:
    return _mix(w0 * <uint64_t>0x9E3779B97F4A7C15u ^ (w1 + <uint64_t>n) * <uint64_t>0xC2B2AE3D27D4EB4Fu)


cdef class WordIndex:
    """Pretoken bytes -> row of a word table (``arena``, ``offsets``), or -1.

    >>> idx = WordIndex(np.frombuffer(b"ab c", np.uint8), np.array([0, 2, 3, 4]))  # "ab", " ", "c"
    >>> idx.word_ids(b" cab", np.array([1, 2, 4]), 0).tolist()   # pieces " ", "c", "ab"
    [1, 2, 0]
    >>> idx.word_ids(b" cab", np.array([2, 4]), 0).tolist()      # " c" is not a word
    [-1, 0]

    Plain equivalent: ``{arena[o[i]:o[i+1]]: i for i in range(n)}.get(piece, -1)`` per piece.
    """
    cdef object _arena_obj
    cdef object _offsets_obj
    cdef const uint8_t[::1] arena
    cdef const int64_t[::1] offsets
    cdef vector[WordSlot] slots
    cdef uint64_t mask

    def __init__(self, arena, offsets):
        self._arena_obj = np.ascontiguousarray(arena, dtype=np.uint8)
        self._offsets_obj = np.ascontiguousarray(offsets, dtype=np.int64)
        self.arena = self._arena_obj
        self.offsets = self._offsets_obj
        cdef int64_t n = self.offsets.shape[0] - 1, i, length
        cdef uint64_t cap = 16, slot, w0, w1
        cdef WordSlot empty
        empty.w0 = 0
        empty.w1 = 0
        empty.tag = -1
        while cap < <uint64_t>(2 * n + 2):
            cap <<= 1
        self.slots.assign(cap, empty)
        self.mask = cap - 1
        cdef const uint8_t* base = &self.arena[0] if self.arena.shape[0] > 0 else NULL
        with nogil:
            for i in range(n):
                length = self.offsets[i + 1] - self.offsets[i]
                _load16(base + self.offsets[i], length, &w0, &w1)
                slot = _hash16(w0, w1, length) & self.mask
                while self.slots[slot].tag != -1:
                    slot = (slot + 1) & self.mask
                self.slots[slot].w0 = w0
                self.slots[slot].w1 = w1
                self.slots[slot].tag = (i << 8) | (length if length < 255 else 255)

    cdef inline uint64_t _slot_of(self, const uint8_t* p, int64_t n, const uint8_t* limit, uint64_t* w0,
                                  uint64_t* w1) noexcept nogil:
        """The first 16 bytes of ``p[:n]`` (zero-padded) and the slot where its probe starts; reads up to
        16 bytes at once when ``p + 16 <= limit`` (no byte-by-byte copy), as ``_load16`` gives them."""
        cdef uint64_t a, b
        if p + 16 <= limit:
            memcpy(&a, p, 8)
            memcpy(&b, p + 8, 8)
            if n < 8:
                a &= ((<uint64_t>1) << (8 * n)) - 1
                b = 0
            elif n < 16:
                b &= ((<uint64_t>1) << (8 * (n - 8))) - 1
            w0[0] = a
            w1[0] = b
        else:
            _load16(p, n, w0, w1)
        return _hash16(w0[0], w1[0], n) & self.mask

    cdef inline int64_t _probe(self, const uint8_t* p, int64_t n, uint64_t w0, uint64_t w1,
                               uint64_t slot) noexcept nogil:
        """``_lookup`` from a slot and head ``_slot_of`` gave."""
        cdef int64_t tag, w, start
        cdef int64_t short_len = n if n < 255 else 255
        while True:
            tag = self.slots[slot].tag
            if tag == -1:
                return -1
            if (tag & 0xFF) == short_len and self.slots[slot].w0 == w0 and self.slots[slot].w1 == w1:
                w = tag >> 8
                if n <= 16:
                    return w
                start = self.offsets[w]
                if self.offsets[w + 1] - start == n and memcmp(&self.arena[start], p, n) == 0:
                    return w
            slot = (slot + 1) & self.mask

    cdef inline int64_t _lookup(self, const uint8_t* p, int64_t n) noexcept nogil:
        cdef uint64_t w0, w1, slot
        _load16(p, n, &w0, &w1)
        slot = _hash16(w0, w1, n) & self.mask
        return self._probe(p, n, w0, w1, slot)

    def word_ids(self, const uint8_t[::1] buf, const int64_t[::1] ends, int64_t start):
        """Word ids of the pieces ``buf[start:ends[0]], buf[ends[0]:ends[1]], ...`` (int64, -1 if absent)."""
        cdef Py_ssize_t k, n = ends.shape[0]
        out = np.empty(n, dtype=np.int64)
        cdef int64_t[::1] ov = out
        cdef int64_t prev = start
        cdef const uint8_t* base = &buf[0] if buf.shape[0] > 0 else NULL
        with nogil:
            for k in range(n):
                ov[k] = self._lookup(base + prev, ends[k] - prev)
                prev = ends[k]
        return out


cdef inline Py_ssize_t _next_end(int pattern_id, const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    if pattern_id == PATTERN_GPT2:
        return _next_gpt2(s, i, n)
    if pattern_id == PATTERN_CL100K:
        return _next_cl100k(s, i, n)
    return _next_o200k(s, i, n)


#: Appended to the word ids of a unit whose region looks encoded (``chunk_unit_stream`` with
#: ``word_classes``): ``superbpe.stage2_table`` strips the mark and gives such units no weight. No word
#: id reaches it.
