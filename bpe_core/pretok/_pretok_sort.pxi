# _pretok.pyx, part 7 of 11 (``include``d: compiled into the module as if written there).
# Sorting words in Python bytes order (the C sort helpers) and a drained counter's words as arrays.

cdef bint _entry_less(const Entry& a, const Entry& b) noexcept nogil:
    """Python bytes order: byte by byte, then the shorter first (the inline heads decide most)."""
    cdef uint64_t x = bpe_order64(a.w0), y = bpe_order64(b.w0)
    cdef int r
    if x != y:
        return x < y
    x = bpe_order64(a.w1)
    y = bpe_order64(b.w1)
    if x != y:
        return x < y
    if a.length > 16 and b.length > 16:
        r = memcmp(a.ptr + 16, b.ptr + 16, (a.length if a.length < b.length else b.length) - 16)
        if r != 0:
            return r < 0
    return a.length < b.length


ctypedef bint (*EntryLess)(const Entry&, const Entry&) noexcept nogil

cdef extern from *:
    """
    #include <algorithm>
    /* order[0:n] = 0..n-1 sorted so that e[order[0]], e[order[1]], ... are in less-order. */
    template <class E, class L>
    static void bpe_sort_order(uint32_t* order, size_t n, const E* e, L less) {
        for (size_t i = 0; i < n; i++) order[i] = (uint32_t)i;
        std::sort(order, order + n, [e, less](uint32_t a, uint32_t b) { return (bool)less(e[a], e[b]); });
    }
    """
    void bpe_sort_order[E, L](uint32_t* order, size_t n, const E* e, L less) noexcept nogil


cdef extern from *:
    """
    #include <algorithm>
    #include <stdlib.h>
    /* A word's sort key: its first 16 bytes as big-endian words (so integer order is byte order),
     * and its entry number. */
    struct BpeSortKey { uint64_t k0, k1; uint32_t idx; };
    /* order[0:n] = the entry numbers in less-order, as bpe_sort_order, but sorting 24-byte keys
     * with an inlined comparison: the heads decide nearly every comparison without touching the
     * entries (40 bytes each, and a call per comparison). 0, or -1 when out of memory. */
    template <class E, class L>
    static int bpe_sort_keys(uint32_t* order, size_t n, const E* e, L less) {
        BpeSortKey* keys = (BpeSortKey*)malloc((n ? n : 1) * sizeof(BpeSortKey));
        if (keys == NULL) return -1;
        for (size_t i = 0; i < n; i++) {
            keys[i].k0 = bpe_order64(e[i].w0);
            keys[i].k1 = bpe_order64(e[i].w1);
            keys[i].idx = (uint32_t)i;
        }
        std::sort(keys, keys + n, [e, less](const BpeSortKey& a, const BpeSortKey& b) {
            if (a.k0 != b.k0) return a.k0 < b.k0;
            if (a.k1 != b.k1) return a.k1 < b.k1;
            return (bool)less(e[a.idx], e[b.idx]);
        });
        for (size_t i = 0; i < n; i++) order[i] = keys[i].idx;
        free(keys);
        return 0;
    }
    """
    int bpe_sort_keys[E, L](uint32_t* order, size_t n, const E* e, L less) noexcept nogil


