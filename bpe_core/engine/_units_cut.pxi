# _units.pyx, part 8 of 9 (``include``d: compiled into the module as if written there).
# Stage 2's pieces: the units cut where no merge can cross, deduplicated with summed weights (_PieceTable,
# cut_pieces, cut_pieces_parts).

cdef inline bint _same_ids(const uint32_t* p, const sym_t* q, int64_t n) noexcept nogil:
    cdef int64_t i
    for i in range(n):
        if p[i] != q[i]:
            return False
    return True


cdef struct PieceSlot:
    uint32_t tag        # the high half of the piece's hash (most probes that miss end here)
    uint32_t pid        # 0xFFFFFFFF: empty


cdef int64_t _insert_pieces(const int64_t* qstart, const int64_t* qlen, const uint64_t* qhash,
                            const int64_t* qw, const int64_t* qc, int64_t nq, const sym_t* base,
                            PieceSlot** slots_p, uint64_t* cap_p, uint64_t* mask_p, uint64_t* slotted_p,
                            vector[uint32_t]& data, vector[int64_t]& starts,
                            vector[int64_t]& wsum, vector[int64_t]& csum) noexcept nogil:
    """Count the queued pieces, in order, into the piece table (grown as needed: the pieces' hashes
    are computed again from their symbols, not kept; ``slotted_p``: how many pieces have a slot, the
    long ones listed as they come having none); returns 0, or -1 when out of memory."""
    cdef int64_t q, n, start, pid
    cdef uint64_t h, slot, j
    cdef uint32_t tag
    cdef PieceSlot* slots = slots_p[0]
    # Hints first, for the whole batch (its slots were asked for when the pieces were queued): the
    # sums and the start of the piece in each piece's first slot, then its symbols; the probes and
    # sums below then find them in cache instead of waiting on dependent misses piece by piece.
    for q in range(nq):
        slot = qhash[q] & mask_p[0]
        if slots[slot].pid != 0xFFFFFFFFu and slots[slot].tag == <uint32_t>(qhash[q] >> 32):
            __builtin_prefetch(&starts[slots[slot].pid])
            __builtin_prefetch(&wsum[slots[slot].pid])
            __builtin_prefetch(&csum[slots[slot].pid])
    for q in range(nq):
        slot = qhash[q] & mask_p[0]
        if slots[slot].pid != 0xFFFFFFFFu and slots[slot].tag == <uint32_t>(qhash[q] >> 32):
            __builtin_prefetch(&data[starts[slots[slot].pid]])
    for q in range(nq):
        start = qstart[q]
        n = qlen[q]
        h = qhash[q]
        tag = <uint32_t>(h >> 32)
        slot = h & mask_p[0]
        while True:
            if slots[slot].pid == 0xFFFFFFFFu:
                pid = <int64_t>wsum.size()
                slots[slot].pid = <uint32_t>pid
                slots[slot].tag = tag
                slotted_p[0] += 1
                wsum.push_back(0)
                csum.push_back(0)
                for j in range(<uint64_t>n):         # (no insert: a memmove call a piece)
                    data.push_back(base[start + j])
                starts.push_back(data.size())
                break
            pid = slots[slot].pid
            if slots[slot].tag == tag and starts[pid + 1] - starts[pid] == n and \
                    _same_ids(&data[starts[pid]], base + start, n):
                break
            slot = (slot + 1) & mask_p[0]
        wsum[pid] += qw[q]
        csum[pid] += qc[q]
        if 10 * slotted_p[0] > 7 * cap_p[0]:
            cap_p[0] <<= 1
            mask_p[0] = cap_p[0] - 1
            free(slots)
            slots = <PieceSlot*>_table_alloc(cap_p[0] * sizeof(PieceSlot), 0xFF)
            slots_p[0] = slots
            if slots == NULL:
                return -1
            for j in range(wsum.size()):
                if starts[j + 1] - starts[j] >= LONG_PIECE:      # (listed as they came: no slot)
                    continue
                h = _hash_ids(&data[starts[j]], starts[j + 1] - starts[j])
                slot = h & mask_p[0]
                while slots[slot].pid != 0xFFFFFFFFu:
                    slot = (slot + 1) & mask_p[0]
                slots[slot].pid = <uint32_t>j
                slots[slot].tag = <uint32_t>(h >> 32)
    return 0


