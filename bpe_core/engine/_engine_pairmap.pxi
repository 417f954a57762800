# _engine.pyx, part 2 of 6 (``include``d: compiled into the module as if written there).
# The pair hash map (_PairMap): packed pair -> pair id, open addressing in segments; the keys live in
# the engine's pair records, not in the map.

# ==== Pair hash map ===========================================================================
# Open addressing, linear probing, load <= 0.7, in SEGMENTS tables of any count of slots each: the
# top SEG_BITS bits of a key's hash pick its segment, the next 32 bits its home slot there (scaled to
# the segment's slots: ``(bits * n) >> 32``, a multiply, not a modulo). A slot holds a pair id and a
# 32-bit tag of its key (a second hash), 8 bytes: the key itself is the pair record's
# (``keys[pid]``, passed to every call), read only when the tag matches, and the caller reads that
# record's count next anyway (``PairRec``: key and count side by side, one cache line). The slots
# held the key beside the id before (12 bytes, the key stored twice): 341 MiB of slots for 17.3 M
# pairs at 200k merges on the 15 GB synthetic corpus, 227 now. A slot is empty when its id is
# EMPTY_PID. Pairs are never deleted by a merge (a merged pair keeps its id with count 0), so no
# tombstones are needed (``remove``, for pruning, shifts the later keys of a run back instead).
#
# Why segments of any size: a segment that is full grows by half on its own, holding its old and new
# slots together for a moment, so growing never holds more than a 1/64 of the map twice; and the map
# can be sized once for the pairs the plan expects (``reserve``), not to the next power of two. A
# single power-of-two table held its old and new slots together at every doubling: 192 MiB beside a
# 384 MiB map for 12.1 M pairs at 100k merges on the 15 GB synthetic corpus, the merge phase's peak
# (``runtime.budget.pair_tables_peak``); sized for 13.2 M pairs the segments hold 216 MiB. With a
# power-of-two count of slots a segment's home slot is the one a single table of the same total size
# would use (the tests' ``_home``); a run that reaches a segment's last slot wraps to its first.

cdef struct Slot:
    uint32_t tag        # _tag(key)
    pair_id_t value     # pair id; EMPTY_PID: an empty slot


cdef pair_id_t EMPTY_PID = 0xFFFFFFFFu


cdef struct PairSeg:
    Slot* slots
    uint64_t n          # slots
    uint64_t size       # keys
    uint64_t limit      # grow past this many keys (7/10 of the slots)


cdef enum:
    SEG_BITS = 6
    SEGMENTS = 1 << SEG_BITS
    SEG_MIN_SLOTS = 16                  # at least 16 slots a segment (1024 in all)

# A segment of this many bytes or more is its own mapping (given back whole when it grows: a freed
# block of the malloc heap may stay in the process).
cdef size_t SEG_MMAP_BYTES = 1 << 20

cdef extern from "<sys/mman.h>" nogil:
    void* mmap(void* addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void* addr, size_t length)
    int PROT_READ
    int PROT_WRITE
    int MAP_PRIVATE
    int MAP_ANONYMOUS
    void* MAP_FAILED

cdef extern from "<stdlib.h>" nogil:
    void abort()


cdef Slot* _slots_new(uint64_t n) noexcept nogil:
    """``n`` empty slots (id EMPTY_PID; every byte 0xFF): a mapping of their own when large. Out of
    memory aborts, as the vector that held them did (``std::bad_alloc`` in a ``noexcept`` function)."""
    cdef size_t nbytes = n * sizeof(Slot)
    cdef void* p
    if nbytes >= SEG_MMAP_BYTES:
        p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if p == MAP_FAILED:
            abort()
    else:
        p = malloc(nbytes)
        if p == NULL:
            abort()
    memset(p, 0xFF, nbytes)
    return <Slot*>p


cdef void _slots_free(Slot* p, uint64_t n) noexcept nogil:
    cdef size_t nbytes = n * sizeof(Slot)
    if p == NULL:
        return
    if nbytes >= SEG_MMAP_BYTES:
        munmap(p, nbytes)
    else:
        free(p)


cdef inline uint64_t _seg_of(uint64_t h) noexcept nogil:
    return h >> (64 - SEG_BITS)


cdef inline uint64_t _home(uint64_t h, uint64_t n) noexcept nogil:
    """The home slot of hash ``h`` in a segment of ``n`` slots: the 32 bits after the segment's, scaled."""
    return (((h << SEG_BITS) >> 32) * n) >> 32


