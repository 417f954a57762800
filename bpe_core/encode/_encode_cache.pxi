# _encode.pyx, part 2 of 10 (``include``d: compiled into the module as if written there).
# Hashing of a pretoken and the probe for its slot in the encoder's cache.

# ==== Hashing ================================================================================


cdef extern from *:
    """
    /* The hash of a pretoken, in C so that the block hasher below (out of line: its loop keeps its
       values in registers) and the Cython helpers share one definition. */
    static inline uint64_t bpe_enc_mix(uint64_t h) {
        h ^= h >> 31;
        h *= BPE_MUL2;
        h ^= h >> 29;
        return h;
    }
    /* The first min(n, 8) bytes at p, zero-padded, little-endian; never reads at or past limit. */
    static inline uint64_t bpe_enc_load_head(const uint8_t* p, Py_ssize_t n, const uint8_t* limit) {
        uint64_t w = 0;
        Py_ssize_t k, m = n < 8 ? n : 8;
        if (p + 8 <= limit)
            return bpe_enc_load_le64(p) & bpe_enc_head_masks[m];
        for (k = 0; k < m; k++)
            w |= ((uint64_t)p[k]) << (8 * k);
        return w;
    }
    /* The steps of bpe_enc_key_hash past the first 8 bytes (out of line: most keys are short). */
    static BPE_ENC_NOINLINE uint64_t bpe_enc_hash_tail(const uint8_t* p, Py_ssize_t n, uint64_t h,
                                                       const uint8_t* limit) {
        Py_ssize_t k;
        for (k = 8; k < n; k += 8)
            h = bpe_enc_mix(h ^ bpe_enc_load_head(p + k, n - k, limit)) * BPE_MUL1;
        return h;
    }
    /* Multiply-xorshift, 8 bytes a step; its top bits depend on every key bit. */
    static inline uint64_t bpe_enc_key_hash(const uint8_t* p, Py_ssize_t n, uint64_t w0, const uint8_t* limit) {
        uint64_t h = (w0 ^ ((uint64_t)n * BPE_MUL3)) * BPE_MUL1;
        if (n > 8)
            h = bpe_enc_hash_tail(p, n, h, limit);
        return h;
    }
    /* _emit_pieces' ring of looked-up pieces: piece k's head word at ring[2 * (k % BPE_ENC_RING)],
       its hash next to it. */
    static const Py_ssize_t BPE_ENC_RING = 64;
    /* Hash the pieces k0 .. k1 - 1 (piece k is s[ends[k - 1]:ends[k]], the first starting at qa)
       of 1 to max_len bytes into the ring, and prefetch their slots (32 bytes each, slot
       h >> shift). The block lies in one turn of the ring (k0 a multiple of k1 - k0 <= half a turn). */
    static BPE_ENC_NOINLINE void bpe_enc_hash_block(const uint8_t* s, Py_ssize_t qa, const int64_t* ends,
                                                    Py_ssize_t k0, Py_ssize_t k1, const uint8_t* limit,
                                                    size_t max_len, const char* slots, int shift,
                                                    uint64_t* ring) {
        const int64_t* pe = ends + k0;
        const int64_t* pend = ends + k1;
        uint64_t* r = ring + 2 * ((size_t)k0 % BPE_ENC_RING);   /* (k0 .. k1 - 1 do not wrap) */
        Py_ssize_t e, n;
        uint64_t w0, h;
        for (; pe < pend; pe++, r += 2) {
            e = *pe;
            n = e - qa;
            if ((size_t)(n - 1) < max_len) {
                w0 = bpe_enc_load_head(s + qa, n, limit);
                h = bpe_enc_key_hash(s + qa, n, w0, limit);
                r[0] = w0;
                r[1] = h;
                bpe_enc_prefetch(slots + ((h >> shift) << 5));
            }
            qa = e;
        }
    }
    """
    uint64_t _load_head "bpe_enc_load_head"(const uint8_t* p, Py_ssize_t n, const uint8_t* limit) noexcept nogil
    uint64_t _key_hash "bpe_enc_key_hash"(const uint8_t* p, Py_ssize_t n, uint64_t w0, const uint8_t* limit) noexcept nogil
    void hash_block "bpe_enc_hash_block"(const uint8_t* s, Py_ssize_t qa, const int64_t* ends, Py_ssize_t k0,
                                         Py_ssize_t k1, const uint8_t* limit, size_t max_len, const char* slots,
                                         int shift, uint64_t* ring) noexcept nogil
    const Py_ssize_t C_RING "BPE_ENC_RING"