cdef extern from *:
    """
    #include <algorithm>
    #include <string.h>
    /* A word of the plain count as a sort key: its first 16 bytes as big-endian words (integer order
     * is byte order), its count, min(length, 17), and (a longer word) its entry in the long table. */
    struct BpeWordKey { uint64_t k0, k1; int64_t count; uint32_t idx, len17; };
    /* Python bytes order. Equal heads: a word of up to 16 bytes is decided by its length (its zero
     * padding is all that differs); two longer words by the long table's less. */
    template <class E, class L>
    struct BpeWordLess {
        const E* longs;
        L less;
        bool operator()(const BpeWordKey& a, const BpeWordKey& b) const {
            if (a.k0 != b.k0) return a.k0 < b.k0;
            if (a.k1 != b.k1) return a.k1 < b.k1;
            if (a.len17 != b.len17 || a.len17 <= 16) return a.len17 < b.len17;
            return (bool)less(longs[a.idx], longs[b.idx]);
        }
    };
    /* A short word (up to 15 bytes) as a 24-byte sort key: its first 15 bytes (zero-padded) as
     * big-endian words with its length as the 16th byte, and its count. Two short words never have
     * the same key, and integer order is Python bytes order (equal padded bytes: the shorter word,
     * whose padding is all that differs, has the smaller length). */
    struct BpeShortKey { uint64_t k0, k1; int64_t count; };
    struct BpeShortLess {
        bool operator()(const BpeShortKey& a, const BpeShortKey& b) const {
            return a.k0 < b.k0 || (a.k0 == b.k0 && a.k1 < b.k1);
        }
    };
    template <class K> static inline unsigned bpe_key_byte(const K& k, int d) {
        return (unsigned)((d < 8 ? k.k0 >> (56 - 8 * d) : k.k1 >> (120 - 8 * d)) & 255u);
    }
    /* MSD radix sort on byte d.. of the heads: a counting pass and a scatter per level (a level every
     * key agrees on costs one pass), std::sort for small groups and past the heads. The scatters go
     * back and forth between the keys and tmp (no copy back): bpe_radix_in sorts a[0:n] in place
     * with tmp[0:n] as scratch, bpe_radix_to sorts src[0:n] into dst[0:n] (src is scratch). */
    template <class K, class C> static void bpe_radix_to(K* src, K* dst, size_t n, int d, const C& less);
    /* The level of byte d (or the first after it where the keys differ) of a[0:n] counted into cnt;
     * its byte index, or 16 when the keys agree on every byte left. */
    template <class K> static inline int bpe_radix_level(const K* a, size_t n, int d, size_t* cnt) {
        size_t i;
        for (; d < 16; d++) {
            memset(cnt, 0, 256 * sizeof(size_t));
            for (i = 0; i < n; i++) cnt[bpe_key_byte(a[i], d)]++;
            if (cnt[bpe_key_byte(a[0], d)] != n) break;
        }
        return d;
    }
    template <class K, class C>
    static void bpe_radix_in(K* a, K* tmp, size_t n, int d, const C& less) {
        size_t cnt[256], pos[256], p, i;
        int b;
        if (n < 64 || (d = bpe_radix_level(a, n, d, cnt)) == 16) { std::sort(a, a + n, less); return; }
        for (b = 0, p = 0; b < 256; b++) { pos[b] = p; p += cnt[b]; }
        for (i = 0; i < n; i++) tmp[pos[bpe_key_byte(a[i], d)]++] = a[i];
        for (b = 0, p = 0; b < 256; b++) {
            if (cnt[b] == 1) a[p] = tmp[p];
            else if (cnt[b] > 1) bpe_radix_to(tmp + p, a + p, cnt[b], d + 1, less);
            p += cnt[b];
        }
    }
    template <class K, class C>
    static void bpe_radix_to(K* src, K* dst, size_t n, int d, const C& less) {
        size_t cnt[256], pos[256], p, i;
        int b;
        if (n < 64 || (d = bpe_radix_level(src, n, d, cnt)) == 16) {
            memcpy(dst, src, n * sizeof(K));
            std::sort(dst, dst + n, less);
            return;
        }
        for (b = 0, p = 0; b < 256; b++) { pos[b] = p; p += cnt[b]; }
        for (i = 0; i < n; i++) dst[pos[bpe_key_byte(src[i], d)]++] = src[i];
        for (b = 0, p = 0; b < 256; b++) {
            if (cnt[b] > 1) bpe_radix_in(dst + p, src + p, cnt[b], d + 1, less);
            p += cnt[b];
        }
    }
    /* keys[0:n] (short words) in Python bytes order, with tmp[0:n] as scratch (NULL: allocated
     * here); 0, or -1 when out of memory. */
    static int bpe_sort_short(BpeShortKey* keys, size_t n, BpeShortKey* tmp) {
        BpeShortLess cmp;
        BpeShortKey* own = NULL;
        if (n < 64) { std::sort(keys, keys + n, cmp); return 0; }
        if (tmp == NULL) {
            tmp = own = (BpeShortKey*)malloc(n * sizeof(BpeShortKey));
            if (tmp == NULL) return -1;
        }
        bpe_radix_in(keys, tmp, n, 0, cmp);
        free(own);
        return 0;
    }
    /* keys[0:n] in Python bytes order, with tmp[0:n] as scratch (NULL: allocated here); 0, or -1
     * when out of memory. */
    template <class E, class L>
    static int bpe_sort_words(BpeWordKey* keys, size_t n, const E* longs, L less, BpeWordKey* tmp) {
        BpeWordLess<E, L> cmp = {longs, less};
        BpeWordKey* own = NULL;
        if (n < 64) { std::sort(keys, keys + n, cmp); return 0; }
        if (tmp == NULL) {
            tmp = own = (BpeWordKey*)malloc(n * sizeof(BpeWordKey));
            if (tmp == NULL) return -1;
        }
        bpe_radix_in(keys, tmp, n, 0, cmp);
        free(own);
        return 0;
    }
    /* 16 bytes from two big-endian head words (the keys' k0, k1). */
    static inline void bpe_store_key16(uint8_t* p, uint64_t k0, uint64_t k1) {
    #if !(defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__)
        k0 = BPE_BSWAP64(k0);
        k1 = BPE_BSWAP64(k1);
    #endif
        memcpy(p, &k0, 8);
        memcpy(p + 8, &k1, 8);
    }
    """
    struct BpeWordKey:
        uint64_t k0
        uint64_t k1
        int64_t count
        uint32_t idx
        uint32_t len17
    struct BpeShortKey:
        uint64_t k0
        uint64_t k1
        int64_t count
    int bpe_sort_words[E, L](BpeWordKey* keys, size_t n, const E* longs, L less, BpeWordKey* tmp) noexcept nogil
    int bpe_sort_short(BpeShortKey* keys, size_t n, BpeShortKey* tmp) noexcept nogil
    void bpe_store_key16(uint8_t* p, uint64_t k0, uint64_t k1) noexcept nogil


