# _encode.pyx, part 5d of 10 (``include``d: compiled into the module as if written there).
# The pieces' ids out of the cache (``Encoder._emit_pieces``): the hashing of a block of pieces
# ahead of its probes, the probe loop of the short cache hits (a C loop of its own), and the
# slow pieces handed to ``Encoder._emit_slow``. A module-level function over an ``Encoder`` (the
# class keeps the method, a thin wrapper over it).

# ==== The short cache hits ===================================================================


cdef extern from *:
    """
    /* What bpe_enc_emit_hits reads of the cache probed first and of the text (set once a call). */
    typedef struct {
        const char* slots;          /* 32-byte slots: head word at 0, meta at 8, off at 12, ids at 16 */
        uint64_t mask;
        int shift;
        size_t short_max;           /* the longest piece probed here: min(max_cached_len, 16) */
        const uint8_t* arena;
        const uint8_t* s;           /* the text */
    } bpe_enc_probe_t;
    /* bpe_enc_hash_block with the pieces' starts and lengths in the ring too: piece k's head word,
       hash, start (an offset into s) and length at ring[4 * (k % BPE_ENC_RING)] .. + 3 (the
       start and length of every piece; the head word and hash of those of 1 to max_len bytes),
       so bpe_enc_emit_hits reads the ring alone. */
    static BPE_ENC_NOINLINE void bpe_enc_hash_block4(const uint8_t* s, Py_ssize_t qa, const int64_t* ends,
                                                     Py_ssize_t k0, Py_ssize_t k1, const uint8_t* limit,
                                                     size_t max_len, const char* slots, int shift,
                                                     uint64_t* ring) {
        const int64_t* pe = ends + k0;
        const int64_t* pend = ends + k1;
        uint64_t* r = ring + 4 * ((size_t)k0 % BPE_ENC_RING);   /* (k0 .. k1 - 1 do not wrap) */
        Py_ssize_t e, n;
        uint64_t w0, h;
        for (; pe < pend; pe++, r += 4) {
            e = *pe;
            n = e - qa;
            r[2] = (uint64_t)qa;
            r[3] = (uint64_t)n;
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
    /* The run of cache hits among the pieces k .. k1 - 1 (their head words, hashes, starts and
       lengths in the ring, as bpe_enc_hash_block4 wrote them; k .. k1 - 1 lie in one turn of the
       ring, and the text is readable 8 bytes past the end of piece k1 - 1 (the caller's check):
       the ids of each piece of 1 to short_max bytes found in the cache are written at *o. Stops
       at the first piece that is not such a hit (not cached, or longer) and returns its index (k1
       when every piece was one), *o moved past what was written. A slot is read as _find_slot
       reads it: its meta word first (acquire: a batch job's writer publishes a slot by its meta
       word), then its head word; a key of 9 to 16 bytes compares its second word too.
       Out of line and reading the ring alone, so its values stay in registers: in _emit_pieces'
       one loop, which also called the slow path and read the ends, some ten values lived on the
       stack and a hit took ~44 instructions (GPT-2 on English, warm). */
    static BPE_ENC_NOINLINE Py_ssize_t bpe_enc_emit_hits(const bpe_enc_probe_t* P, const uint64_t* ring,
                                                         Py_ssize_t k, Py_ssize_t k1, uint32_t** o) {
        const char* slots = P->slots;
        const uint64_t mask = P->mask;
        const int shift = P->shift;
        const size_t short_max = P->short_max;
        const uint64_t* r0 = ring + 4 * ((size_t)k % BPE_ENC_RING);
        const uint64_t* r = r0;
        const uint64_t* rend = r0 + 4 * (k1 - k);
        uint32_t* out = *o;
        const char* sl;
        const uint8_t* tail;
        uint64_t slot, head, n;
        uint32_t meta, n_ids, off, want;
        for (; r < rend; r += 4) {
            n = r[3];
            if (n - 1 >= short_max)
                break;                          /* longer (or empty): the caller's */
            slot = r[1] >> shift;
            want = (uint32_t)n << 12;
            for (;;) {
                sl = slots + (slot << 5);
                meta = __atomic_load_n((const uint32_t*)(sl + 8), __ATOMIC_ACQUIRE);
                memcpy(&head, sl, 8);
                if (head == r[0] && (meta & 0xFFF000u) == want) {
                    if (n <= 8)
                        break;
                    n_ids = meta & 0xFFF;
                    memcpy(&off, sl + 12, 4);
                    tail = P->arena + off + (n_ids > 4 ? n_ids * 4 : 0);
                    if (((bpe_enc_load_le64(tail) ^ bpe_enc_load_le64(P->s + r[2] + 8))
                         & bpe_enc_head_masks[n - 8]) == 0)
                        break;
                } else if (meta == 0) {
                    goto done;                  /* not cached: the caller's */
                }
                slot = (slot + 1) & mask;
            }
            n_ids = meta & 0xFFF;
            if (__builtin_expect(n_ids <= 4, 1)) {
                memcpy(out, sl + 16, 16);       /* all four (the unused ones are 0): one move */
            } else {
                memcpy(&off, sl + 12, 4);
                memcpy(out, P->arena + off, (size_t)n_ids * 4);
            }
            out += n_ids;
        }
    done:
        *o = out;
        return k + (r - r0) / 4;
    }
    """
    ctypedef struct probe_t "bpe_enc_probe_t":
        const char* slots
        uint64_t mask
        int shift
        size_t short_max
        const uint8_t* arena
        const uint8_t* s
    void hash_block4 "bpe_enc_hash_block4"(const uint8_t* s, Py_ssize_t qa, const int64_t* ends, Py_ssize_t k0,
                                           Py_ssize_t k1, const uint8_t* limit, size_t max_len, const char* slots,
                                           int shift, uint64_t* ring) noexcept nogil
    Py_ssize_t emit_hits "bpe_enc_emit_hits"(const probe_t* P, const uint64_t* ring, Py_ssize_t k, Py_ssize_t k1,
                                            token_id_t** o) noexcept nogil