# ``_load_head(p, n, limit)``: the first ``min(n, 8)`` bytes at p, zero-padded, little-endian; never
# reads at or past limit. ``_key_hash(p, n, w0, limit)``: the hash of the pretoken p[0:n] whose head
# word is w0 (multiply-xorshift, 8 bytes a step); its top bits are what depends on every key bit (a
# product's high bits): a cache slot is ``h >> shift`` (Fibonacci hashing), so a short key costs
# two multiplies and no final mix. ``hash_block``: ``_emit_pieces``' hashing of a block of pieces.

if sizeof(CacheSlot) != 32 or C_RING != RING:         # hash_block prefetches slot h >> shift at (h >> shift) << 5
    raise ImportError("bpe_core._encode: a cache slot must be 32 bytes, and the rings agree")


cdef inline Py_ssize_t _utf8_stable_end(const uint8_t* buf, Py_ssize_t s, Py_ssize_t e) noexcept nogil:
    """The largest ``c <= e`` such that decoding ``buf[s:c]`` cannot change when bytes follow.

    Equivalent to ``tokenizer._utf8_stable_end``: only an unfinished but so far valid multi-byte
    sequence at the very end is left out.
    """
    cdef Py_ssize_t k, i
    cdef uint8_t x, second, lo, hi
    cdef int need
    for k in range(1, 4):
        i = e - k
        if i < s:
            return e
        x = buf[i]
        if x < 0x80:
            return e
        if x < 0xC0:
            continue                    # continuation byte: look further back
        if x < 0xC2 or x > 0xF4:
            return e                    # never starts a valid sequence
        need = 2 if x < 0xE0 else (3 if x < 0xF0 else 4)
        if k >= need:
            return e                    # complete (or invalid: then final anyway)
        if k >= 2:
            second = buf[i + 1]
            lo, hi = 0x80, 0xBF
            if x == 0xE0:
                lo = 0xA0
            elif x == 0xED:
                hi = 0x9F
            elif x == 0xF0:
                lo = 0x90
            elif x == 0xF4:
                hi = 0x8F
            if second < lo or second > hi:
                return e
        return i
    return e


cdef inline CacheSlot* _find_slot(CacheSlot* slots, uint64_t mask, int shift, const uint8_t* arena,
                                  const uint8_t* p, Py_ssize_t n, uint64_t w0, uint64_t h,
                                  const uint8_t* limit) noexcept nogil:
    """The slot of a pretoken cache (``slots``, ``mask``, ``shift``, ``arena``) holding ``p[0:n]`` (``n >= 1``,
    head word w0, hash h; ``limit``: the end of the readable bytes at p), or NULL.

    A hit on a short key is one compare of the head word and one of the length; a key of 9 to 16
    bytes compares its second word inline, a longer key its tail 8 bytes at a time, out of line
    (``tail_equal``; the arena keeps 8 readable bytes past its end, ``ARENA_SLACK``). An empty
    slot (w0 0, meta 0) never matches the length of a key of ``n >= 1`` bytes, so the miss test
    comes after the match test.

    Safe while another thread publishes slots (``_shared_insert``): a slot's meta word is
    read first, and a slot whose meta is set is complete and never changes during the job.
    """
    cdef uint64_t slot = h >> shift
    cdef uint32_t want = <uint32_t>n << 12
    cdef uint32_t meta, n_ids
    cdef CacheSlot* sl
    cdef const uint8_t* tail
    while True:
        sl = &slots[slot]
        meta = load_acquire(&sl.meta)      # before the slot's other words (a batch job's writer)
        if sl.w0 == w0 and (meta & 0xFFF000u) == want:
            if n <= 8:
                return sl
            n_ids = meta & 0xFFF
            tail = arena + sl.off + (n_ids * sizeof(token_id_t) if n_ids > INLINE_IDS else 0)
            if n <= 16 and p + 16 <= limit:        # most long keys: one more word, inline
                if ((load_le64(tail) ^ load_le64(p + 8)) & HEAD_MASKS[n - 8]) == 0:
                    return sl
            elif tail_equal(tail, p + 8, n - 8, limit):
                return sl
        elif meta == 0:
            return NULL
        slot = (slot + 1) & mask


cdef inline bint _second_word_equal(const CacheSlot* sl, uint32_t meta, const uint8_t* arena, const uint8_t* p,
                                    Py_ssize_t n, const uint8_t* limit) noexcept nogil:
    """Whether the key of 9 to 16 bytes at ``p`` (its head word and length equal to the slot's) has
    the slot's bytes after the first 8 (``_find_slot``'s compare of a key's second word)."""
    cdef uint32_t n_ids = meta & 0xFFF
    cdef const uint8_t* tail = arena + sl.off + (n_ids * sizeof(token_id_t) if n_ids > INLINE_IDS else 0)
    if p + 16 <= limit:
        return ((load_le64(tail) ^ load_le64(p + 8)) & HEAD_MASKS[n - 8]) == 0
    return tail_equal(tail, p + 8, n - 8, limit)
