# _encode.pyx, part 5 of 10 (``include``d: compiled into the module as if written there).
# The Encoder: the merge paths (scan, heap), cache hits and misses, pretokens and whole texts
# without the GIL, the output buffer and its hand-over (the cache itself: part 5b,
# ``_encode_encoder_cache.pxi``).

# ==== Encoder ================================================================================


cdef class Encoder:
    """Encodes text: special tokens, pre-tokenization, merging by rank, with a pretoken -> ids cache.

    One per thread (it owns the cache and scratch buffers).

    Args:
        table: the ``RankTable``.
        max_entries: the cache holds at most this many pretokens, then is cleared whole.
        max_cached_len: pretokens longer than this (bytes, at most 4095) are not cached.
        singles: the pieces proven to encode as one token (``build_singles`` over the same table),
            looked up when a piece is not in the cache, before merging it; None: merge every miss.

    Equivalent to ``reference.encode_pretoken`` followed by ``reference.token_ids`` per pretoken,
    and to ``reference.encode`` for ``encode_text``.

    >>> import numpy as np
    >>> t = RankTable(np.array([97], np.uint32), np.array([97], np.uint32),
    ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
    >>> enc = Encoder(t)
    >>> enc.encode_piece(b"aaa")
    [256, 97]
    >>> enc.encode_pieces(b"aaaaa", np.array([3, 5], np.int64)).tolist()   # b"aaa", b"aa"
    [256, 97, 256]
    >>> ids, stop, done = enc.encode_text(b"aaa aa<s>", 0, 9, 0, SpecialTable([b"<s>"], [257]))
    >>> ids.tolist(), stop, done                        # "aaa", " aa" (b" " + aa), "<s>"
    ([256, 97, 32, 256, 257], 9, True)
    """

    def __cinit__(self):
        self.slots_mem = NULL
        self.slots = NULL
        self.arena = NULL
        self.out_buf = NULL
        self.ends_buf = NULL
        self.text_buf = NULL
        self.text_cap = 0

    def __init__(self, RankTable table not None, Py_ssize_t max_entries=1 << 18,
                 Py_ssize_t max_cached_len=256, Encoder singles=None):
        if max_entries < 1 or max_cached_len < 0:
            raise ValueError("max_entries must be positive and max_cached_len non-negative")
        if max_cached_len > 4095:
            raise ValueError("max_cached_len is at most 4095")
        if singles is not None and singles.table is not table:
            raise ValueError("singles must be built over the same rank table")
        self.table = table
        self.shared = None
        self.singles = singles
        self.single_hits = 0
        self.max_entries = max_entries
        self.max_cached_len = max_cached_len
        self.n_entries = 0
        self.misses = 0
        self.arena_size = 0
        self.arena_cap = 0
        self.out_n = 0
        self.out_cap = 0
        self.ends_buf = <int64_t*>PyMem_Malloc(ENDS_CAP * sizeof(int64_t))
        if self.ends_buf == NULL:
            raise MemoryError()
        # The slot table starts small (128 KiB stays in L2) and doubles at 2/3 load.
        if _slots_alloc(self, MIN_SLOTS) < 0:
            raise MemoryError()

    def __dealloc__(self):
        free(self.slots_mem)
        free(self.arena)
        free(self.out_buf)
        free(self.text_buf)
        PyMem_Free(self.ends_buf)

    # ---- merging one pretoken ----------------------------------------------------------------

    cdef Py_ssize_t _merge_scan(self, const uint8_t* piece, Py_ssize_t n, token_id_t* out) noexcept nogil:
        """Merge ``piece[0:n]`` (n <= SHORT_PIECE) by repeated min-rank scans; ids to ``out``.

        One merge a step, as the heap path: the leftmost pair of the lowest rank ``r`` is merged,
        the tail moves down one place and the two pairs that touch the new token are looked up (a
        pair made with a rank below ``r`` has been passed by the replay: ``rank_after``). This is
        the reference's "every occurrence of ``r``, left to right, then the next rank": a pair that
        a merge makes never has rank ``r`` (its token is longer than either part of ``r``'s pair,
        and ids are canonical by bytes), so the next occurrence of ``r`` is the next one the
        reference merges. A step costs a scan of the ranks and a short move, not a rewrite of the
        piece. The first ranks, of pairs of two bytes, are read from ``RankTable.byte_ranks``
        (indexed by the two bytes: no hash, no probe).
        """
        cdef token_id_t tok[SHORT_PIECE]
        cdef uint32_t rk[SHORT_PIECE]
        cdef Py_ssize_t m = n, i, j
        cdef uint32_t r, nr
        for i in range(m):
            tok[i] = self.table.byte_ids[piece[i]]
        if m <= 1:
            memcpy(out, tok, m * sizeof(token_id_t))
            return m
        for i in range(m - 1):
            rk[i] = self.table.byte_ranks[(<uint32_t>piece[i] << 8) | piece[i + 1]]
        rk[m - 1] = NO_RANK
        while m > 1:
            r = NO_RANK                         # 1. the leftmost lowest rank
            i = 0
            for j in range(m - 1):
                if rk[j] < r:
                    r = rk[j]
                    i = j
            if r == NO_RANK:
                break
            tok[i] = self.table.merged_ids[r]   # 2. merge it; the tail moves down one place
            for j in range(i + 1, m - 1):
                tok[j] = tok[j + 1]
                rk[j] = rk[j + 1]
            m -= 1
            rk[m - 1] = NO_RANK
            if i + 1 < m:                       # 3. the pairs around the new token
                nr = self.table.rank_of(tok[i], tok[i + 1])
                if nr < r:                      # made after its rank: the replay has passed it
                    nr = self.table.rank_after(tok[i], tok[i + 1], r)
                rk[i] = nr
            if i > 0:
                nr = self.table.rank_of(tok[i - 1], tok[i])
                if nr < r:
                    nr = self.table.rank_after(tok[i - 1], tok[i], r)
                rk[i - 1] = nr
        memcpy(out, tok, m * sizeof(token_id_t))
        return m

    cdef Py_ssize_t _merge_heap(self, const uint8_t* piece, Py_ssize_t n, token_id_t* out) except -1 nogil:
        """Merge ``piece[0:n]`` with a linked list and a lazy min-heap; ids to ``out`` (room for n)."""
        cdef Py_ssize_t i, p, q, nq, pp, m = 0
        cdef uint32_t r, cur = 0, nr
        cdef uint64_t top
        self.toks.resize(n)
        self.pair_ranks.resize(n)
        self.nexts.resize(n)
        self.prevs.resize(n)
        self.heap.clear()
        cdef token_id_t* tok = self.toks.data()
        cdef uint32_t* prk = self.pair_ranks.data()
        cdef int64_t* nxt = self.nexts.data()
        cdef int64_t* prv = self.prevs.data()
        for i in range(n):
            tok[i] = self.table.byte_ids[piece[i]]
            nxt[i] = i + 1
            prv[i] = i - 1
        prk[n - 1] = NO_RANK
        # Heap entries are complemented keys, so std's max-heap pops the lowest (rank, position).
        for i in range(n - 1):
            prk[i] = self.table.rank_of(tok[i], tok[i + 1])
            if prk[i] != NO_RANK:
                self.heap.push_back(~((<uint64_t>prk[i] << 32) | <uint64_t>i))
                push_heap(self.heap.begin(), self.heap.end())
        while not self.heap.empty():
            top = ~self.heap.front()
            r = <uint32_t>(top >> 32)
            p = <Py_ssize_t>(top & 0xFFFFFFFFu)
            cur = r
            pop_heap(self.heap.begin(), self.heap.end())
            self.heap.pop_back()
            if prk[p] != r:
                continue    # stale: p is dead or its pair changed
            q = nxt[p]
            nq = nxt[q]
            tok[p] = self.table.merged_ids[r]
            nxt[p] = nq
            if nq < n:
                prv[nq] = p
            prk[q] = NO_RANK
            # The pairs (p, nq) and (prv[p], p) are new.
            # (a pair made after its rank has passed waits for its next rank: rank_after)
            nr = self.table.rank_of(tok[p], tok[nq]) if nq < n else NO_RANK
            if nr < cur:
                nr = self.table.rank_after(tok[p], tok[nq], cur)
            prk[p] = nr
            self._push(nr, p)
            pp = prv[p]
            if pp >= 0:
                nr = self.table.rank_of(tok[pp], tok[p])
                if nr < cur:
                    nr = self.table.rank_after(tok[pp], tok[p], cur)
                prk[pp] = nr
                self._push(nr, pp)
        p = 0
        while p < n:
            out[m] = tok[p]
            m += 1
            p = nxt[p]
        return m

    cdef int _push(self, uint32_t rank, Py_ssize_t pos) except -1 nogil:
        if rank == NO_RANK:
            return 0
        self.heap.push_back(~((<uint64_t>rank << 32) | <uint64_t>pos))
        push_heap(self.heap.begin(), self.heap.end())
        return 0

    cdef Py_ssize_t _merge(self, const uint8_t* piece, Py_ssize_t n, token_id_t* out) except -1 nogil:
        if n <= SHORT_PIECE:
            return self._merge_scan(piece, n, out)
        return self._merge_heap(piece, n, out)

    # ---- the pretoken cache (``_encode_encoder_cache.pxi``) ------------------------------------

    def reserve_shared(self, int64_t n_bytes):
        """Make room in this cache for the new pieces of a batch of ``n_bytes`` bytes, before it
        serves as the job's ``shared`` cache (``BatchJob.run``), which is not grown while the job
        runs: slots for ``max(e, 8 * n_bytes ** 0.6 - entries)`` more entries at 3/4 load, with
        ``e`` an eighth of that guess (distinct pretokens measured: 24k in 1 MB of English, 62.6k in
        5 MB, 31k in 5 MB of code; a warm cache already holds most of a batch's), and 8 arena
        bytes each. Within ``max_entries``; what does not fit goes to the threads' own caches.
        Returns the number of entries reserved for."""
        cdef Py_ssize_t got
        with nogil:
            got = _reserve_shared(self, n_bytes)
        return got

    # ---- encoding runs of pretokens ----------------------------------------------------------

    cdef int _reserve_out(self, Py_ssize_t extra, bint huge=False) except -1 nogil:
        """Room for ``extra`` more ids, plus INLINE_IDS of slack (cache hits copy a whole slot);
        ``huge``: the room will be filled, use huge pages (``grow_buffer``)."""
        cdef Py_ssize_t need = self.out_n + extra + INLINE_IDS, cap
        cdef token_id_t* grown
        if need <= self.out_cap:
            return 0
        if self.out_pinned:                 # (another thread reads the buffer: it must not move)
            with gil:
                raise RuntimeError(f"an encoder's pinned id buffer of {self.out_cap} ids would need {need}")
        cap = max(2 * self.out_cap, need, <Py_ssize_t>4096)
        if huge and self.out_n == 0 and cap >= SPARE_MIN_IDS:
            grown = _spare_take(need, &cap)    # the spare, mapped already (``_encode_outputs.pxi``)
            if grown != NULL:
                free(self.out_buf)
                self.out_buf = grown
                self.out_cap = cap
                return 0
        grown = <token_id_t*>grow_buffer(self.out_buf, self.out_n * sizeof(token_id_t), cap * sizeof(token_id_t),
                                         huge)
        if grown == NULL:
            with gil:
                raise MemoryError()
        self.out_buf = grown
        self.out_cap = cap
        return 0

    cdef int _emit_pieces(self, const uint8_t* s, Py_ssize_t a, const int64_t* ends, Py_ssize_t count,
                          const uint8_t* limit, int64_t* starts) except -1 nogil:
        """Append the ids of the pretokens ``s[a:ends[0]]``, ``s[ends[0]:ends[1]]``, ... to ``out``.

        ``limit`` is the end of the readable buffer (8-byte loads never cross it). The pieces are
        hashed and their slots prefetched a block (``BLOCK`` pieces) before they are probed (the keys of
        up to 16 bytes by ``probe_block``, a C loop; any other piece here, ``_emit_slow``). A piece is
        looked up in ``shared`` (during a batch job) and in this encoder's cache, then
        (``_cache_miss``) in ``singles``; only a piece found nowhere is merged. ``starts``
        (NULL, or room for ``count``): where each pretoken's ids start in ``out``.

        A piece of one byte takes the same path (its id is cached as any other piece's): a
        branch on the length of each piece is mispredicted on real text (a quarter of the pieces
        of code are one byte, at random), and the uniform path was ~30% faster per CPU-second
        than the special case, though it hashes and probes those pieces too.
        """
        cdef RingEntry ring[RING]               # what hash_block found of each piece of two blocks
        cdef const RingEntry* r
        cdef Py_ssize_t i, qi, e, b0, b1
        cdef size_t max_len = <size_t>self.max_cached_len
        cdef token_id_t* out
        cdef token_id_t* o                      # where the next ids go (a register, not out + n)
        # the cache probed first: the shared one during a batch job (most pieces are there; ours
        # is asked next, in _cache_miss), else ours (refreshed after each slow piece: it may grow)
        cdef bint has_shared = self.shared is not None
        cdef CacheSlot* fslots = self.shared.slots if has_shared else self.slots
        cdef uint64_t fmask = self.shared.cache_mask if has_shared else self.cache_mask
        cdef int fshift = self.shared.cache_shift if has_shared else self.cache_shift
        cdef const uint8_t* farena = self.shared.arena if has_shared else self.arena
        if count <= 0:
            return 0
        self._reserve_out(ends[count - 1] - a)
        out = self.out_buf
        o = out + self.out_n
        # Software pipelining by blocks: the pieces of block b + 1 are hashed and their slots
        # prefetched (hash_block, a C loop of its own: its values stay in registers), then those of
        # block b are probed, so every probe finds its line on the way (BLOCK to 2 * BLOCK pieces
        # after its prefetch). The one loop that hashed a piece 16 places on while it probed this
        # one spilled some ten values to the stack (GPT-2 on English, warm: 86 instructions a piece
        # there, 76 with the two loops). (One batch of hashes, then the same batch's probes, left the
        # first probes waiting on memory.) The probes of the keys of up to 16 bytes are a C loop
        # too (probe_block), over the ring entries alone (head and second word, hash, length): 48
        # instructions a piece as Cython's loop here, 33 there; the hashing, without a branch on
        # the length, 37 -> 34 (callgrind, GPT-2, a warm encode of 1 MB of held-out English).
        hash_block(s, a, ends, 0, min(count, <Py_ssize_t>BLOCK), limit, max_len, <const char*>fslots, fshift, ring)
        qi = a
        b0 = 0
        while b0 < count:
            b1 = min(b0 + BLOCK, count)
            if b1 < count:                          # 1. hash, prefetch the next block
                hash_block(s, ends[b1 - 1], ends, b1, min(b1 + BLOCK, count), limit, max_len,
                           <const char*>fslots, fshift, ring)
            i = b0
            while True:                             # 2. probe this one, emit
                # the pieces of 1 to 16 bytes found in the cache probed first (a C loop)
                i = probe_block(&qi, ends, i, b1, ring, <const char*>fslots, fmask, fshift, farena, &o, out, starts)
                if i >= b1:
                    break
                # any other piece (longer, uncached, not found)
                e = ends[i]
                if starts != NULL:
                    starts[i] = o - out
                r = &ring[i & RING_MASK]            # its head word and hash (a key's)
                o += self._emit_slow(s + qi, e - qi, r.w0, r.h, o, limit)
                if not has_shared:                  # (ours may have grown)
                    fslots = self.slots
                    fmask = self.cache_mask
                    fshift = self.cache_shift
                    farena = self.arena
                qi = e
                i += 1
            b0 = b1
        self.out_n = o - out
        return 0

    cdef Py_ssize_t _emit_slow(self, const uint8_t* p, Py_ssize_t n, uint64_t w0, uint64_t h, token_id_t* out,
                               const uint8_t* limit) except -1 nogil:
        """The ids of a piece that ``_emit_pieces`` did not find inline, to ``out``; returns their
        number: a key of 1 to 16 bytes (and at most ``max_cached_len``) not in the cache probed
        first, a longer cached key (looked up here: ``w0``, ``h`` hold its head and hash), a piece
        longer than ``max_cached_len`` (merged, not cached) or an empty one."""
        cdef CacheSlot* sl
        cdef const uint8_t* arena
        cdef uint32_t n_ids
        if n <= 0:
            return 0
        if n > self.max_cached_len:
            return self._merge(p, n, out)
        if n > 16:                                  # (a key of up to 16 bytes was probed inline)
            if self.shared is not None:
                arena = self.shared.arena
                sl = _find_slot(self.shared.slots, self.shared.cache_mask, self.shared.cache_shift, arena,
                                p, n, w0, h, limit)
            else:
                arena = self.arena
                sl = _find_slot(self.slots, self.cache_mask, self.cache_shift, arena, p, n, w0, h, limit)
            if sl != NULL:
                n_ids = sl.meta & 0xFFF
                if n_ids <= INLINE_IDS:
                    memcpy(out, sl.ids, INLINE_IDS * sizeof(token_id_t))
                else:
                    memcpy(out, arena + sl.off, n_ids * sizeof(token_id_t))
                return n_ids
        return self._cache_miss(p, n, w0, h, out)

    cdef Py_ssize_t _cache_miss(self, const uint8_t* p, Py_ssize_t n, uint64_t w0, uint64_t h,
                                token_id_t* out) except -1 nogil:
        """The ids of a piece not in the cache probed first (``_emit_pieces``), to ``out`` (room for
        ``n + INLINE_IDS``); returns their number. During a batch job that was the shared cache and
        ours is asked next (when it holds anything); then the proven single tokens, else the piece
        is merged. What was found in neither cache is added to the shared one while it has room
        (so the job's other threads find it there), else to ours."""
        cdef CacheSlot* sl
        cdef uint32_t n_ids
        cdef Py_ssize_t got
        cdef bint has_shared = self.shared is not None
        if has_shared and self.n_entries:
            sl = _cache_find(self, p, n, w0, h)
            if sl != NULL:
                n_ids = sl.meta & 0xFFF
                if n_ids <= INLINE_IDS:
                    memcpy(out, sl.ids, INLINE_IDS * sizeof(token_id_t))
                else:
                    memcpy(out, self.arena + sl.off, n_ids * sizeof(token_id_t))
                return n_ids
        sl = NULL
        if self.singles is not None:
            sl = _cache_find(self.singles, p, n, w0, h)
        if sl != NULL:
            self.single_hits += 1
            out[0] = sl.ids[0]
            got = 1
        else:
            self.misses += 1
            got = self._merge(p, n, out)
        if not has_shared or _shared_insert(self.shared, p, n, w0, h, out, got) < 0:
            _cache_insert(self, p, n, w0, h, out, got)
        return got

    cdef Py_ssize_t _encode_span(self, int pattern_id, const uint8_t* s, Py_ssize_t a, Py_ssize_t b,
                                 bint closed, const uint8_t* limit) except -1 nogil:
        """Pre-tokenize and encode the text ``s[a:b]`` (no special token in it); returns where it stopped.

        ``closed``: the text ends at ``b`` (a special token or the end of the input follows), so
        every pretoken is final and the result is ``b``. Otherwise the text may continue after
        ``b``: an unfinished UTF-8 character at the end and the last ``HOLD_BACK`` pretokens are
        left out (for the named patterns a pretoken is decided by the text up to one character past
        its end, so only the last one can change; two is the margin), and the result is where the
        held-back text starts. Equivalent to ``Tokenizer._text_ends`` + ``encode_pieces``.
        """
        cdef int64_t* ends = self.ends_buf
        cdef Py_ssize_t p, got, total, use, k, carry = 0, piece_start = a
        if not closed:
            b = _utf8_stable_end(s, a, b)
            if b <= a:
                return a
        p = a
        while p < b:
            got = _split_ends(pattern_id, s, &p, b, ends + carry, ENDS_CAP - carry)
            total = carry + got
            use = total
            if not closed:
                use = total - HOLD_BACK if total > HOLD_BACK else 0
            if use > 0:
                self._emit_pieces(s, piece_start, ends, use, limit, NULL)
                piece_start = ends[use - 1]
            carry = total - use
            for k in range(carry):
                ends[k] = ends[use + k]
        return b if closed else piece_start

    cdef int _encode_text(self, int pattern_id, const Specials* sp, const uint8_t* s, Py_ssize_t n_buf,
                          Py_ssize_t pos, Py_ssize_t end, Py_ssize_t max_bytes, bint open_end,
                          Py_ssize_t* stop, bint* done) except -1 nogil:
        """The loop of ``encode_text``: special tokens, then the text before each, window by window."""
        cdef const uint8_t* limit = s + n_buf
        cdef Py_ssize_t start = pos, window, text_end, ms = 0, me = 0, q
        cdef token_id_t mid = 0
        cdef bint found, closed
        while pos < end:
            window = end if (max_bytes <= 0 or end - pos <= max_bytes) else pos + max_bytes
            found = sp != NULL and _find_special(sp, s, pos, window, end, &ms, &me, &mid)
            if found:
                text_end = ms
                closed = True
            else:
                text_end = window
                closed = window == end and not open_end
            if text_end > pos:
                q = self._encode_span(pattern_id, s, pos, text_end, closed, limit)
                if not closed:
                    # The text goes on after the window (or, at an open end, after `end`): what is
                    # held back waits for the next call, with a wider window or more input.
                    stop[0] = q
                    done[0] = window == end
                    return 0
                pos = text_end
            if found:
                self._reserve_out(1)
                self.out_buf[self.out_n] = mid
                self.out_n += 1
                pos = me
            if max_bytes > 0 and pos - start >= max_bytes:
                break
        stop[0] = pos
        done[0] = pos >= end
        return 0

    cdef object _take_out(self):
        return _take_out_of(self)

    cdef object _take_counted(self, const int64_t[::1] lengths, bint narrow, int64_t* n_bytes):
        return _take_counted_of(self, lengths, narrow, n_bytes)

    # ---- Python entry points -----------------------------------------------------------------

    def encode_text(self, const uint8_t[::1] buf not None, Py_ssize_t start, Py_ssize_t end,
                    int pattern_id, SpecialTable specials=None, Py_ssize_t max_bytes=0,
                    bint open_end=False):
        """Encode ``buf[start:end]``: special tokens, pre-tokenization (a named pattern), merging.

        Args:
            buf: the bytes (any read-only C-contiguous buffer: ``bytes``, an mmap, a uint8 array).
            start, end: the range to encode; ``0 <= start <= end <= len(buf)``.
            pattern_id: ``_pretok.PATTERN_IDS[name]`` of a named pattern.
            specials: the special tokens to split out (None: none, as ``encode_ordinary``).
            max_bytes: stop after about this many input bytes (0: no limit), at a special token or
                at a provably final pretoken boundary, so calls can resume at ``stop``. A window
                without a special token is scanned at most ``max_bytes`` at a time.
            open_end: the text may continue after ``end`` (streaming): the last text span keeps
                back its open tail, as ``Tokenizer.encode_iterable`` needs.

        Returns:
            ``(ids, stop, done)``: the uint32 ids of ``buf[start:stop]``; ``done`` is True when
            nothing more can be encoded from this range (``stop == end``, or at an open end only
            held-back text is left). ``done`` False with ``stop == start`` means one pretoken is
            longer than the window: call again with a larger ``max_bytes``. The work runs without
            the GIL. Equivalent to ``reference.encode(buf[start:stop], ...)`` for the pieces it
            covers.
        """
        cdef Py_ssize_t n_buf = buf.shape[0], stop = start
        cdef bint done = True
        cdef const Specials* sp = &specials.c if specials is not None else NULL
        if not (0 <= start <= end <= n_buf):
            raise ValueError("need 0 <= start <= end <= len(buf)")
        if pattern_id < 0 or pattern_id > 2:
            raise ValueError(f"unknown pattern id {pattern_id}")
        self.out_n = 0
        if end > start:
            with nogil:
                self._encode_text(pattern_id, sp, &buf[0], n_buf, start, end, max_bytes, open_end,
                                  &stop, &done)
        return self._take_out(), stop, done

    def encode_whole(self, const uint8_t[::1] buf not None, Py_ssize_t start, Py_ssize_t end,
                     int pattern_id, SpecialTable specials=None, Py_ssize_t block=1 << 20):
        """:meth:`encode_text` of all of ``buf[start:end]`` (a closed end), ``block`` bytes at a
        time, into one array: the calls ``Tokenizer._iter_encode`` makes (a block that holds
        only part of one pretoken is retried twice as large), without an array per block and
        their concatenation. The buffer is reserved once for about a token per 3 bytes, in huge
        pages (a whole text's ids fill it): a 5 MB text faulted in some 2,300 4 KiB pages a call
        through the blocks (arrays and their join), a new process's first calls paying for each.

        >>> t = RankTable(np.array([97], np.uint32), np.array([98], np.uint32),
        ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
        >>> Encoder(t).encode_whole(b"ab abab  ab", 0, 11, 0, None, 3).tolist()
        [256, 32, 256, 256, 32, 32, 256]
        """
        cdef Py_ssize_t n_buf = buf.shape[0]
        cdef const Specials* sp = &specials.c if specials is not None else NULL
        if not (0 <= start <= end <= n_buf):
            raise ValueError("need 0 <= start <= end <= len(buf)")
        if pattern_id < 0 or pattern_id > 2:
            raise ValueError(f"unknown pattern id {pattern_id}")
        if block < 1:
            raise ValueError("block must be positive")
        self.out_n = 0
        if end > start:
            with nogil:
                self._encode_blocks(pattern_id, sp, &buf[0], n_buf, start, end, block)
        return self._take_out()

    def encode_all(self, text, int pattern_id, SpecialTable specials=None, Py_ssize_t block=1 << 20,
                   TokenTable tokens=None):
        """:meth:`encode_whole` of all of ``text``: a ``str`` (its UTF-8 with ``surrogateescape``)
        or any C-contiguous buffer of bytes. Returns the uint32 array of ids, or with ``tokens``
        the Python list of them (``tokens.to_list`` of that array, without the array).

        What ``Tokenizer.encode`` and ``encode_to_numpy`` call. A ``str`` that is not its own
        UTF-8 (not ASCII, none kept by CPython) is converted into a scratch buffer this encoder
        keeps from call to call (up to ``TEXT_KEEP`` bytes), and the list is built straight from
        the encoder's buffer, which it keeps too: a warm call then writes memory it wrote before
        instead of faulting in fresh pages for a bytes object and an array it throws away.

        >>> t = RankTable(np.array([97], np.uint32), np.array([98], np.uint32),
        ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
        >>> enc = Encoder(t)
        >>> enc.encode_all("ab é", 0).tolist(), enc.encode_all(b"ab", 0, tokens=TokenTable([bytes([i]) for i in range(256)] + [b"ab"]))
        ([256, 32, 195, 169], [256])
        """
        cdef const uint8_t* p = NULL
        cdef Py_ssize_t n = 0
        cdef const Specials* sp = &specials.c if specials is not None else NULL
        if pattern_id < 0 or pattern_id > 2:
            raise ValueError(f"unknown pattern id {pattern_id}")
        if block < 1:
            raise ValueError("block must be positive")
        keep = _text_in(self, text, &p, &n)     # (_encode_utf8.pxi: the scratch buffer)
        self.out_n = 0
        try:
            if n:
                with nogil:
                    self._encode_blocks(pattern_id, sp, p, n, 0, n, block)
        finally:
            _text_done(self)
        if tokens is None:
            return self._take_out()
        if self.out_n == 0:
            return []
        result = tokens._list(self.out_buf, self.out_n)
        gc_track(<PyObject*>result)
        _out_taken(self)
        return result

    cdef int _encode_blocks(self, int pattern_id, const Specials* sp, const uint8_t* s, Py_ssize_t n_buf,
                            Py_ssize_t start, Py_ssize_t end, Py_ssize_t block) except -1 nogil:
        """The loop of ``encode_whole`` over ``s[start:end]`` (``start < end <= n_buf``, the
        readable bytes): ``_encode_text`` block by block (a block that holds only part of one
        pretoken is retried twice as large), after one reservation of about a token per 3 bytes,
        in huge pages (the ids will fill it)."""
        cdef Py_ssize_t pos = start, stop = start, size = block
        cdef bint done = False
        self._reserve_out(min((end - start) // 3, <Py_ssize_t>RESERVE_MAX), True)
        while True:
            self._encode_text(pattern_id, sp, s, n_buf, pos, end, size, False, &stop, &done)
            if done:
                return 0
            size = 2 * size if stop == pos else block
            pos = stop

    def encode_counted(self, const uint8_t[::1] buf not None, Py_ssize_t start, Py_ssize_t end,
                       int pattern_id, SpecialTable specials, Py_ssize_t max_bytes,
                       const int64_t[::1] lengths not None, bint narrow=False):
        """:meth:`encode_text` (a closed end) for the corpus encoder, with the ids' byte count
        in the same pass: ``(ids, stop, done, n_bytes)``. ``ids`` are uint16 when ``narrow``
        (then ``len(lengths) <= 65536``), else uint32; ``n_bytes`` is ``lengths[ids].sum()``, or
        -1 when an id is outside ``lengths`` (``sum_lengths``' contract).

        >>> t = RankTable(np.array([97], np.uint32), np.array([98], np.uint32),
        ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
        >>> lengths = np.array([1] * 256 + [2], np.int64)
        >>> ids, stop, done, n = Encoder(t).encode_counted(b"abc ab", 0, 6, 0, None, 0, lengths, True)
        >>> ids.tolist(), ids.dtype.name, stop, done, n
        ([256, 99, 32, 256], 'uint16', 6, True, 6)
        """
        cdef Py_ssize_t n_buf = buf.shape[0], stop = start
        cdef bint done = True
        cdef int64_t n_bytes = 0
        cdef const Specials* sp = &specials.c if specials is not None else NULL
        if not (0 <= start <= end <= n_buf):
            raise ValueError("need 0 <= start <= end <= len(buf)")
        if pattern_id < 0 or pattern_id > 2:
            raise ValueError(f"unknown pattern id {pattern_id}")
        if narrow and lengths.shape[0] > (1 << 16):
            raise ValueError("narrow needs a table of at most 65536 ids")
        self.out_n = 0
        if end > start:
            with nogil:
                self._encode_text(pattern_id, sp, &buf[0], n_buf, start, end, max_bytes, False,
                                  &stop, &done)
        ids = self._take_counted(lengths, narrow, &n_bytes)
        return ids, stop, done, n_bytes

    def encode_piece(self, const uint8_t[::1] piece, str method="auto"):
        """Token ids of one pretoken (no cache): ``method`` is ``auto``, ``scan`` or ``heap``.

        ``scan`` accepts pieces up to 128 bytes. Equivalent to ``reference.encode_pretoken``.
        """
        cdef Py_ssize_t n = piece.shape[0], m = 0
        cdef vector[token_id_t] out
        if n == 0:
            return []
        out.resize(n)
        if method == "scan" or (method == "auto" and n <= SHORT_PIECE):
            if n > SHORT_PIECE:
                raise ValueError(f"scan handles pieces up to {SHORT_PIECE} bytes")
            with nogil:
                m = self._merge_scan(&piece[0], n, out.data())
        elif method in ("heap", "auto"):
            with nogil:
                m = self._merge_heap(&piece[0], n, out.data())
        else:
            raise ValueError(f"unknown method {method!r}")
        return [int(out[i]) for i in range(m)]

    def encode_pieces(self, const uint8_t[::1] buf not None, const int64_t[::1] ends not None,
                      int64_t start=0, const int64_t[::1] forced_ids=None):
        """Encode the pretokens ``buf[start:ends[0]]``, ``buf[ends[0]:ends[1]]``, ... in order.

        The path for custom patterns (pre-tokenized by ``regex`` in Python); named patterns go
        through ``encode_text``.

        Args:
            buf: the bytes (any read-only buffer: ``bytes``, an mmap, a uint8 array).
            ends: int64, the end offset of each pretoken, non-decreasing, at most ``len(buf)``.
            start: where the first pretoken starts.
            forced_ids: optional int64, one per pretoken: ``-1`` to merge the bytes, an id >= 0 to
                emit for the whole piece (a special token), ``-2`` to emit nothing (text that a
                custom pattern does not match, which the reference drops).

        Returns:
            A uint32 ndarray of token ids. Runs without the GIL.
        """
        cdef Py_ssize_t n_pieces = ends.shape[0], k, k0
        cdef Py_ssize_t n_buf = buf.shape[0]
        cdef int64_t prev = start
        cdef bint has_forced = forced_ids is not None
        cdef const uint8_t* base
        if has_forced and forced_ids.shape[0] != n_pieces:
            raise ValueError("forced_ids must have one entry per pretoken")
        if start < 0 or start > n_buf:
            raise ValueError("start is outside the buffer")
        for k in range(n_pieces):
            if ends[k] < prev or ends[k] > n_buf:
                raise ValueError("ends must be non-decreasing and within the buffer")
            prev = ends[k]
        self.out_n = 0
        if n_buf == 0 or n_pieces == 0:
            return self._take_out()
        base = &buf[0]
        prev = start
        with nogil:
            k = 0
            while k < n_pieces:
                if has_forced and forced_ids[k] != -1:
                    if forced_ids[k] >= 0:
                        self._reserve_out(1)
                        self.out_buf[self.out_n] = <token_id_t>forced_ids[k]
                        self.out_n += 1
                    prev = ends[k]
                    k += 1
                    continue
                k0 = k                       # a run of pieces to merge
                while k < n_pieces and not (has_forced and forced_ids[k] != -1):
                    k += 1
                self._emit_pieces(base, prev, &ends[k0], k - k0, base + n_buf, NULL)
                prev = ends[k - 1]
        return self._take_out()

    def _pieces_with_starts(self, const uint8_t[::1] buf not None, const int64_t[::1] ends not None):
        """``encode_pieces(buf, ends)`` (the first pretoken starting at 0) and where each pretoken's
        ids start among them: ``(ids, starts)``, ``starts`` int64 with one entry per pretoken. For
        the tests: SuperBPE's stage 2 cuts its units at these starts, which ``_emit_pieces`` writes
        on each of its paths (the C probe loop, its careful probe, ``_emit_slow``); each call's
        array starts out filled with -1, so a start left unwritten shows."""
        cdef Py_ssize_t n_pieces = ends.shape[0], k
        cdef Py_ssize_t n_buf = buf.shape[0]
        cdef int64_t prev = 0
        starts = np.full(max(n_pieces, 1), -1, dtype=np.int64)
        cdef int64_t[::1] sv = starts
        for k in range(n_pieces):
            if ends[k] < prev or ends[k] > n_buf:
                raise ValueError("ends must be non-decreasing and within the buffer")
            prev = ends[k]
        self.out_n = 0
        if n_buf > 0 and n_pieces > 0:
            self._emit_pieces(&buf[0], 0, &ends[0], n_pieces, &buf[0] + n_buf, &sv[0])
        return self._take_out(), starts[:n_pieces]

    def cache_info(self):
        """``{"entries", "misses", "single_hits", "bytes"}`` of the pretoken cache (misses =
        pretokens merged; single_hits = misses of the cache found in ``singles`` instead)."""
        return {
            "entries": int(self.n_entries),
            "misses": int(self.misses),
            "single_hits": int(self.single_hits),
            "bytes": int(self.arena_cap + sizeof(CacheSlot) * self.n_slots),
        }

    def absorb_cache(self, Encoder other not None):
        """Move ``other``'s cached pretokens into this encoder's cache (those it lacks), then
        empty ``other``'s (its slots shrink back to the initial size): what a batch job's threads
        learned beside the shared cache is kept for the next call. Both encoders share one rank
        table and no other thread uses them meanwhile.

        >>> t = RankTable(np.array([97], np.uint32), np.array([98], np.uint32),
        ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
        >>> a, b = Encoder(t), Encoder(t)
        >>> _ = b.encode_text(b"ab abab", 0, 7, 0)
        >>> a.absorb_cache(b); a.cache_info()["entries"] > 0 == b.cache_info()["entries"]
        True
        """
        if other.table is not self.table:
            raise ValueError("the encoders must share one rank table")
        if other is self:
            return
        with nogil:
            _absorb(self, other)

    def clear_cache(self):
        """Drop every cached pretoken."""
        _cache_clear(self)

    def set_max_entries(self, Py_ssize_t n):
        """Hold at most ``n`` pretokens from now on (the cache is cleared whole when full); below the
        entries it holds, the cache is emptied and its memory given back (a new encoder's)."""
        if n < 1:
            raise ValueError("max_entries must be positive")
        if _set_max_entries(self, n) < 0:
            raise MemoryError()

    def copy_cache_from(self, Encoder other not None):
        """Make this encoder's pretoken cache a copy of ``other``'s (an encoder over the same rank
        table, used by no other thread meanwhile): a thread that joins a batch starts as warm as
        the encoder that ran before (two memcpy: the slots and the arena).

        >>> t = RankTable(np.array([97], np.uint32), np.array([98], np.uint32),
        ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
        >>> a, b = Encoder(t), Encoder(t)
        >>> _ = a.encode_text(b"ab abab", 0, 7, 0)
        >>> b.copy_cache_from(a); b.cache_info()["entries"] == a.cache_info()["entries"] > 0
        True
        """
        if other.table is not self.table:
            raise ValueError("the encoders must share one rank table")
        if other is self:
            return
        if _copy_cache(self, other) < 0:
            raise MemoryError()