cdef object _counter_to_arrays(WordCounter* c, bint numpy=True):
    """The words of a drained counter sorted by bytes, copied out as (arena, offsets, counts):
    numpy arrays, or ``array.array`` (``"B"``, ``"q"``, ``"q"``) when not ``numpy``.

    Each short word becomes a 24-byte key (``BpeShortKey``: its heads byte-swapped with its length
    as the 16th byte, unique, so integer order is bytes order; and its count), written over the
    short table's own slots (a key per slot, packed to the front: the slots are 32 bytes, and a key
    never lands past the slot it comes from); the long table's words become 32-byte keys
    (``BpeWordKey``) after them where the table has room (else allocated). Each kind is sorted on
    its own (an MSD radix sort on the heads, comparisons only within small groups; the short keys'
    scratch is the table's free slots where there are enough), and the two sorted lists are merged
    as they are written out: a short word goes before a long one when its padded first 15 bytes
    are at most the long word's first 15 (it is then smaller, or a prefix of it). A short word is
    written as its 16 head bytes at once (the next word overwrites the rest), a long one copied
    from the buffer.
    """
    cdef Py_ssize_t i, j, k = 0, n_short = c.short.n_words, n_long = c.long.n_entries
    cdef Py_ssize_t n_words = n_short + n_long, n_bytes = 0, pos = 0, length, w = 0
    cdef Py_ssize_t n_slots = c.short.mask + 1
    cdef size_t room = <size_t>n_slots * sizeof(ShortSlot), used
    cdef ShortSlot* slots = c.short.slots
    cdef ShortSlot slot
    cdef Entry* longs = c.long.entries
    cdef BpeShortKey* skey
    cdef BpeShortKey* skeys = <BpeShortKey*>slots
    cdef BpeShortKey* scratch = NULL
    cdef BpeWordKey* lkey
    cdef BpeWordKey* lkeys = NULL
    cdef bint own_lkeys = False
    cdef uint64_t s15 = 0, l15 = 0
    cdef uint8_t tmp[16]
    cdef int status = 0
    cdef uint8_t[::1] arena_view
    cdef int64_t[::1] offsets_view
    cdef int64_t[::1] counts_view
    cdef uint8_t* out
    with nogil:
        # The short words' keys over their own slots, packed to the front (no branch per slot:
        # every slot writes a key where the next word's key goes, only a word moves on).
        for i in range(n_slots):
            slot = slots[i]
            skeys[k].k0 = bpe_order64(slot.w0)
            skeys[k].k1 = bpe_order64(slot.w1) | slot.length
            skeys[k].count = slot.count
            n_bytes += <Py_ssize_t>slot.length
            k += slot.length != 0
        used = <size_t>n_short * sizeof(BpeShortKey)
        if n_long > 0:  # the long keys after the short ones where they fit
            if used + <size_t>n_long * sizeof(BpeWordKey) <= room:
                lkeys = <BpeWordKey*>(<uint8_t*>slots + used)
                used += <size_t>n_long * sizeof(BpeWordKey)
            else:
                lkeys = <BpeWordKey*>malloc(n_long * sizeof(BpeWordKey))
                own_lkeys = True
        if used + <size_t>n_short * sizeof(BpeShortKey) <= room:
            scratch = <BpeShortKey*>(<uint8_t*>slots + used)
    if n_long > 0 and lkeys == NULL:
        raise MemoryError("count_pretokens: cannot allocate the sort keys of the table")
    try:
        with nogil:
            for i in range(n_long):
                lkeys[i].k0 = bpe_order64(longs[i].w0)
                lkeys[i].k1 = bpe_order64(longs[i].w1)
                lkeys[i].count = longs[i].count
                lkeys[i].idx = <uint32_t>i
                lkeys[i].len17 = 17
                n_bytes += longs[i].length
            status = bpe_sort_short(skeys, n_short, scratch)
            if status == 0:
                status = bpe_sort_words[Entry, EntryLess](lkeys, n_long, longs, _entry_less, NULL)
        if status != 0:
            raise MemoryError("count_pretokens: cannot allocate the sort buffer of the table")
        arena, offsets, counts = _table_arrays(n_bytes, n_words, numpy)
        arena_view = arena
        offsets_view = offsets
        counts_view = counts
        out = &arena_view[0] if n_bytes > 0 else NULL
        with nogil:
            i = 0
            j = 0
            if n_long > 0:  # the first 15 bytes of the next long word (l15) and of the next short one
                l15 = lkeys[0].k1 >> 8
            while w < n_words:
                offsets_view[w] = pos
                if i < n_short and (j == n_long or skeys[i].k0 < lkeys[j].k0 or (
                        skeys[i].k0 == lkeys[j].k0 and (skeys[i].k1 >> 8) <= l15)):
                    skey = &skeys[i]
                    counts_view[w] = skey.count
                    length = <Py_ssize_t>(skey.k1 & 255)
                    if pos + 16 <= n_bytes:
                        bpe_store_key16(out + pos, skey.k0, skey.k1)
                    else:
                        bpe_store_key16(tmp, skey.k0, skey.k1)
                        memcpy(out + pos, tmp, length)
                    i += 1
                else:
                    lkey = &lkeys[j]
                    counts_view[w] = lkey.count
                    length = longs[lkey.idx].length
                    memcpy(out + pos, longs[lkey.idx].ptr, length)
                    j += 1
                    if j < n_long:
                        l15 = lkeys[j].k1 >> 8
                pos += length
                w += 1
            offsets_view[n_words] = pos
        return arena, offsets, counts
    finally:
        if own_lkeys:
            free(lkeys)


cdef inline int _word_cmp(const uint8_t* a, Py_ssize_t na, const uint8_t* b,
                          Py_ssize_t nb) noexcept nogil:
    cdef int r = memcmp(a, b, na if na < nb else nb)
    if r != 0:
        return r
    return (na > nb) - (na < nb)
