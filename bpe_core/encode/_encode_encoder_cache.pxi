# _encode.pyx, part 5b of 10 (``include``d: compiled into the module as if written there).
# The Encoder's pretoken cache: its slots and arena (alloc, find, insert, grow, clear), the
# insert of a batch job's shared cache and the room made for it, absorbing and copying another
# encoder's cache. Module-level functions over an ``Encoder`` (the class keeps the methods
# Python calls, as thin wrappers over these).

# ==== The pretoken cache =====================================================================


cdef int _slots_alloc(Encoder enc, Py_ssize_t n_slots) noexcept nogil:
    """Fresh zeroed slots, aligned to 64 bytes so a slot never straddles two cache lines (in
    huge pages from 2 MiB up: ``calloc_huge``)."""
    cdef void* mem = calloc_huge(n_slots * sizeof(CacheSlot) + 64)
    if mem == NULL:
        return -1
    free(enc.slots_mem)
    enc.slots_mem = mem
    enc.slots = <CacheSlot*>((<uintptr_t>mem + 63) & ~(<uintptr_t>63))
    enc.n_slots = n_slots
    enc.cache_mask = <uint64_t>(n_slots - 1)
    enc.cache_shift = 64
    while n_slots > 1:
        n_slots >>= 1
        enc.cache_shift -= 1
    return 0


cdef inline const uint8_t* _slot_tail(Encoder enc, const CacheSlot* sl) noexcept nogil:
    """The key bytes after the first 8 of a slot whose key is longer than 8 bytes."""
    cdef uint32_t n_ids = sl.meta & 0xFFF
    return enc.arena + sl.off + (n_ids * sizeof(token_id_t) if n_ids > INLINE_IDS else 0)


cdef inline CacheSlot* _cache_find(Encoder enc, const uint8_t* p, Py_ssize_t n, uint64_t w0,
                                   uint64_t h) noexcept nogil:
    """The slot holding pretoken ``p[0:n]`` (head word w0, hash h), or NULL."""
    return _find_slot(enc.slots, enc.cache_mask, enc.cache_shift, enc.arena, p, n, w0, h, p + n)


cdef int _cache_insert(Encoder enc, const uint8_t* p, Py_ssize_t n, uint64_t w0, uint64_t h,
                       const token_id_t* ids, Py_ssize_t n_ids) noexcept nogil:
    """Remember ``p[0:n] -> ids``; clears the cache first when it is full. 0, or -1 (no memory:
    the entry is simply not cached)."""
    cdef Py_ssize_t record = 0, cap
    cdef uint64_t slot
    cdef CacheSlot* sl
    cdef uint8_t* grown
    if n_ids > INLINE_IDS:
        record += n_ids * sizeof(token_id_t)
    if n > 8:
        record += n - 8
    record = (record + 3) & ~(<Py_ssize_t>3)         # records start 4-byte aligned
    if enc.n_entries >= enc.max_entries or enc.arena_size + record > ARENA_MAX:
        _cache_clear(enc)
    elif 3 * (enc.n_entries + 1) > 2 * enc.n_slots:
        if _cache_grow(enc) < 0:
            return -1
    if record and enc.arena_size + record > enc.arena_cap:
        cap = max(2 * enc.arena_cap, enc.arena_size + record, <Py_ssize_t>(64 << 10))
        grown = <uint8_t*>realloc(enc.arena, cap + ARENA_SLACK)
        if grown == NULL:
            return -1
        enc.arena = grown
        enc.arena_cap = cap
    slot = h >> enc.cache_shift
    while enc.slots[slot].meta != 0:
        slot = (slot + 1) & enc.cache_mask
    sl = &enc.slots[slot]
    sl.w0 = w0
    sl.meta = (<uint32_t>n << 12) | <uint32_t>n_ids
    sl.off = <uint32_t>enc.arena_size
    memset(sl.ids, 0, sizeof(sl.ids))
    if n_ids > INLINE_IDS:
        memcpy(enc.arena + enc.arena_size, ids, n_ids * sizeof(token_id_t))
        if n > 8:
            memcpy(enc.arena + enc.arena_size + n_ids * sizeof(token_id_t), p + 8, n - 8)
    else:
        memcpy(sl.ids, ids, n_ids * sizeof(token_id_t))
        if n > 8:
            memcpy(enc.arena + enc.arena_size, p + 8, n - 8)
    enc.arena_size += record
    enc.n_entries += 1
    return 0


