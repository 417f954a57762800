# _pretok.pyx, part 5 of 11 (``include``d: compiled into the module as if written there).
# Counting, part two: the plain count (WordCounter: a front cache, a short table, a long table) and
# the counting of a span.

# ---- The plain count: a front cache, a short table, a long table ----
#
# Words of up to 15 bytes (BPE_SHORT_MAX, nearly every pretoken) are counted in two structures, words
# of 16 or more in the CountTable above (``_table_add``: an entry that points back into the buffer).
#
# - The short table: open addressing with linear probing, each 32-byte slot holding a word's first
#   16 bytes (zero-padded), its length and its count inline, so a lookup touches one cache line and
#   follows no pointer. At most 3/4 full (a probe run of a few slots stays in a line or two, and
#   the table holding every unique word is the largest thing a worker allocates); it doubles when a
#   batch would pass that.
# - The front cache: a small direct-mapped array (FRONT_SLOTS, in L2) in front of it. A slot holds
#   a word's key (its head words, the length in the top byte: _count_front.h), its slot number in
#   the short table and the counts not yet added there; a hit is an increment. A miss is counted in
#   the short table; then it takes the front slot only when the word there has aged out: a slot's
#   age is the hits its word had since the last miss that came to the slot, at most FRONT_AGE_CAP,
#   and each miss that finds it over 0 takes one off and leaves the word where it is. So a word seen
#   once does not push out a frequent one (64 MB chunks of the synthetic corpus: misses 12.5-12.8%
#   of the pretokens -> 10.1-10.4%, evictions, each a write to a far short slot, 12.4-12.7% ->
#   3.5-3.6%; the count ~5% less CPU). The word it evicts has its pending counts
#   added to its short slot (a direct index, no lookup). Before the short table grows (its slot
#   numbers change) and at the end, every pending count is added and the front cache emptied. Counts
#   are sums: where and in what order they arrive changes nothing, so the policy is free to choose.


cdef enum:
    FRONT_SLOTS = 32768  # at most (1 MiB); fewer for a small input
    FRONT_AGE_CAP = 15   # a front slot's age after a miss (misses it can turn away before it goes)
    SHORT_MIN_SLOTS = 64
    SHORT_START_SLOTS = 1 << 18  # at most, to begin with (8 MiB; a slot per 64 bytes of input)


cdef inline uint64_t _short_hash(uint64_t w0, uint64_t w1, Py_ssize_t length) noexcept nogil:
    """``_hash`` of a word of up to 16 bytes (its head words say it all; the short table's are up to 15)."""
    cdef uint64_t h = (w0 * 0x9E3779B97F4A7C15ULL) ^ ((w1 + <uint64_t>length) * 0xC2B2AE3D27D4EB4FULL)
    h ^= h >> 32
    h *= 0xD6E8FEB86659FD93ULL
    h ^= h >> 32
    return h


cdef int _counter_init(WordCounter* c, Py_ssize_t n_bytes) noexcept nogil:
    """Structures sized to the input (a small input, small ones); 0, or -1 when out of memory."""
    cdef Py_ssize_t n_front = 64, n_short = SHORT_MIN_SLOTS
    while n_front < FRONT_SLOTS and n_front < n_bytes // 32:
        n_front *= 2
    while n_short < SHORT_START_SLOTS and n_short < n_bytes // 64:
        n_short *= 2
    c.front = <FrontSlot*>bpe_lines_alloc(n_front * sizeof(FrontSlot))  # a slot never straddles two lines
    c.front_mask = n_front - 1
    c.short.slots = <ShortSlot*>bpe_table_alloc(n_short * sizeof(ShortSlot))
    c.short.mask = n_short - 1
    c.short.n_words = 0
    if _table_init(&c.long, 64) != 0 or c.front == NULL or c.short.slots == NULL:
        return -1
    return 0


cdef class CountScratch:
    """A counting worker's front cache and short table, kept from one ``count_pretokens`` call to the
    next (its ``scratch=``) instead of allocated anew for every chunk.

    A fresh table costs the kernel a page fault and a zeroed page (a huge page: 2 MiB) for every
    page before the counter's own zeroing, and each chunk grew it again from its starting size
    (8 MiB), rehashing every word at each doubling: on 64 MB chunks of the synthetic corpus (~390k
    words, a 32 MiB table) the zeroed pages alone were ~10% of a worker's CPU. Kept, the table is
    reset with one ``memset`` over pages already mapped, and starts at the size the last chunk
    needed. Counts do not depend on the table's size (a larger table only spreads the same words).

    One holder at a time: a call takes the memory out (the scratch is empty while it counts) and
    puts it back when done (also after an error). ``nbytes`` is the memory it holds; ``clear()``
    frees it.
    """
    cdef FrontSlot* front
    cdef uint64_t front_mask
    cdef ShortSlot* slots
    cdef Py_ssize_t mask

    def __cinit__(self):
        self.front = NULL
        self.slots = NULL
        self.front_mask = 0
        self.mask = 0

    def __dealloc__(self):
        self.clear()

    def clear(self):
        """Free the memory held (the next call allocates afresh)."""
        free(self.front)
        free(self.slots)
        self.front = NULL
        self.slots = NULL

    @property
    def nbytes(self):
        """Bytes held: the front cache and the short table."""
        return ((self.front_mask + 1) * sizeof(FrontSlot) if self.front != NULL else 0) + \
            ((self.mask + 1) * sizeof(ShortSlot) if self.slots != NULL else 0)


