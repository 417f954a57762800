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
    /* bpe_enc_load_head's bytes one at a time, for the last 7 bytes of a buffer (out of line: inlined,
       its unrolled loop took registers from bpe_enc_hash_block's, which then reloaded its
       constants and arguments from memory on every piece). */
    static BPE_ENC_NOINLINE uint64_t bpe_enc_load_head_bytes(const uint8_t* p, Py_ssize_t m) {
        uint64_t w = 0;
        Py_ssize_t k;
        for (k = 0; k < m; k++)
            w |= ((uint64_t)p[k]) << (8 * k);
        return w;
    }
    /* The first min(n, 8) bytes at p, zero-padded, little-endian; never reads at or past limit. */
    static inline uint64_t bpe_enc_load_head(const uint8_t* p, Py_ssize_t n, const uint8_t* limit) {
        Py_ssize_t m = n < 8 ? n : 8;
        if (p + 8 <= limit)
            return bpe_enc_load_le64(p) & bpe_enc_head_masks[m];
        return bpe_enc_load_head_bytes(p, m);
    }
    /* The steps of bpe_enc_key_hash past the first 8 bytes (out of line: most keys are short). */
    static BPE_ENC_NOINLINE uint64_t bpe_enc_hash_tail(const uint8_t* p, Py_ssize_t n, uint64_t h,
                                                       const uint8_t* limit) {
        Py_ssize_t k;
        h ^= bpe_enc_load_head(p + 8, n - 8, limit) * BPE_MUL2;
        for (k = 16; k < n; k += 8)
            h = bpe_enc_mix(h ^ bpe_enc_load_head(p + k, n - k, limit)) * BPE_MUL1;
        return h;
    }
    /* Multiply-xorshift: the head word w0 with the length, times MUL1; a key of 9 to 16 bytes adds
       its second word w1 (zero-padded) times MUL2 with a xor, a longer one a mixing step per 8
       bytes after that. Its top bits depend on every key bit (a product's high bits depend on all
       of its factor's bits). The second word's term has no mixing step of its own, so that
       bpe_enc_hash_block hashes every key of up to 16 bytes without a branch on its length:
       h = ((w0 ^ n * MUL3) * MUL1) ^ (w1 * MUL2), w1 = 0 up to 8 bytes. */
    static inline uint64_t bpe_enc_key_hash(const uint8_t* p, Py_ssize_t n, uint64_t w0, const uint8_t* limit) {
        uint64_t h = (w0 ^ ((uint64_t)n * BPE_MUL3)) * BPE_MUL1;
        if (n > 8)
            h = bpe_enc_hash_tail(p, n, h, limit);
        return h;
    }
    /* bpe_enc_hash_block's masks by a key's length n (0 to 16): its head word's (first min(n, 8)
       bytes) and its second word's (bytes 8 to n; none up to 8). */
    static const uint64_t bpe_enc_w0_masks[17] = {
        0ull, 0xFFull, 0xFFFFull, 0xFFFFFFull, 0xFFFFFFFFull, 0xFFFFFFFFFFull, 0xFFFFFFFFFFFFull,
        0xFFFFFFFFFFFFFFull, ~0ull, ~0ull, ~0ull, ~0ull, ~0ull, ~0ull, ~0ull, ~0ull, ~0ull};
    static const uint64_t bpe_enc_w1_masks[17] = {
        0ull, 0ull, 0ull, 0ull, 0ull, 0ull, 0ull, 0ull, 0ull,
        0xFFull, 0xFFFFull, 0xFFFFFFull, 0xFFFFFFFFull, 0xFFFFFFFFFFull, 0xFFFFFFFFFFFFull,
        0xFFFFFFFFFFFFFFull, ~0ull};
    /* _emit_pieces' ring of looked-up pieces: piece k's head word at ring[2 * (k % BPE_ENC_RING)],
       its hash next to it. */
    static const Py_ssize_t BPE_ENC_RING = 64;
    /* _emit_pieces' ring: what bpe_enc_hash_block found of each piece of a block, for the probes.
       n: the piece's length when it is a key the probe loop takes (1 to min(16, max_len) bytes),
       else 0; w0, h: its head word and hash (any cached key); w1: for a key of 9 to 16 bytes its
       bytes after the first 8, zero-padded (so the probe compares a second word without reading
       the text). Piece k is ring[k % BPE_ENC_RING]. */
    typedef struct { uint64_t w0; uint64_t w1; uint64_t h; int64_t n; } bpe_enc_ring_t;
    /* One piece's ring entry, its slot prefetched (bpe_enc_hash_block's careful step). */
    static inline void bpe_enc_hash_one(const uint8_t* p, Py_ssize_t n, const uint8_t* limit, size_t short_max,
                                        const char* slots, int shift, bpe_enc_ring_t* r) {
        uint64_t w0 = bpe_enc_load_head(p, n, limit);
        uint64_t h = bpe_enc_key_hash(p, n, w0, limit);
        r->w0 = w0;
        r->w1 = n > 8 && n <= 16 ? bpe_enc_load_head(p + 8, n - 8, limit) : 0;
        r->h = h;
        r->n = (size_t)(n - 1) < short_max ? n : 0;
        bpe_enc_prefetch(slots + ((h >> shift) << 5));
    }
    /* Fill the ring entries of the pieces k0 .. k1 - 1 (piece k is s[ends[k - 1]:ends[k]], the
       first starting at qa) and prefetch the slots of those of 1 to max_len bytes (32 bytes each,
       slot h >> shift); short_max = min(16, max_len). The block lies in one turn of the ring (k0 a
       multiple of k1 - k0 <= half a turn).
       When 16 bytes past the block's end are readable (all but the buffer's last block), a piece
       of up to 16 bytes is hashed by a loop without a call, a bounds test or a branch on its length
       (the same hash as bpe_enc_key_hash: two words loaded and masked by length), which keeps its
       values in registers; any other piece leaves that loop, takes the careful step, and the loop goes on
       after it. (With the calls in the loop, only the callee-saved registers outlived a piece:
       the multipliers and half the arguments were reloaded each time, 32 instructions a piece.) */
    static BPE_ENC_NOINLINE void bpe_enc_hash_block(const uint8_t* s, Py_ssize_t qa, const int64_t* ends,
                                                    Py_ssize_t k0, Py_ssize_t k1, const uint8_t* limit,
                                                    size_t max_len, const char* slots, int shift,
                                                    bpe_enc_ring_t* ring) {
        const int64_t* pe = ends + k0;
        const int64_t* pend = ends + k1;
        bpe_enc_ring_t* r = ring + (size_t)k0 % BPE_ENC_RING;   /* (k0 .. k1 - 1 do not wrap) */
        size_t short_max = max_len < 16 ? max_len : 16;
        Py_ssize_t e, n;
        uint64_t w0, w1, h;
        const uint8_t* p;
        if (short_max == 16 && k1 > k0 && s + ends[k1 - 1] + 16 <= limit) {
            while (pe < pend) {
                for (; pe < pend; pe++, r++) {          /* pieces of 1 to 16 bytes: no call, no branch */
                    e = *pe;
                    n = e - qa;
                    p = s + qa;
                    if ((size_t)(n - 1) >= 16)
                        break;
                    w0 = bpe_enc_load_le64(p) & bpe_enc_w0_masks[n];
                    w1 = bpe_enc_load_le64(p + 8) & bpe_enc_w1_masks[n];
                    h = ((w0 ^ ((uint64_t)n * BPE_MUL3)) * BPE_MUL1) ^ (w1 * BPE_MUL2);
                    r->w0 = w0;
                    r->w1 = w1;
                    r->h = h;
                    r->n = n;
                    bpe_enc_prefetch(slots + ((h >> shift) << 5));
                    qa = e;
                }
                if (pe == pend)
                    break;
                e = *pe;                                /* empty, or longer than 16 bytes */
                n = e - qa;
                r->n = 0;
                if ((size_t)(n - 1) < max_len)
                    bpe_enc_hash_one(s + qa, n, limit, short_max, slots, shift, r);
                qa = e;
                pe++;
                r++;
            }
            return;
        }
        for (; pe < pend; pe++, r++) {
            e = *pe;
            n = e - qa;
            r->n = 0;
            if ((size_t)(n - 1) < max_len)
                bpe_enc_hash_one(s + qa, n, limit, short_max, slots, shift, r);
            qa = e;
        }
    }
    /* A cache slot as the C loops below read it (CacheSlot's layout; checked at import). */
    typedef struct { uint64_t w0; uint32_t meta; uint32_t off; uint32_t ids[4]; } bpe_enc_slot_t;
    /* The slot of the cache slots_mem (mask, shift, arena) holding the key of ring entry r (its
       n of 1 to 16 bytes), or NULL: bpe_enc_probe_block's probe of a piece its loop left (out of
       line: a key with more than 4 ids, its tail after them). */
    static BPE_ENC_NOINLINE const bpe_enc_slot_t* bpe_enc_find_short(const char* slots_mem, uint64_t mask, int shift,
                                                                     const uint8_t* arena, const bpe_enc_ring_t* r) {
        const bpe_enc_slot_t* slots = (const bpe_enc_slot_t*)slots_mem;
        const bpe_enc_slot_t* sl;
        Py_ssize_t n = r->n;
        uint64_t slot = r->h >> shift;
        uint32_t want = (uint32_t)n << 12, meta, n_ids;
        for (;;) {
            sl = slots + slot;
            meta = bpe_enc_load_acquire(&sl->meta);
            if (sl->w0 == r->w0 && (meta & 0xFFF000u) == want) {
                if (n <= 8)
                    return sl;
                n_ids = meta & 0xFFF;
                /* (the arena keeps 8 readable bytes past its end) */
                if ((bpe_enc_load_le64(arena + sl->off + (n_ids > 4 ? n_ids * sizeof(uint32_t) : 0))
                     & bpe_enc_head_masks[n - 8]) == r->w1)
                    return sl;
            } else if (meta == 0)
                return NULL;
            slot = (slot + 1) & mask;
        }
    }
    /* bpe_enc_probe_block's loop over the ring entries r .. rend - 1: while each is a key (n != 0)
       found with at most 4 ids, its ids go to *out_io (4 at once: out has room); with_starts, where
       each key's ids start (counted from out0) goes to *sp, before its probe, and sp moves on
       past each key done (so the start of the key it stops at is written too). Returns the entry it stopped at; *more: 1 when
       that one is a key with more than 4 ids, which it leaves to a call (a key not found, or not a
       key: 0). Out of line and without a call, so that its values stay in registers. */
    static inline const bpe_enc_ring_t* bpe_enc_probe_run(const bpe_enc_ring_t* r, const bpe_enc_ring_t* rend,
                                                          const bpe_enc_slot_t* slots, uint64_t mask, int shift,
                                                          const uint8_t* arena, uint32_t** out_io, int64_t** sp_io,
                                                          const uint32_t* out0, int with_starts, int* more) {
        const bpe_enc_slot_t* sl;
        uint32_t* o = *out_io;
        int64_t* sp = with_starts ? *sp_io : NULL;
        Py_ssize_t n;
        uint64_t slot, w0;
        uint32_t want, meta, n_ids;
        *more = 0;
        for (; r < rend; r++) {
            n = r->n;
            if (n == 0)
                break;
            if (with_starts)
                *sp = o - out0;                 /* (before the probe: also the piece it may leave) */
            w0 = r->w0;
            slot = r->h >> shift;
            want = (uint32_t)n << 12;
            for (;;) {
                sl = slots + slot;
                meta = bpe_enc_load_acquire(&sl->meta);
                if (sl->w0 == w0 && (meta & 0xFFF000u) == want) {
                    if (n <= 8)
                        break;
                    if ((meta & 0xFFF) > 4)         /* (its tail is after its ids) */
                        goto many;
                    if ((bpe_enc_load_le64(arena + sl->off) & bpe_enc_head_masks[n - 8]) == r->w1)
                        break;
                } else if (meta == 0)
                    goto stop;
                slot = (slot + 1) & mask;
            }
            n_ids = meta & 0xFFF;
            if (n_ids > 4)
                goto many;
            if (with_starts)
                sp++;
            memcpy(o, sl->ids, 4 * sizeof(uint32_t));
            o += n_ids;
        }
        goto stop;
    many:
        *more = 1;
    stop:
        *out_io = o;
        if (with_starts)
            *sp_io = sp;
        return r;
    }
    static BPE_ENC_NOINLINE const bpe_enc_ring_t* bpe_enc_probe_run0(
            const bpe_enc_ring_t* r, const bpe_enc_ring_t* rend, const bpe_enc_slot_t* slots, uint64_t mask, int shift,
            const uint8_t* arena, uint32_t** out_io, int* more) {
        return bpe_enc_probe_run(r, rend, slots, mask, shift, arena, out_io, NULL, NULL, 0, more);
    }
    static BPE_ENC_NOINLINE const bpe_enc_ring_t* bpe_enc_probe_run1(
            const bpe_enc_ring_t* r, const bpe_enc_ring_t* rend, const bpe_enc_slot_t* slots, uint64_t mask, int shift,
            const uint8_t* arena, uint32_t** out_io, int64_t** sp_io, const uint32_t* out0, int* more) {
        return bpe_enc_probe_run(r, rend, slots, mask, shift, arena, out_io, sp_io, out0, 1, more);
    }
    /* _emit_pieces' probe of the pieces k .. k1 - 1 of one block (piece k starts at *qa; their ring
       entries from bpe_enc_hash_block) in one cache (slots_mem, mask, shift, arena): the ids of each
       key of 1 to 16 bytes found there go to *out. Stops at the first other piece (not such a key,
       or not found) and returns its index (k1 when none); *qa and *out are then where that piece
       starts and where its ids go. starts (or NULL): where each piece's ids start, counted from
       out0. A slot's meta word is read first, with acquire (a batch job's threads publish slots in
       the shared cache while others probe it).
       In C, its loop out of line and without a call (bpe_enc_probe_run): as Cython's loop in
       _emit_pieces, among that method's other variables, it reloaded seven values from the stack
       a piece, and a C loop with the rare calls in it still spilled as many around them. */
    static BPE_ENC_NOINLINE Py_ssize_t bpe_enc_probe_block(Py_ssize_t* qa_io, const int64_t* ends, Py_ssize_t k,
                                                          Py_ssize_t k1, const bpe_enc_ring_t* ring,
                                                          const char* slots_mem, uint64_t mask, int shift,
                                                          const uint8_t* arena, uint32_t** out_io,
                                                          const uint32_t* out0, int64_t* starts) {
        const bpe_enc_slot_t* slots = (const bpe_enc_slot_t*)slots_mem;
        const bpe_enc_slot_t* sl;
        const bpe_enc_ring_t* base = ring + (size_t)k % BPE_ENC_RING - k;   /* piece j's entry: base + j */
        const bpe_enc_ring_t* r = base + k;
        int64_t* sp = starts != NULL ? starts + k : NULL;
        Py_ssize_t k_in = k;
        uint32_t n_ids;
        int more;
        for (;;) {
            if (starts != NULL)
                r = bpe_enc_probe_run1(r, base + k1, slots, mask, shift, arena, out_io, &sp, out0, &more);
            else
                r = bpe_enc_probe_run0(r, base + k1, slots, mask, shift, arena, out_io, &more);
            k = r - base;
            if (!more)
                break;
            sl = bpe_enc_find_short(slots_mem, mask, shift, arena, r);     /* a key with more than 4 ids */
            if (sl == NULL)
                break;
            n_ids = sl->meta & 0xFFF;
            if (starts != NULL)
                sp++;                                   /* (its start written by the loop) */
            memcpy(*out_io, n_ids > 4 ? (const void*)(arena + sl->off) : (const void*)sl->ids,
                   (n_ids > 4 ? n_ids : 4) * sizeof(uint32_t));
            *out_io += n_ids;
            r++;
        }
        if (k > k_in)
            *qa_io = ends[k - 1];
        return k;
    }
    """
    uint64_t _load_head "bpe_enc_load_head"(const uint8_t* p, Py_ssize_t n, const uint8_t* limit) noexcept nogil
    uint64_t _key_hash "bpe_enc_key_hash"(const uint8_t* p, Py_ssize_t n, uint64_t w0, const uint8_t* limit) noexcept nogil
    ctypedef struct RingEntry "bpe_enc_ring_t":
        uint64_t w0
        uint64_t w1
        uint64_t h
        int64_t n
    void hash_block "bpe_enc_hash_block"(const uint8_t* s, Py_ssize_t qa, const int64_t* ends, Py_ssize_t k0,
                                         Py_ssize_t k1, const uint8_t* limit, size_t max_len, const char* slots,
                                         int shift, RingEntry* ring) noexcept nogil
    const Py_ssize_t C_RING "BPE_ENC_RING"
    Py_ssize_t probe_block "bpe_enc_probe_block"(Py_ssize_t* qa, const int64_t* ends, Py_ssize_t k, Py_ssize_t k1,
                                                 const RingEntry* ring, const char* slots, uint64_t mask, int shift,
                                                 const uint8_t* arena, token_id_t** out, const token_id_t* out0,
                                                 int64_t* starts) noexcept nogil
    ctypedef struct C_SLOT "bpe_enc_slot_t":
        uint64_t w0
        uint32_t meta
        uint32_t off
# ``_load_head(p, n, limit)``: the first ``min(n, 8)`` bytes at p, zero-padded, little-endian; never
# reads at or past limit. ``_key_hash(p, n, w0, limit)``: the hash of the pretoken p[0:n] whose head
# word is w0 (multiply-xorshift, 8 bytes a step); its top bits are what depends on every key bit (a
# product's high bits): a cache slot is ``h >> shift`` (Fibonacci hashing), so a short key costs
# two multiplies and no final mix. ``hash_block``: ``_emit_pieces``' hashing of a block of pieces.

# hash_block prefetches slot h >> shift at (h >> shift) << 5, and the C probe reads CacheSlot as bpe_enc_slot_t
if (sizeof(CacheSlot) != 32 or C_RING != RING or sizeof(C_SLOT) != sizeof(CacheSlot) or sizeof(token_id_t) != 4
        or <size_t>&(<CacheSlot*>NULL).meta != <size_t>&(<C_SLOT*>NULL).meta
        or <size_t>&(<CacheSlot*>NULL).off != <size_t>&(<C_SLOT*>NULL).off):
    raise ImportError("bpe_core._encode: a cache slot must be 32 bytes as the C probe reads it, and the rings agree")


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
