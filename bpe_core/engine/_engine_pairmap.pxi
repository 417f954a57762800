# _engine.pyx, part 2 of 5 (``include``d: compiled into the module as if written there).
# The pair hash map (_PairMap): packed pair -> pair id, open addressing.

# ==== Pair hash map ===========================================================================
# Open addressing, linear probing, power-of-two capacity, load <= 0.7. A slot holds the packed pair
# and its pair id side by side (12 bytes, packed), so a probe touches one cache line. Pairs are never
# deleted (a merged pair keeps its id with count 0), so no tombstones are needed.

cdef packed struct Slot:
    pair_key_t key
    pair_id_t value


cdef class _PairMap:
    cdef vector[Slot] slots
    cdef uint64_t mask
    cdef uint64_t size
    cdef uint64_t limit
    cdef int shift

    def __cinit__(self, uint64_t capacity=1024):
        cdef uint64_t cap = 1024
        cdef int bits = 10
        cdef Slot empty
        empty.key = EMPTY_KEY
        empty.value = 0
        while cap * 7 < 10 * capacity:
            cap <<= 1
            bits += 1
        self.slots.assign(cap, empty)
        self.mask = cap - 1
        self.shift = 64 - bits
        self.size = 0
        self.limit = cap * 7 // 10

    cdef inline uint64_t _slot(self, pair_key_t key) noexcept nogil:
        return ((key * <uint64_t>0x9E3779B97F4A7C15u) >> self.shift) & self.mask

    cdef inline void prefetch(self, pair_key_t key) noexcept nogil:
        __builtin_prefetch(&self.slots[self._slot(key)])

    cdef inline int64_t get(self, pair_key_t key) noexcept nogil:
        """The pair id of ``key`` or -1."""
        cdef uint64_t i = self._slot(key)
        while True:
            if self.slots[i].key == key:
                return self.slots[i].value
            if self.slots[i].key == EMPTY_KEY:
                return -1
            i = (i + 1) & self.mask

    cdef inline void put(self, pair_key_t key, pair_id_t value) noexcept nogil:
        """Insert a key known to be absent."""
        cdef uint64_t i
        if self.size + 1 > self.limit:
            self._grow()
        i = self._slot(key)
        while self.slots[i].key != EMPTY_KEY:
            i = (i + 1) & self.mask
        self.slots[i].key = key
        self.slots[i].value = value
        self.size += 1

    cdef void _grow(self) noexcept nogil:
        cdef vector[Slot] old
        cdef uint64_t j, i, cap
        cdef Slot empty
        empty.key = EMPTY_KEY
        empty.value = 0
        old.swap(self.slots)
        cap = (self.mask + 1) * 2
        self.slots.assign(cap, empty)
        self.mask = cap - 1
        self.shift -= 1
        self.limit = cap * 7 // 10
        for j in range(old.size()):
            if old[j].key != EMPTY_KEY:
                i = self._slot(old[j].key)
                while self.slots[i].key != EMPTY_KEY:
                    i = (i + 1) & self.mask
                self.slots[i] = old[j]

    cdef void remove(self, pair_key_t key) noexcept nogil:
        """Remove a key if present (backward-shift deletion: the later keys of its run move up, so
        no tombstone is left and every lookup still stops at the first empty slot)."""
        cdef uint64_t i = self._slot(key), j, k
        while self.slots[i].key != key:
            if self.slots[i].key == EMPTY_KEY:
                return
            i = (i + 1) & self.mask
        j = i
        while True:
            j = (j + 1) & self.mask
            if self.slots[j].key == EMPTY_KEY:
                break
            k = self._slot(self.slots[j].key)
            # the key at j may move to i when its home k is not cyclically in (i, j]
            if (j > i and (k <= i or k > j)) or (j < i and (k <= i and k > j)):
                self.slots[i] = self.slots[j]
                i = j
        self.slots[i].key = EMPTY_KEY
        self.slots[i].value = 0
        self.size -= 1

    cdef uint64_t nbytes(self) noexcept nogil:
        return self.slots.capacity() * sizeof(Slot)

    # Python access for the tests (tests/test_engine_prune.py: the map against a dict)
    def py_put(self, pair_key_t key, pair_id_t value):
        if key == EMPTY_KEY:
            raise ValueError("the empty key")
        if self.get(key) >= 0:
            raise KeyError(key)
        self.put(key, value)

    def py_get(self, pair_key_t key):
        return self.get(key)

    def py_remove(self, pair_key_t key):
        self.remove(key)

    def py_len(self):
        return self.size