cdef int _counter_take(WordCounter* c, Py_ssize_t n_bytes, CountScratch scratch) noexcept nogil:
    """``_counter_init`` reusing what ``scratch`` holds (its front cache when it has the size this
    input wants; its short table when it has at least the starting size), zeroed here."""
    cdef Py_ssize_t n_front = 64, n_short = SHORT_MIN_SLOTS
    while n_front < FRONT_SLOTS and n_front < n_bytes // 32:
        n_front *= 2
    while n_short < SHORT_START_SLOTS and n_short < n_bytes // 64:
        n_short *= 2
    if scratch.front != NULL and <Py_ssize_t>scratch.front_mask + 1 == n_front:
        c.front = scratch.front
        c.front_mask = scratch.front_mask
        memset(c.front, 0, n_front * sizeof(FrontSlot))
    else:
        free(scratch.front)
        c.front = <FrontSlot*>bpe_lines_alloc(n_front * sizeof(FrontSlot))
        c.front_mask = n_front - 1
    scratch.front = NULL
    if scratch.slots != NULL and scratch.mask + 1 >= n_short:
        c.short.slots = scratch.slots
        c.short.mask = scratch.mask
        memset(c.short.slots, 0, (c.short.mask + 1) * sizeof(ShortSlot))
    else:
        free(scratch.slots)
        c.short.slots = <ShortSlot*>bpe_table_alloc(n_short * sizeof(ShortSlot))
        c.short.mask = n_short - 1
    scratch.slots = NULL
    c.short.n_words = 0
    if _table_init(&c.long, 64) != 0 or c.front == NULL or c.short.slots == NULL:
        return -1
    return 0


cdef void _counter_give(WordCounter* c, CountScratch scratch) noexcept nogil:
    """``_counter_free``, the front cache and the short table kept in ``scratch`` (not zeroed: the
    next ``_counter_take`` does it)."""
    free(scratch.front)
    free(scratch.slots)
    scratch.front = c.front
    scratch.front_mask = c.front_mask
    scratch.slots = c.short.slots
    scratch.mask = c.short.mask
    c.front = NULL
    c.short.slots = NULL
    _table_free(&c.long)


cdef void _counter_free(WordCounter* c) noexcept nogil:
    free(c.front)
    free(c.short.slots)
    c.front = NULL
    c.short.slots = NULL
    _table_free(&c.long)


cdef void _front_drain(WordCounter* c) noexcept nogil:
    """Add every front slot's pending counts to its short slot and empty the front cache."""
    cdef Py_ssize_t k
    cdef FrontSlot* f
    for k in range(<Py_ssize_t>c.front_mask + 1):
        f = &c.front[k]
        if f.pending != 0:
            c.short.slots[f.idx].count += f.pending
    memset(c.front, 0, (c.front_mask + 1) * sizeof(FrontSlot))


cdef int _short_grow(WordCounter* c) noexcept nogil:
    """Double the short table (the front cache is drained first: its slot numbers change)."""
    cdef Py_ssize_t cap = (c.short.mask + 1) * 2, k, idx
    cdef ShortSlot* old = c.short.slots
    cdef ShortSlot* slots
    if cap > (<Py_ssize_t>1 << 32):  # slot numbers are uint32 in the front cache
        return -1
    slots = <ShortSlot*>bpe_table_alloc(cap * sizeof(ShortSlot))
    if slots == NULL:
        return -1
    _front_drain(c)
    for k in range(c.short.mask + 1):
        if old[k].length != 0:
            idx = _short_hash(old[k].w0, old[k].w1, <Py_ssize_t>old[k].length) & (cap - 1)
            while slots[idx].length != 0:
                idx = (idx + 1) & (cap - 1)
            slots[idx] = old[k]
    free(old)
    c.short.slots = slots
    c.short.mask = cap - 1
    return 0


cdef bint _FRONT_AGING = True  # set_front_aging(False): every miss takes its slot (tests, benchmarks)