cdef CacheSlot _LAYOUT_PROBE
if (<char*>&_LAYOUT_PROBE.meta - <char*>&_LAYOUT_PROBE != 8 or <char*>&_LAYOUT_PROBE.off - <char*>&_LAYOUT_PROBE != 12
        or <char*>&_LAYOUT_PROBE.ids[0] - <char*>&_LAYOUT_PROBE != 16 or sizeof(token_id_t) != 4):
    raise ImportError("bpe_core._encode: the cache slot layout is not the one bpe_enc_emit_hits reads")


cdef int _emit_pieces_of(Encoder enc, const uint8_t* s, Py_ssize_t a, const int64_t* ends, Py_ssize_t count,
                         const uint8_t* limit) except -1 nogil:
    """``Encoder._emit_pieces`` without ``starts``: the ids of the pretokens ``s[a:ends[0]]``,
    ``s[ends[0]:ends[1]]``, ... appended to the encoder's output.

    The pieces are hashed and their slots prefetched a block (``BLOCK`` pieces) before they are
    probed (``hash_block4``); the hits of a block among its pieces of up to 16 bytes are written
    by ``emit_hits`` (up to the last one or two pieces of a text, those that end within 8 bytes
    of the end of what is readable: probed by ``_find_slot``), every other piece by
    ``Encoder._emit_slow`` (probed there, looked up in the other caches or merged). The cache
    probed first is the shared one during a batch job (most pieces are there; ours is asked
    next, in ``_cache_miss``), else ours (refreshed after each slow piece: it may grow). The
    same ids, in the same order, as the one loop of ``_emit_pieces`` with ``starts``.

    Figures (callgrind, GPT-2, warm ``encode_batch_flat`` of 5 MB of held-out English on two
    threads): hashing and emitting took 93.9M instructions a call in that one loop, 88.0M here
    (the whole call 141.4M, 137.2M); cl100k on 5 MB of code 152.8M, 145.4M.
    """
    cdef uint64_t ring[4 * RING]            # head word, hash, start, length of each piece (hash_block4)
    cdef const uint64_t* r
    cdef Py_ssize_t i, b0, b1, n, safe
    cdef CacheSlot* sl
    cdef uint32_t n_ids
    cdef size_t max_len = <size_t>enc.max_cached_len
    cdef token_id_t* out
    cdef token_id_t* o
    cdef bint has_shared = enc.shared is not None
    cdef probe_t P
    if count <= 0:
        return 0
    P.slots = <const char*>(enc.shared.slots if has_shared else enc.slots)
    P.mask = enc.shared.cache_mask if has_shared else enc.cache_mask
    P.shift = enc.shared.cache_shift if has_shared else enc.cache_shift
    P.short_max = min(max_len, <size_t>16)
    P.arena = enc.shared.arena if has_shared else enc.arena
    P.s = s
    enc._reserve_out(ends[count - 1] - a)
    out = enc.out_buf
    o = out + enc.out_n
    # Software pipelining by blocks, as _emit_pieces: block b + 1 hashed and prefetched, then
    # block b probed.
    hash_block4(s, a, ends, 0, min(count, <Py_ssize_t>BLOCK), limit, max_len, P.slots, P.shift, ring)
    b0 = 0
    while b0 < count:
        b1 = min(b0 + BLOCK, count)
        if b1 < count:                          # 1. hash, prefetch the next block
            hash_block4(s, ends[b1 - 1], ends, b1, min(b1 + BLOCK, count), limit, max_len, P.slots, P.shift,
                        ring)
        # 2. probe this one, emit: the short hits by emit_hits up to the pieces that end within 8
        # bytes of the end of the readable text (the last one or two of a text), those one by one
        safe = b1
        while safe > b0 and s + ends[safe - 1] + 8 > limit:
            safe -= 1
        i = b0
        while i < b1:
            if i < safe:
                i = emit_hits(&P, ring, i, safe, &o)
                if i >= b1:
                    break
            r = ring + 4 * (i & RING_MASK)      # piece i: longer, not in the cache probed first, or near the end
            n = <Py_ssize_t>r[3]
            if i >= safe and 0 < n <= <Py_ssize_t>P.short_max:
                sl = _find_slot(<CacheSlot*>P.slots, P.mask, P.shift, P.arena, s + r[2], n, r[0], r[1], limit)
                if sl != NULL:
                    n_ids = sl.meta & 0xFFF
                    if n_ids <= INLINE_IDS:
                        memcpy(o, sl.ids, INLINE_IDS * sizeof(token_id_t))
                    else:
                        memcpy(o, P.arena + sl.off, n_ids * sizeof(token_id_t))
                    o += n_ids
                    i += 1
                    continue
            o += enc._emit_slow(s + r[2], n, r[0], r[1], o, limit)
            if not has_shared:                  # (ours may have grown)
                P.slots = <const char*>enc.slots
                P.mask = enc.cache_mask
                P.shift = enc.cache_shift
                P.arena = enc.arena
            i += 1
        b0 = b1
    enc.out_n = o - out
    return 0