cdef int _cache_grow(Encoder enc) noexcept nogil:
    """Double the slots and re-insert every entry (hashes are recomputed from the keys)."""
    cdef void* old_mem = enc.slots_mem
    cdef CacheSlot* old = enc.slots
    cdef Py_ssize_t old_n = enc.n_slots, k, n, j
    cdef uint8_t key[4096]
    cdef uint64_t h, slot
    enc.slots_mem = NULL
    if _slots_alloc(enc, 2 * old_n) < 0:
        enc.slots_mem = old_mem
        enc.slots = <CacheSlot*>((<uintptr_t>old_mem + 63) & ~(<uintptr_t>63))
        enc.n_slots = old_n
        enc.cache_mask = <uint64_t>(old_n - 1)
        return -1
    for k in range(old_n):
        if old[k].meta == 0:
            continue
        n = old[k].meta >> 12
        if n <= 8:
            h = _key_hash(key, n, old[k].w0, key)   # w0 is the whole key
        else:
            for j in range(8):
                key[j] = <uint8_t>(old[k].w0 >> (8 * j))
            memcpy(key + 8, _slot_tail(enc, &old[k]), n - 8)
            h = _key_hash(key, n, old[k].w0, key + n)
        slot = h >> enc.cache_shift
        while enc.slots[slot].meta != 0:
            slot = (slot + 1) & enc.cache_mask
        enc.slots[slot] = old[k]
    free(old_mem)
    return 0


cdef inline void _cache_clear(Encoder enc) noexcept nogil:
    memset(enc.slots, 0, enc.n_slots * sizeof(CacheSlot))
    enc.arena_size = 0
    enc.n_entries = 0


cdef int _set_max_entries(Encoder enc, Py_ssize_t n) noexcept nogil:
    """``Encoder.set_max_entries`` (``n`` >= 1): 0, or -1 when the smaller slots could not be
    made (the old ones stay, emptied)."""
    enc.max_entries = n
    if enc.n_entries <= n:
        return 0
    _cache_clear(enc)
    free(enc.arena)                 # (an empty cache has no arena, as a new encoder)
    enc.arena = NULL
    enc.arena_cap = 0
    if enc.n_slots > MIN_SLOTS:
        return _slots_alloc(enc, MIN_SLOTS)
    return 0


cdef int _shared_insert(Encoder enc, const uint8_t* p, Py_ssize_t n, uint64_t w0, uint64_t h,
                        const token_id_t* ids, Py_ssize_t n_ids) noexcept nogil:
    """``_cache_insert`` into this encoder as a batch job's shared cache, from any of the job's
    threads while the others read it: under ``share_lock``; never grows or clears (the slots
    and the arena stay where the readers see them), so -1 when there is no room (load over
    3/4, ``max_entries``, or the arena full: the caller keeps the entry in its own cache).
    The slot is filled first and published last, by a release store of its meta word
    (``_find_slot`` reads meta first). An entry another thread added meanwhile is not added
    twice."""
    cdef Py_ssize_t record = 0
    cdef uint64_t slot
    cdef CacheSlot* sl
    cdef int result = 0
    if n_ids > INLINE_IDS:
        record += n_ids * sizeof(token_id_t)
    if n > 8:
        record += n - 8
    record = (record + 3) & ~(<Py_ssize_t>3)
    spin_lock(&enc.share_lock)
    if (4 * (enc.n_entries + 1) > 3 * enc.n_slots or enc.n_entries >= enc.max_entries
            or enc.arena_size + record > enc.arena_cap):
        result = -1
    elif _cache_find(enc, p, n, w0, h) == NULL:
        slot = h >> enc.cache_shift
        while enc.slots[slot].meta != 0:
            slot = (slot + 1) & enc.cache_mask
        sl = &enc.slots[slot]
        sl.w0 = w0
        sl.off = <uint32_t>enc.arena_size
        memset(sl.ids, 0, sizeof(sl.ids))
        if n_ids > INLINE_IDS:
            memcpy(enc.arena + enc.arena_size, ids, n_ids * sizeof(token_id_t))
            if n > 8:
                memcpy(enc.arena + enc.arena_size + n_ids * sizeof(token_id_t), p + 8, n - 8)
        else:
            memcpy(sl.ids, ids, n_ids * sizeof(token_id_t))
            if n > 8:
                memcpy(enc.arena + enc.arena_size, p + 8, n - 8)
        enc.arena_size += record
        enc.n_entries += 1
        store_release(&sl.meta, (<uint32_t>n << 12) | <uint32_t>n_ids)
    spin_unlock(&enc.share_lock)
    return result