def set_front_aging(bint on):
    """Whether a front slot's age turns misses away (the default) or every miss takes its slot (a
    plain direct-mapped cache, as before): for the tests, which count with both (the counts do not
    depend on it), and for A/B measurements in one process. Returns the previous setting.

    >>> set_front_aging(True)
    True
    """
    global _FRONT_AGING
    was = _FRONT_AGING
    _FRONT_AGING = on
    return was


cdef int _flush_short(WordCounter* c, const ShortPending* queue, Py_ssize_t n_pending) noexcept nogil:
    """Count a batch of front-cache misses in the short table; each word then takes its front slot,
    or leaves the word there one miss older (its age over 0: see "The plain count" above).

    The short slots were requested when the misses were found (and the evicted words' slots), so
    the cache misses of a batch overlap.
    """
    cdef Py_ssize_t k, idx
    cdef uint64_t mask
    cdef uint32_t age
    cdef bint empty
    cdef ShortSlot* e
    cdef FrontSlot* f
    cdef const ShortPending* q
    if 4 * (c.short.n_words + n_pending) > 3 * (c.short.mask + 1):  # at most 3/4 full
        if _short_grow(c) != 0:
            return -1
    mask = c.short.mask
    for k in range(n_pending):
        q = &queue[k]
        idx = q.h & mask
        e = &c.short.slots[idx]
        empty = e.length == 0
        if not (empty or (e.w0 == q.w0 and e.w1 == q.w1 and e.length == q.length)):
            while True:  # the first slot holds another word: probe on
                idx = (idx + 1) & mask
                e = &c.short.slots[idx]
                empty = e.length == 0
                if empty or (e.w0 == q.w0 and e.w1 == q.w1 and e.length == q.length):
                    break
        # The word's slot, empty or its own: the same writes either way (no branch on which; an
        # empty slot's count is 0).
        e.w0 = q.w0
        e.w1 = q.w1
        e.length = q.length
        e.count += 1
        c.short.n_words += empty
        f = &c.front[q.front]
        age = <uint32_t>f.pending - f.base  # hits since the last miss here (an empty slot: 0)
        if age != 0 and _FRONT_AGING:  # its word stays, one miss older (at most FRONT_AGE_CAP)
            f.base = <uint32_t>f.pending - (age - 1 if age - 1 < FRONT_AGE_CAP else FRONT_AGE_CAP)
            continue
        c.short.slots[f.idx].count += f.pending  # the evicted word's counts (an empty slot: 0 to slot 0)
        f.w0 = q.w0
        f.w1 = q.w1 | (<uint64_t>q.length << 56)  # the key of bpe_front_count
        f.base = 0
        f.idx = <uint32_t>idx
        f.pending = 0
    return 0


cdef Py_ssize_t _key_ends(int pattern_id, const uint8_t* s, Py_ssize_t* pos, Py_ssize_t n,
                          const uint8_t* limit, const WordCounter* c, int64_t* ends, uint64_t* keys,
                          uint32_t* fronts) noexcept nogil:
    """``_split_ends`` (same ends, SCAN_CAP or up to 62 more), each pretoken keyed for the front cache
    as it is found (``bpe_cf_window``, ``bpe_cf_key``): its key and front slot (requested)."""
    cdef Py_ssize_t i = pos[0], a
    cdef size_t n_ends = 0, k
    cdef int64_t stop = 0
    cdef const bpe_front_slot* front = <const bpe_front_slot*>c.front
    cdef uint64_t mask = c.front_mask
    if pattern_id == PATTERN_GPT2:
        while i < n and n_ends < SCAN_CAP:
            if _WINDOWS and i >= stop and n - i >= 64:
                k = bpe_cf_window(PATTERN_GPT2, s, i, &stop, limit, front, mask, ends, keys, fronts, n_ends)
                if k > n_ends:
                    n_ends = k
                    i = ends[n_ends - 1]
                    continue
            a = i
            if _ascii_letter(s[i]):  # as in _split_ends
                i = _run_letters(s, i + 1, n)
            elif s[i] == SPACE and i + 1 < n and _ascii_letter(s[i + 1]):
                i = _run_letters(s, i + 2, n)
            else:
                i = _end_gpt2(s, i, n)
            bpe_cf_key(s + a, i - a, limit, front, mask, keys, fronts, n_ends)
            ends[n_ends] = i
            n_ends += 1
    elif pattern_id == PATTERN_CL100K:
        while i < n and n_ends < SCAN_CAP:
            if _WINDOWS and i >= stop and n - i >= 64:
                k = bpe_cf_window(PATTERN_CL100K, s, i, &stop, limit, front, mask, ends, keys, fronts,
                                  n_ends)
                if k > n_ends:
                    n_ends = k
                    i = ends[n_ends - 1]
                    continue
            a = i
            if _ascii_letter(s[i]):
                i = _run_letters(s, i + 1, n)
            elif s[i] == SPACE and i + 1 < n and _ascii_letter(s[i + 1]):
                i = _run_letters(s, i + 2, n)
            else:
                i = _end_cl100k(s, i, n)
            bpe_cf_key(s + a, i - a, limit, front, mask, keys, fronts, n_ends)
            ends[n_ends] = i
            n_ends += 1
    else:
        while i < n and n_ends < SCAN_CAP:
            if _WINDOWS and i >= stop and n - i >= 64:
                k = bpe_cf_window(PATTERN_O200K, s, i, &stop, limit, front, mask, ends, keys, fronts,
                                  n_ends)
                if k > n_ends:
                    n_ends = k
                    i = ends[n_ends - 1]
                    continue
            a = i
            i = _end_o200k(s, i, n)
            bpe_cf_key(s + a, i - a, limit, front, mask, keys, fronts, n_ends)
            ends[n_ends] = i
            n_ends += 1
    pos[0] = i
    return n_ends