cdef struct PairPieceSlot:
    uint64_t key        # the piece's two symbols, (first << 32) | second; EMPTY_PAIR: empty
    int64_t w           # its summed weight
    int64_t c           # and count
    uint64_t pad        # (32 bytes: two slots a cache line)


cdef uint64_t EMPTY_PAIR = 0xFFFFFFFFFFFFFFFFu     # no two symbols make it (ids are below 0xFFFFFFFF)


cdef inline uint64_t _pair_piece_slot(uint64_t key, uint64_t mask) noexcept nogil:
    return ((key * <uint64_t>0x9E3779B97F4A7C15u) >> 32) & mask


cdef class _PieceTable:
    """Distinct pieces with summed weights and counts (``cut_pieces``; one per thread).

    Pieces of two symbols (on en_train at 32k, 40% of the pieces found but 1.5% of the distinct
    ones: there are no more of them than pairs above the cut) are counted apart, in a table keyed
    by the two symbols themselves (``_pair_add``): it stays in the CPU's cache, and a piece found
    again needs no hash of its symbols and no comparison with a stored copy. They come after the
    other pieces in ``to_arrays``.

    Pieces of ``LONG_PIECE`` symbols or more are listed as they come, with no slot and no lookup: on
    en_train at 32k 96-100% of the distinct ones of each such length occur once (1.89 M occurrences,
    1.79 M distinct), so each lookup was a cache miss for nothing. A long piece that comes twice is
    listed twice (the engine counts two words that are alike as one word of both counts: the same
    merges), so only the shorter pieces are distinct."""
    cdef vector[uint32_t] data
    cdef vector[int64_t] starts
    cdef vector[int64_t] wsum
    cdef vector[int64_t] csum
    cdef PieceSlot* slots                # 8 bytes a slot: a table that stays small in cache
    cdef uint64_t cap
    cdef uint64_t mask
    cdef uint64_t slotted                # pieces with a slot (the long ones have none)
    cdef PairPieceSlot* pslots           # the two-symbol pieces: their table (half full at most)
    cdef uint64_t pmask
    cdef vector[uint64_t] pkeys          # ... and their symbols, as first seen
    cdef int64_t single
    cdef bint oom
    cdef bint spent                      # its vectors went to arrays (to_arrays): it takes no more
    cdef bint slotless                   # its slot table was given back (drop_slots): it takes no more

    def __cinit__(self, int64_t reserve):
        # room for a piece per 8 symbols at the start (en_train at 32k: 4.6 M pieces of 60 M
        # symbols, ~2.3 M per thread), so the table seldom grows and rehashes on text
        self.cap = 1 << 16
        while self.cap < <uint64_t>(reserve // 8) and self.cap < (<uint64_t>1 << 30):
            self.cap <<= 1
        self.mask = self.cap - 1
        self.slotted = 0
        self.slots = <PieceSlot*>_table_alloc(self.cap * sizeof(PieceSlot), 0xFF)   # pid 0xFFFFFFFF: empty
        self.pmask = (1 << 14) - 1
        self.pslots = <PairPieceSlot*>_table_alloc((self.pmask + 1) * sizeof(PairPieceSlot), 0xFF)
        self.oom = self.slots == NULL or self.pslots == NULL
        self.single = 0
        self.starts.push_back(0)
        # address space only (pages are touched as written): room for all the pieces of four such
        # tables, so one that absorbs another's and then takes a third's for its arrays
        # (cut_pieces, to_arrays) seldom grows by copies, each into fresh pages
        self.data.reserve(4 * reserve)
        self.starts.reserve(4 * self.cap)
        self.wsum.reserve(4 * self.cap)
        self.csum.reserve(4 * self.cap)

    def __dealloc__(self):
        free(self.slots)
        free(self.pslots)

    def drop_slots(self):
        """Give the slot table back (8 bytes a slot): the table takes no more pieces, but another can
        still ``absorb`` it (which reads its pieces, not its slots) and it can still ``take`` another's
        and turn into arrays (``cut_pieces_parts``: before the tables are joined)."""
        free(self.slots)
        self.slots = NULL
        self.slotless = True

    cdef inline PairPieceSlot* _pair_slot_of(self, uint64_t key) noexcept nogil:
        """The slot of a two-symbol piece, or the empty slot where it would go."""
        cdef uint64_t slot = _pair_piece_slot(key, self.pmask)
        while self.pslots[slot].key != EMPTY_PAIR and self.pslots[slot].key != key:
            slot = (slot + 1) & self.pmask
        return &self.pslots[slot]

    cdef int _pair_add(self, uint64_t key, int64_t w, int64_t c) noexcept nogil:
        """Count a piece of two symbols (``key``: the first << 32 | the second); 0, or -1 when out of
        memory. Callers with many ask for its slot first (``_pair_hint``)."""
        cdef PairPieceSlot* e = self._pair_slot_of(key)
        cdef PairPieceSlot* old
        cdef PairPieceSlot* f
        cdef uint64_t j, n = self.pmask + 1
        if e.key == key:
            e.w += w
            e.c += c
            return 0
        e.key = key
        e.w = w
        e.c = c
        self.pkeys.push_back(key)
        if 2 * self.pkeys.size() > n:           # half full: twice the slots
            old = self.pslots
            self.pslots = <PairPieceSlot*>_table_alloc(2 * n * sizeof(PairPieceSlot), 0xFF)
            if self.pslots == NULL:
                self.pslots = old
                return -1
            self.pmask = 2 * n - 1
            for j in range(n):
                if old[j].key != EMPTY_PAIR:
                    f = self._pair_slot_of(old[j].key)
                    f[0] = old[j]
            free(old)
        return 0

    cdef inline void _pair_hint(self, uint64_t key) noexcept nogil:
        __builtin_prefetch(&self.pslots[_pair_piece_slot(key, self.pmask)])

    cdef int64_t _flush(self, const int64_t* qstart, const int64_t* qlen, const uint64_t* qhash,
                        const int64_t* qw, const int64_t* qc, int64_t nq, const uint32_t* base) noexcept nogil:
        return _insert_pieces(qstart, qlen, qhash, qw, qc, nq, base, &self.slots, &self.cap, &self.mask,
                              &self.slotted, self.data, self.starts, self.wsum, self.csum)

    def add(self, const sym_t[::1] symbols, const int64_t[::1] offsets, const uint32_t[::1] levels,
            const int64_t[::1] weights, const int64_t[::1] counts, uint32_t min_level, int64_t lo, int64_t hi,
            const uint8_t[::1] keep=None, _PieceTable upper=None, const uint8_t[::1] guard=None):
        """Cut sequences ``lo:hi`` and count their pieces (by ``levels``, or by the bitmap ``keep``;
        never beside a symbol that ``guard`` marks, see ``cut_pieces``); with ``upper``, the pieces
        whose hash has its top bit set are counted there instead (so two threads can then join their
        tables half by half: ``cut_pieces``)."""
        cdef int64_t u, k, a, b, start, n, m, nwin, i, e
        cdef uint64_t h, smask = 0, slot, cm, s0, s1
        cdef uint32_t kept
        cdef bint by_bits = keep is not None, split = upper is not None
        cdef const uint8_t* kb = NULL
        cdef const uint8_t* gb = NULL
        cdef uint64_t n_guard = 0
        cdef int side, r
        if guard is not None and guard.shape[0] > 0:
            gb = &guard[0]
            n_guard = guard.shape[0]
        if by_bits:
            kb = &keep[0]
            smask = (<uint64_t>keep.shape[0] << 3) - 1
        cdef int64_t nq[2]
        cdef int64_t qstart[2][BATCH]           # pieces found, waiting for their prefetched slots
        cdef int64_t qlen[2][BATCH]
        cdef uint64_t qhash[2][BATCH]
        cdef int64_t qw[2][BATCH]
        cdef int64_t qc[2][BATCH]
        cdef uint64_t pkey[BATCH]               # pieces of two symbols, waiting for their slots
        cdef int64_t pw[BATCH]
        cdef int64_t pc[BATCH]
        cdef int64_t npq = 0
        cdef uint64_t key
        cdef const sym_t* base = &symbols[0] if symbols.shape[0] > 0 else NULL
        nq[0] = nq[1] = 0
        if self.spent or (split and upper.spent):
            raise ValueError("cut_pieces: this piece table was turned into arrays")
        if self.slotless or (split and upper.slotless):
            raise ValueError("cut_pieces: this piece table gave its slots back")
        if self.oom or (split and upper.oom):
            raise MemoryError("cut_pieces: no memory for the piece table")
        with nogil:
            for u in range(lo, hi):
                a = offsets[u]
                b = offsets[u + 1]
                start = a
                k = a
                while k < b:
                    # The cuts of up to 64 positions k..k+m-1 as a bit mask first (bit i: cut after
                    # position k + i; the unit's last position always), then the pieces between them:
                    # the windows' bitmap reads are independent (the CPU overlaps them) and no branch
                    # waits on one; only the cuts branch, not every window.
                    m = b - k if b - k < 64 else 64
                    nwin = m if k + m < b else m - 1
                    cm = 0
                    if by_bits and gb == NULL:          # the common case: the keep bitmap alone
                        for i in range(nwin):
                            slot = _sketch_slot(((<uint64_t>symbols[k + i] << 32) | symbols[k + i + 1]) + 1, smask)
                            cm |= <uint64_t>(((kb[slot >> 3] >> (slot & 7)) & 1) ^ 1) << i
                    elif by_bits:                       # ... and a guard (SupraTok's pass 2)
                        for i in range(nwin):
                            s0 = symbols[k + i]
                            s1 = symbols[k + i + 1]
                            slot = _sketch_slot(((<uint64_t>s0 << 32) | s1) + 1, smask)
                            kept = (kb[slot >> 3] >> (slot & 7)) & 1
                            if s0 < n_guard:
                                kept |= gb[s0] & GUARD_LEFT
                            if s1 < n_guard:
                                kept |= (gb[s1] & GUARD_RIGHT) >> 1
                            cm |= <uint64_t>(kept ^ 1) << i
                    else:
                        for i in range(nwin):
                            if gb != NULL and ((symbols[k + i] < n_guard and (gb[symbols[k + i]] & GUARD_LEFT)) or
                                               (symbols[k + i + 1] < n_guard and (gb[symbols[k + i + 1]] & GUARD_RIGHT))):
                                continue
                            if by_bits:             # a 512 KiB bitmap: it stays in the CPU's cache
                                slot = _sketch_slot(((<uint64_t>symbols[k + i] << 32) | symbols[k + i + 1]) + 1, smask)
                                if (kb[slot >> 3] >> (slot & 7)) & 1:
                                    continue
                            elif levels[k + i] >= min_level:
                                continue
                            cm |= (<uint64_t>1) << i
                    if nwin < m:
                        cm |= (<uint64_t>1) << (m - 1)
                    while cm != 0:
                        e = k + <int64_t>__builtin_ctzll(cm)      # the piece start..e
                        cm &= cm - 1
                        n = e + 1 - start
                        if n == 1:
                            self.single += counts[u]
                        elif n == 2:
                            # queued like the others: its slot is asked for now, counted BATCH later
                            key = (<uint64_t>base[start] << 32) | base[start + 1]
                            self._pair_hint(key)
                            pkey[npq] = key
                            pw[npq] = weights[u]
                            pc[npq] = counts[u]
                            npq += 1
                            if npq == BATCH:
                                for r in range(BATCH):
                                    if self._pair_add(pkey[r], pw[r], pc[r]) < 0:
                                        self.oom = True
                                npq = 0
                                if self.oom:
                                    break
                        elif n >= LONG_PIECE:
                            _list_long(self, base + start, n, weights[u], counts[u])
                        else:
                            # queue the piece; its slot is asked for now and probed BATCH pieces later
                            h = _hash_ids(base + start, n)
                            side = 1 if split and (h >> 63) else 0
                            if side:
                                __builtin_prefetch(&upper.slots[h & upper.mask])
                            else:
                                __builtin_prefetch(&self.slots[h & self.mask])
                            qstart[side][nq[side]] = start
                            qlen[side][nq[side]] = n
                            qhash[side][nq[side]] = h
                            qw[side][nq[side]] = weights[u]
                            qc[side][nq[side]] = counts[u]
                            nq[side] += 1
                            if nq[side] == BATCH:
                                if side:
                                    r = _insert_into(upper, qstart[1], qlen[1], qhash[1], qw[1], qc[1], BATCH, base)
                                else:
                                    r = _insert_into(self, qstart[0], qlen[0], qhash[0], qw[0], qc[0], BATCH, base)
                                if r < 0:
                                    self.oom = True
                                    break
                                nq[side] = 0
                        start = e + 1
                    if self.oom:
                        break
                    k += m
                if self.oom:
                    break
            for r in range(npq if not self.oom else 0):
                if self._pair_add(pkey[r], pw[r], pc[r]) < 0:
                    self.oom = True
            if not self.oom and nq[0] > 0:
                self.oom = _insert_into(self, qstart[0], qlen[0], qhash[0], qw[0], qc[0], nq[0], base) < 0
            if not self.oom and nq[1] > 0:
                self.oom = _insert_into(upper, qstart[1], qlen[1], qhash[1], qw[1], qc[1], nq[1], base) < 0
        if self.oom:
            raise MemoryError("cut_pieces: no memory for the piece table")

    def absorb(self, _PieceTable other):
        """Count ``other``'s pieces in, in its order (new ones are appended)."""
        cdef int64_t p, nq = 0, n_other = other.wsum.size()
        cdef int64_t qstart[BATCH]
        cdef int64_t qlen[BATCH]
        cdef uint64_t qhash[BATCH]
        cdef int64_t qw[BATCH]
        cdef int64_t qc[BATCH]
        cdef const uint32_t* base = other.data.data()
        cdef PairPieceSlot* e
        if self.spent or other.spent:
            raise ValueError("cut_pieces: this piece table was turned into arrays")
        if self.slotless:
            raise ValueError("cut_pieces: this piece table gave its slots back")
        with nogil:
            self.single += other.single
            for p in range(<int64_t>other.pkeys.size()):
                e = other._pair_slot_of(other.pkeys[p])
                if self._pair_add(e.key, e.w, e.c) < 0:
                    self.oom = True
                    break
            for p in range(n_other if not self.oom else 0):
                qstart[nq] = other.starts[p]
                qlen[nq] = other.starts[p + 1] - other.starts[p]
                if qlen[nq] >= LONG_PIECE:          # listed as it came there
                    _list_long(self, base + qstart[nq], qlen[nq], other.wsum[p], other.csum[p])
                    if p + 1 == n_other and nq > 0:
                        if self._flush(qstart, qlen, qhash, qw, qc, nq, base) < 0:
                            self.oom = True
                            break
                        nq = 0
                    continue
                qhash[nq] = _hash_ids(base + qstart[nq], qlen[nq])      # (again: hashes are not kept)
                __builtin_prefetch(&self.slots[qhash[nq] & self.mask])
                qw[nq] = other.wsum[p]
                qc[nq] = other.csum[p]
                nq += 1
                if nq == BATCH or p + 1 == n_other:
                    if self._flush(qstart, qlen, qhash, qw, qc, nq, base) < 0:
                        self.oom = True
                        break
                    nq = 0
        if self.oom:
            raise MemoryError("cut_pieces: no memory for the piece table")

    def n_symbols(self):
        """The symbols of the pieces listed so far."""
        return <int64_t>self.data.size()

    def take(self, _PieceTable more, int part, int64_t d1):
        """Append ``more``'s pieces, part by part, so two threads can do it at once (each part
        writes its own vectors; ``to_arrays(more, taken=True)`` then finishes): part 0 their
        symbols, part 1 their starts (shifted by ``d1``, this table's symbols before it) and sums.
        About 110 MB at 32k on en_train, all into fresh pages: on one thread that was ~0.15 s."""
        cdef int64_t n2 = more.wsum.size(), j
        if self.spent or more.spent:
            raise ValueError("cut_pieces: this piece table was turned into arrays")
        with nogil:
            if part == 0:
                self.data.insert(self.data.end(), more.data.begin(), more.data.end())
            else:
                for j in range(n2):
                    self.starts.push_back(d1 + more.starts[j + 1])
                self.wsum.insert(self.wsum.end(), more.wsum.begin(), more.wsum.end())
                self.csum.insert(self.csum.end(), more.csum.begin(), more.csum.end())

    def to_arrays(self, _PieceTable more=None, bint taken=False):
        """The pieces as arrays, then ``more``'s after them (their starts shifted), then the pieces of
        two symbols of both (``_pair_add``; ``more``'s are counted into this table's first, so none is
        listed twice). ``more``'s pieces are appended to this table's (in the room it reserved), and
        the arrays are this table's own memory, lent to numpy: no copy of the pieces and no fresh
        pages for one. ``taken``: ``more``'s pieces were appended already (``take``). The table is
        empty afterwards and takes no more pieces."""
        cdef int64_t n2 = more.wsum.size() if more is not None and not taken else 0
        cdef int64_t d1 = self.data.size(), j
        cdef int64_t single = self.single + (more.single if more is not None else 0)
        cdef _IdList data = _IdList()
        cdef _I64List starts = _I64List(), wsum = _I64List(), csum = _I64List()
        cdef PairPieceSlot* e
        if self.spent or (more is not None and more.spent):
            raise ValueError("cut_pieces: this piece table was turned into arrays")
        with nogil:
            if more is not None:
                for j in range(<int64_t>more.pkeys.size()):
                    e = more._pair_slot_of(more.pkeys[j])
                    if self._pair_add(e.key, e.w, e.c) < 0:
                        self.oom = True
                        break
            if n2 > 0 and not self.oom:
                self.data.insert(self.data.end(), more.data.begin(), more.data.end())
                for j in range(n2):
                    self.starts.push_back(d1 + more.starts[j + 1])
                self.wsum.insert(self.wsum.end(), more.wsum.begin(), more.wsum.end())
                self.csum.insert(self.csum.end(), more.csum.begin(), more.csum.end())
            if not self.oom:
                for j in range(<int64_t>self.pkeys.size()):
                    e = self._pair_slot_of(self.pkeys[j])
                    self.data.push_back(<uint32_t>(e.key >> 32))
                    self.data.push_back(<uint32_t>(e.key & 0xFFFFFFFFu))
                    self.starts.push_back(self.data.size())
                    self.wsum.push_back(e.w)
                    self.csum.push_back(e.c)
        if self.oom:
            raise MemoryError("cut_pieces: no memory for the piece table")
        data.v.swap(self.data)
        starts.v.swap(self.starts)
        wsum.v.swap(self.wsum)
        csum.v.swap(self.csum)
        self.pkeys.clear()
        self.single = 0
        self.spent = True
        if more is not None:
            more.spent = True           # its pieces are in these arrays now
        return data.array(), starts.array(), wsum.array(), csum.array(), single


cdef inline void _list_long(_PieceTable t, const sym_t* p, int64_t n, int64_t w, int64_t c) noexcept nogil:
    """A piece of ``LONG_PIECE`` symbols or more: listed as it comes (no slot, no lookup)."""
    cdef int64_t j
    for j in range(n):
        t.data.push_back(p[j])
    t.starts.push_back(t.data.size())
    t.wsum.push_back(w)
    t.csum.push_back(c)


cdef int64_t _insert_into(_PieceTable t, const int64_t* qstart, const int64_t* qlen, const uint64_t* qhash,
                          const int64_t* qw, const int64_t* qc, int64_t nq, const sym_t* base) noexcept nogil:
    """``_PieceTable._flush`` for pieces read from uint16 or uint32 units."""
    return _insert_pieces(qstart, qlen, qhash, qw, qc, nq, base, &t.slots, &t.cap, &t.mask, &t.slotted,
                          t.data, t.starts, t.wsum, t.csum)


#: ``cut_pieces(guard=)`` bits: never cut after a symbol marked ``GUARD_LEFT`` (the window whose left
#: symbol it is stays whole), nor before one marked ``GUARD_RIGHT``.
cdef enum:
    GUARD_LEFT = 1
    GUARD_RIGHT = 2


def cut_pieces(const sym_t[::1] symbols, const int64_t[::1] offsets, const uint32_t[::1] levels,
               const int64_t[::1] weights, const int64_t[::1] counts, uint32_t min_level, int threads=1,
               const uint8_t[::1] keep=None, const uint8_t[::1] guard=None):
    """Cut every sequence after each position whose level is below ``min_level`` and count the
    distinct pieces of two or more symbols: returns ``(data, starts, piece_weights, piece_counts,
    single_count)`` (pieces in first-seen order, those of two symbols after the others, each kind
    as first seen; a piece's weight and count are the sums of its
    sequences' ``weights`` and ``counts``; ``single_count``: the summed ``counts`` of the one-symbol
    pieces, which are not listed). Pieces of ``CUT_LONG_PIECE`` symbols or more are listed as they
    come, each with its sequence's weight and count, not looked up: nearly all occur once, and a
    repeated one listed twice trains the same merges.

    >>> syms = np.array([5, 6, 7, 5, 6, 8], np.uint32)
    >>> d, s, w, c, one = cut_pieces(syms, np.array([0, 3, 6]), np.array([9, 1, 0, 9, 1, 0], np.uint32),
    ...                              np.array([2, 1]), np.array([2, 1]), 2)
    >>> d.tolist(), s.tolist(), w.tolist(), c.tolist(), one      # [5 6 | 7], [5 6 | 8]
    ([5, 6], [0, 2], [3], [3], 3)

    ``keep``: instead of ``levels`` (pass ``None`` for them), a bitmap over a :func:`pair_sketch`'s
    counters (``np.packbits(sketch >= min_level, bitorder="little")``): a window is
    kept whole when its pair's counter has its bit set, cut otherwise (``min_level`` is then unused).

    ``guard`` (uint8 per symbol id; ids past its end are unmarked): a window whose left symbol has
    bit 1 (``GUARD_LEFT``) or whose right symbol has bit 2 (``GUARD_RIGHT``) is kept whole whatever
    its level or counter:

    >>> d, s, w, c, one = cut_pieces(syms, np.array([0, 3, 6]), np.array([9, 1, 0, 9, 1, 0], np.uint32),
    ...                              np.array([2, 1]), np.array([2, 1]), 2, guard=np.array([0, 0, 0, 0, 0, 0, 0, 2], np.uint8))
    >>> d.tolist(), s.tolist(), w.tolist(), c.tolist(), one      # [5 6 7], [5 6 | 8]: 7 is GUARD_RIGHT
    ([5, 6, 7, 5, 6], [0, 3, 5], [2, 1], [2, 1], 1)

    With ``threads=2`` each half of the sequences is cut on its own thread into two tables of its own,
    one for the pieces whose hash has its top bit clear and one for the rest; then one thread joins
    the two halves' first tables and the other their second tables (no piece is in both; the pieces
    of two symbols go to the first tables), and the pieces of the first come before those of the
    second: the same pieces with the same weights and counts as one thread, in another order.

    Plain equivalent: ``Counter`` of the runs ``tuple(s[i:j])`` between the cuts, weighted.
    """
    cdef int64_t n_sym = symbols.shape[0]
    if keep is None and (levels is None or levels.shape[0] != n_sym):
        raise ValueError("cut_pieces: one level per symbol, or a keep bitmap, is needed")
    parts = unit_halves(threads, symbols, offsets, weights, counts)
    return cut_pieces_parts(parts, min_level, keep=keep, levels=[levels] * len(parts) if keep is None else None,
                            guard=guard)


def _add_parts(_PieceTable table, _PieceTable upper, list group, uint32_t min_level, keep, guard,
               bint consume):
    """One thread's parts of ``cut_pieces_parts`` (``group``: ``(part, levels)`` pairs), cut one after
    the other into ``table`` and ``upper``; with ``consume`` each part's entry is let go before it is
    cut and its arrays right after (the group held the last references: its memory is free then)."""
    for i in range(len(group)):
        (sym, off, w, c), lv = group[i]
        if consume:
            group[i] = None
        table.add(sym, off, lv, w, c, min_level, 0, len(off) - 1, keep, upper, guard)
        sym = off = w = c = lv = None


def cut_pieces_parts(list parts, uint32_t min_level, const uint8_t[::1] keep=None, levels=None,
                     const uint8_t[::1] guard=None, bint consume=False):
    """:func:`cut_pieces` over the sequences of one part or more ``(symbols, offsets, weights,
    counts)`` (each part's offsets are positions in its own symbols; ``levels``: one array per part,
    when there is no ``keep``; ``guard`` as there), one thread per part, or with more than two the
    first :func:`half_at` parts on one thread and the rest on the other, each cut in turn: the
    pieces of ``cut_pieces`` on the parts joined, with the same weights and counts (tested).
    ``cut_pieces(threads=2)`` is this on ``unit_halves(2, ...)`` of its sequences.

    ``consume``: the list ``parts`` is emptied before the tables are joined into the arrays (their
    peak), and with more than two parts each part goes as soon as it is cut (SupraTok's units come
    in many: they go while the tables grow, not after): when it held the last references to the
    sequences (the caller let them go), their memory is free for that."""
    cdef int64_t n_sym = sum(int(p[0].shape[0]) for p in parts)
    cdef int n_parts = len(parts)
    if n_parts < 1:
        raise ValueError("cut_pieces_parts: one part or more")
    if n_sym >= <int64_t>0xFFFFFFFF:
        raise ValueError("too many symbols for uint32 piece ids")
    if keep is None and (levels is None or len(levels) != n_parts or
                         any(lv is None or lv.shape[0] != p[0].shape[0] for lv, p in zip(levels, parts))):
        raise ValueError("cut_pieces: one level per symbol, or a keep bitmap, is needed")
    if keep is not None and (keep.shape[0] == 0 or keep.shape[0] & (keep.shape[0] - 1)):
        raise ValueError("cut_pieces: a keep bitmap's size is a power of two")
    lv = list(levels) if keep is None else [None] * n_parts
    # the tables are sized by the symbols their sequences cover, not by the parts' arrays: the
    # halves of ``unit_halves`` share one array of symbols, which counted twice made every slot
    # table twice the size its pieces need (SupraTok on 60 MB at 32k: 48 MiB of slots, all written
    # when made, beside the units while they are cut; 24 MiB so: the cut's peak)
    cdef int64_t n_cover = sum(int(p[1][len(p[1]) - 1] - p[1][0]) if len(p[1]) > 0 else 0 for p in parts)
    cdef _PieceTable table
    if n_parts == 1:
        sym, off, w, c = parts[0]
        table = _PieceTable(n_cover)
        table.add(sym, off, lv[0], w, c, min_level, 0, len(off) - 1, keep, None, guard)
        if consume:
            parts.clear()
            sym = off = w = c = None
        return table.to_arrays()
    from concurrent.futures import ThreadPoolExecutor
    # the left tables take the right ones' pieces in (absorb): room for that from the start (their
    # slot tables then need not grow and rehash midway)
    cdef _PieceTable left = _PieceTable(n_cover // 2), left_up = _PieceTable(n_cover // 2)
    cdef _PieceTable right = _PieceTable(n_cover // 4), right_up = _PieceTable(n_cover // 4)
    cdef int64_t k = half_at(parts)
    groups = [list(zip(parts[:k], lv[:k])), list(zip(parts[k:], lv[k:]))]
    if consume:         # the groups hold the sequences now (each goes once cut: _add_parts)
        parts.clear()
    with ThreadPoolExecutor(2, thread_name_prefix="bpe_core-pieces") as ex:
        jobs = [ex.submit(_add_parts, t, up, g, min_level, keep, guard, consume)
                for t, up, g in zip((left, right), (left_up, right_up), groups)]
        for j in jobs:
            j.result()
        jobs = groups = None    # every sequence read: the sequences go before the tables are joined
        # The joins one at a time, the smaller first, each table given back once absorbed (and the
        # slots of those absorbed first): run at once, both copies of the right tables' pieces were
        # made while all four tables lived, the cut's peak once the units go as they are cut
        # (SupraTok on 60 MB at 32k, units in chunks: the cut's max 256 -> 237 MiB; the same work, on
        # one thread)
        right.drop_slots()
        right_up.drop_slots()
        left_up.absorb(right_up)
        del right_up
        left.absorb(right)
        del right
        left.drop_slots()       # (take and to_arrays need no slots)
        left_up.drop_slots()
        d1 = left.n_symbols()          # the second table's pieces after the first's, on both threads
        jobs = [ex.submit(left.take, left_up, 0, d1), ex.submit(left.take, left_up, 1, d1)]
        for j in jobs:
            j.result()
    return left.to_arrays(left_up, taken=True)