cdef int _absorb(Encoder enc, Encoder other) noexcept nogil:
    """``Encoder.absorb_cache`` (``other`` is not ``enc``; both over one rank table)."""
    cdef Py_ssize_t k, n, j, want
    cdef uint8_t key[4096]
    cdef uint64_t h
    cdef uint32_t n_ids
    cdef const CacheSlot* sl
    cdef const token_id_t* ids
    cdef uint8_t* grown
    # Room first, for all of ``other``'s entries at once. ``other``'s slots are walked in their
    # order, i.e. by hash: into a table smaller than ``other``'s, those keys all land at its
    # start, one cluster that every probe walks (quadratic; absorbing 62k GPT-2 pieces into a
    # fresh encoder took 0.16 s, 2.5 us a piece, 3x the batch that had learnt them). In a
    # table at least as large, keys in hash order spread over the whole of it.
    want = min(enc.n_entries + other.n_entries, enc.max_entries)
    while 3 * want > 2 * enc.n_slots:
        if _cache_grow(enc) < 0:
            break
    want = enc.arena_size + other.arena_size
    if want > enc.arena_cap and want <= ARENA_MAX:
        grown = <uint8_t*>realloc(enc.arena, want + ARENA_SLACK)
        if grown != NULL:
            enc.arena = grown
            enc.arena_cap = want
    for k in range(other.n_slots):
        sl = &other.slots[k]
        if sl.meta == 0:
            continue
        n = sl.meta >> 12
        n_ids = sl.meta & 0xFFF
        for j in range(8):
            key[j] = <uint8_t>(sl.w0 >> (8 * j))
        if n > 8:
            memcpy(key + 8, _slot_tail(other, sl), n - 8)
        h = _key_hash(key, n, sl.w0, key + (n if n > 8 else 8))
        if _cache_find(enc, key, n, sl.w0, h) != NULL:
            continue
        if n_ids <= INLINE_IDS:
            ids = &sl.ids[0]
        else:
            ids = <const token_id_t*>(other.arena + sl.off)
        if _cache_insert(enc, key, n, sl.w0, h, ids, n_ids) < 0:
            break
    _cache_clear(other)
    if other.n_slots > MIN_SLOTS:
        _slots_alloc(other, MIN_SLOTS)     # (on failure the old, cleared slots stay)
    return 0


cdef Py_ssize_t _reserve_shared(Encoder enc, int64_t n_bytes) noexcept nogil:
    """``Encoder.reserve_shared``: room for a batch's new pieces; the number of entries reserved for."""
    cdef double guess = 8.0 * pow(<double>max(n_bytes, 0), 0.6)
    cdef Py_ssize_t more = <Py_ssize_t>max(guess - enc.n_entries, guess / 8)
    cdef Py_ssize_t want = min(enc.n_entries + more, enc.max_entries)
    cdef Py_ssize_t arena_want
    cdef uint8_t* grown
    while 4 * want > 3 * enc.n_slots:
        if _cache_grow(enc) < 0:
            break
    arena_want = min(enc.arena_size + 8 * (want - enc.n_entries), <Py_ssize_t>ARENA_MAX)
    if arena_want > enc.arena_cap:
        grown = <uint8_t*>realloc(enc.arena, arena_want + ARENA_SLACK)
        if grown != NULL:
            enc.arena = grown
            enc.arena_cap = arena_want
    return want - enc.n_entries


cdef int _copy_cache(Encoder enc, Encoder other) noexcept nogil:
    """``Encoder.copy_cache_from`` (``other`` is not ``enc``): 0, or -1 when out of memory (then
    ``enc``'s cache is as it was)."""
    cdef uint8_t* arena = NULL
    if other.arena_size:
        arena = <uint8_t*>malloc(other.arena_size + ARENA_SLACK)
        if arena == NULL:
            return -1
    if _slots_alloc(enc, other.n_slots) < 0:
        free(arena)
        return -1
    memcpy(enc.slots, other.slots, other.n_slots * sizeof(CacheSlot))
    free(enc.arena)
    enc.arena = arena
    if arena != NULL:
        memcpy(arena, other.arena, other.arena_size)
    enc.arena_size = enc.arena_cap = other.arena_size
    enc.n_entries = other.n_entries
    return 0