cdef int _count_span(int pattern_id, const uint8_t* s, Py_ssize_t i, Py_ssize_t n,
                     const uint8_t* limit, WordCounter* c) noexcept nogil:
    """Count the pretokens of s[i:n] into c (its front cache keeps pending counts: ``_counter_drain``).

    The pretokens come from ``_key_ends`` (``_split_ends`` keying each pretoken for the front cache
    as it is found, and requesting its front slot), SCAN_CAP or a few more at a time, and are looked
    up in a second pass (``bpe_front_hits``), so the slots' cache misses overlap with the scanning
    and with each other. Misses queue for the short table
    (``_flush_short``) BATCH at a time, each batch flushed when the next one is full (its slots were
    requested a batch earlier); longer words queue for the long table (``_flush``).
    """
    cdef ShortPending queues[2][BATCH]
    cdef ShortPending* queue = queues[0]
    cdef ShortPending* older = queues[1]
    cdef ShortPending* swap
    cdef Py_ssize_t n_older = 0
    cdef Pending long_queue[BATCH]
    cdef int64_t ends[SCAN_CAP + 64]
    cdef uint64_t heads[2 * (SCAN_CAP + 64)]
    cdef uint32_t fronts[SCAN_CAP + 64]
    cdef uint32_t misses[SCAN_CAP + 64]
    cdef Py_ssize_t j, k, got, n_misses, length, start = i, n_pending = 0, n_long = 0
    cdef int64_t a
    cdef uint64_t w0, w1, h
    cdef FrontSlot* f
    cdef ShortPending* q
    while i < n:
        got = _key_ends(pattern_id, s, &i, n, limit, c, ends, heads, fronts)
        n_misses = bpe_front_hits(heads, fronts, got, <bpe_front_slot*>c.front, misses)
        for j in range(n_misses):
            k = misses[j]
            a = ends[k - 1] if k > 0 else start
            length = ends[k] - a
            if length <= BPE_SHORT_MAX:
                w0 = heads[2 * k]
                w1 = heads[2 * k + 1] & 0x00FFFFFFFFFFFFFFULL  # without the length tag
                f = &c.front[fronts[k]]
                bpe_prefetch(&c.short.slots[f.idx])  # where its evicted word's counts go (_flush_short)
                h = _short_hash(w0, w1, length)
                bpe_prefetch(&c.short.slots[h & c.short.mask])
                bpe_prefetch(&c.short.slots[(h + 1) & c.short.mask])  # its probe's next slot
                q = &queue[n_pending]
                q.w0 = w0
                q.w1 = w1
                q.h = h
                q.length = length
                q.front = fronts[k]
                n_pending += 1
                if n_pending == BATCH:
                    # Flush the batch before this one: its slots have had a batch's time to
                    # arrive; this one waits its turn.
                    if _flush_short(c, older, n_older) != 0:
                        return -1
                    swap = older
                    older = queue
                    queue = swap
                    n_older = n_pending
                    n_pending = 0
            else:
                _pend(&long_queue[n_long], s + a, length, limit, &c.long)
                n_long += 1
                if n_long == BATCH:
                    if _flush(&c.long, long_queue, n_long) != 0:
                        return -1
                    n_long = 0
        if got > 0:
            start = ends[got - 1]
    if _flush_short(c, older, n_older) != 0 or _flush_short(c, queue, n_pending) != 0:
        return -1
    return _flush(&c.long, long_queue, n_long)


cdef void _counter_drain(WordCounter* c) noexcept nogil:
    """Add the front cache's pending counts to the short table (before it is read)."""
    _front_drain(c)