cdef inline uint64_t _hash(pair_key_t key) noexcept nogil:
    return key * <uint64_t>0x9E3779B97F4A7C15u


cdef inline uint32_t _tag(pair_key_t key) noexcept nogil:
    """32 bits of a second hash of the key (its own multiplier, both halves mixed first: the home
    slot comes from other bits of another product, so keys in one run rarely share a tag)."""
    return <uint32_t>(((key ^ (key >> 29)) * <uint64_t>0xC2B2AE3D27D4EB4Fu) >> 32)


cdef class _PairMap:
    """Packed pair -> pair id. Every method that looks at keys takes ``keys``, the keys by pair id
    (``keys[pid]`` is the key of pair ``pid``; a ``PairRec`` array read through its first field, or
    plain keys: ``stride`` keys apart)."""
    cdef PairSeg segs[SEGMENTS]
    cdef vector[pair_key_t] own_keys    # the keys of the Python methods' pairs (tests), by value
    cdef uint32_t tag_mask              # the tags' bits kept (tests: 0, every key's tag the same)

    def __cinit__(self, uint64_t capacity=1024):
        cdef uint64_t cap = 1024
        cdef int s
        self.tag_mask = 0xFFFFFFFFu
        while cap * 7 < 10 * capacity:
            cap <<= 1
        for s in range(SEGMENTS):
            self.segs[s].slots = NULL
        for s in range(SEGMENTS):
            _seg_alloc(&self.segs[s], cap >> SEG_BITS)

    def __dealloc__(self):
        cdef int s
        for s in range(SEGMENTS):
            _slots_free(self.segs[s].slots, self.segs[s].n)
            self.segs[s].slots = NULL

    cdef inline void prefetch(self, pair_key_t key) noexcept nogil:
        cdef uint64_t h = _hash(key)
        cdef PairSeg* g = &self.segs[_seg_of(h)]
        __builtin_prefetch(&g.slots[_home(h, g.n)])

    cdef inline int64_t get(self, pair_key_t key, const pair_key_t* keys, size_t stride) noexcept nogil:
        """The pair id of ``key`` or -1 (``keys[pid * stride]``: the key of pair ``pid``)."""
        cdef uint64_t h = _hash(key)
        cdef uint32_t t = _tag(key) & self.tag_mask
        cdef PairSeg* g = &self.segs[_seg_of(h)]
        cdef uint64_t i = _home(h, g.n)
        cdef pair_id_t v
        while True:
            v = g.slots[i].value
            if v == EMPTY_PID:
                return -1
            if g.slots[i].tag == t and keys[<size_t>v * stride] == key:
                return v
            i += 1
            if i == g.n:
                i = 0

    cdef inline void put(self, pair_key_t key, pair_id_t value, const pair_key_t* keys, size_t stride) noexcept nogil:
        """Insert a key known to be absent (``keys``: the keys of the pairs already in, read when
        the segment grows)."""
        cdef uint64_t h = _hash(key)
        cdef PairSeg* g = &self.segs[_seg_of(h)]
        if g.size + 1 > g.limit:
            _seg_resize(g, g.n + g.n // 2, keys, stride)
        _seg_place(g, h, _tag(key) & self.tag_mask, value)
        g.size += 1

    cdef void reserve(self, uint64_t n_keys, const pair_key_t* keys, size_t stride) noexcept nogil:
        """Make room for ``n_keys`` keys in all (each segment for its share, a 7/10 load, with a
        margin of 4 standard deviations of a share: keys spread over the segments at random), so
        the map does not grow before it holds them. Never shrinks."""
        cdef double share = <double>n_keys / SEGMENTS
        cdef uint64_t need = <uint64_t>((share + 4.0 * sqrt(share) + 1.0) * 10.0 / 7.0) + 1
        cdef int s
        for s in range(SEGMENTS):
            if need > self.segs[s].n:
                _seg_resize(&self.segs[s], need, keys, stride)

    cdef void remove(self, pair_key_t key, const pair_key_t* keys, size_t stride) noexcept nogil:
        """Remove a key if present (backward-shift deletion: the later keys of its run move up, so
        no tombstone is left and every lookup still stops at the first empty slot). ``keys`` still
        holds the removed pair's key."""
        cdef uint64_t h = _hash(key)
        cdef uint32_t t = _tag(key) & self.tag_mask
        cdef PairSeg* g = &self.segs[_seg_of(h)]
        cdef uint64_t i = _home(h, g.n), j, k
        while not (g.slots[i].tag == t and g.slots[i].value != EMPTY_PID
                   and keys[<size_t>g.slots[i].value * stride] == key):
            if g.slots[i].value == EMPTY_PID:
                return
            i += 1
            if i == g.n:
                i = 0
        j = i
        while True:
            j += 1
            if j == g.n:
                j = 0
            if g.slots[j].value == EMPTY_PID:
                break
            k = _home(_hash(keys[<size_t>g.slots[j].value * stride]), g.n)
            # the key at j may move to i when its home k is not cyclically in (i, j]
            if (j > i and (k <= i or k > j)) or (j < i and (k <= i and k > j)):
                g.slots[i] = g.slots[j]
                i = j
        g.slots[i].tag = 0xFFFFFFFFu
        g.slots[i].value = EMPTY_PID
        g.size -= 1

    cdef uint64_t nbytes(self) noexcept nogil:
        cdef uint64_t n = 0
        cdef int s
        for s in range(SEGMENTS):
            n += self.segs[s].n * sizeof(Slot)
        return n

    # Python access for the tests (tests/engine/test_engine_prune.py: the map against a dict); the
    # keys of these pairs are kept here, by value (small values only)
    cdef const pair_key_t* _own(self):
        return self.own_keys.data()

    def py_put(self, pair_key_t key, pair_id_t value):
        if value == EMPTY_PID or value > (1 << 24):
            raise ValueError("value out of the tests' range")
        if self.get(key, self._own(), 1) >= 0:
            raise KeyError(key)
        if value < self.own_keys.size() and self.own_keys[value] != EMPTY_KEY \
                and self.get(self.own_keys[value], self._own(), 1) == value:
            raise ValueError(f"value {value} is another key's")
        if value >= self.own_keys.size():
            self.own_keys.resize(value + 1, EMPTY_KEY)
        self.own_keys[value] = key
        self.put(key, value, self._own(), 1)

    def py_same_tags(self):
        """Give every key the same tag from now on (tests: each lookup then tells keys apart by
        the keys themselves). Only on an empty map."""
        if self.py_len():
            raise ValueError("py_same_tags: the map holds keys")
        self.tag_mask = 0

    def py_get(self, pair_key_t key):
        return self.get(key, self._own(), 1)

    def py_remove(self, pair_key_t key):
        self.remove(key, self._own(), 1)

    def py_reserve(self, uint64_t n_keys):
        self.reserve(n_keys, self._own(), 1)

    def py_len(self):
        cdef uint64_t n = 0
        cdef int s
        for s in range(SEGMENTS):
            n += self.segs[s].size
        return n

    def py_nbytes(self):
        """Bytes of slots held now (every segment)."""
        return self.nbytes()

    def py_segment_slots(self):
        """The slots of each segment (tests)."""
        return [self.segs[s].n for s in range(SEGMENTS)]


cdef void _seg_alloc(PairSeg* g, uint64_t n) noexcept nogil:
    if n < SEG_MIN_SLOTS:
        n = SEG_MIN_SLOTS
    g.slots = _slots_new(n)
    g.n = n
    g.size = 0
    g.limit = n * 7 // 10


cdef inline void _seg_place(PairSeg* g, uint64_t h, uint32_t tag, pair_id_t value) noexcept nogil:
    cdef uint64_t i = _home(h, g.n)
    while g.slots[i].value != EMPTY_PID:
        i += 1
        if i == g.n:
            i = 0
    g.slots[i].tag = tag
    g.slots[i].value = value


cdef void _seg_resize(PairSeg* g, uint64_t n, const pair_key_t* keys, size_t stride) noexcept nogil:
    """Place a segment's keys again in ``n`` slots (more than it holds), then give its old slots back:
    only this segment is held twice meanwhile. The home of a key comes from ``keys`` (its tag stays)."""
    cdef Slot* old = g.slots
    cdef uint64_t n_old = g.n, size = g.size, j
    _seg_alloc(g, n)
    g.size = size
    for j in range(n_old):
        if old[j].value != EMPTY_PID:
            _seg_place(g, _hash(keys[<size_t>old[j].value * stride]), old[j].tag, old[j].value)
    _slots_free(old, n_old)
