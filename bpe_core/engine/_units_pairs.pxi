# _units.pyx, part 6 of 9 (``include``d: compiled into the module as if written there).
# Stage 2's exact pair counts and levels (_PairTable, pair_levels).

# ==== Stage-2 pieces ==========================================================================

cdef struct PairSlot:
    uint64_t key        # (left << 32 | right) + 1; 0: empty
    int64_t count


cdef inline uint64_t _pair_slot(uint64_t key, uint64_t mask) noexcept nogil:
    return ((key * <uint64_t>0x9E3779B97F4A7C15u) >> 32) & mask


cdef PairSlot* _grow_pairs(PairSlot* slots, uint64_t* mask) noexcept nogil:
    """The pairs moved to a table twice as large (the old one freed), or NULL when out of memory."""
    cdef uint64_t j, h, old_cap = mask[0] + 1, m = 2 * old_cap - 1
    cdef PairSlot* new = <PairSlot*>_table_alloc(2 * old_cap * sizeof(PairSlot), 0)
    if new == NULL:
        free(slots)
        return NULL
    for j in range(old_cap):
        if slots[j].key != 0:
            h = _pair_slot(slots[j].key, m)
            while new[h].key != 0:
                h = (h + 1) & m
            new[h] = slots[j]
    free(slots)
    mask[0] = m
    return new


cdef class _PairTable:
    """The pair counts of a range of sequences (one thread's share of ``pair_levels``)."""
    cdef PairSlot* slots
    cdef uint64_t mask
    cdef uint64_t n_pairs
    cdef bint grown
    cdef bint oom

    def __cinit__(self, uint64_t cap):
        self.slots = <PairSlot*>_table_alloc(cap * sizeof(PairSlot), 0)     # all zero: empty
        self.mask = cap - 1
        self.n_pairs = 0
        self.grown = False
        self.oom = self.slots == NULL

    def __dealloc__(self):
        free(self.slots)

    cdef inline bint _has(self, uint64_t key) noexcept nogil:
        cdef uint64_t slot = _pair_slot(key, self.mask)
        while self.slots[slot].key != key:
            if self.slots[slot].key == 0:
                return False
            slot = (slot + 1) & self.mask
        return True

    cdef inline int64_t _add(self, uint64_t key, int64_t w) noexcept nogil:
        """Count ``w`` more for a pair key; returns its slot (as it was before the table grew, which
        sets ``grown``), or -1 when out of memory (``oom``)."""
        cdef uint64_t slot = _pair_slot(key, self.mask)
        while self.slots[slot].key != key and self.slots[slot].key != 0:
            slot = (slot + 1) & self.mask
        if self.slots[slot].key == 0:
            self.slots[slot].key = key
            self.n_pairs += 1
        self.slots[slot].count += w
        if 2 * self.n_pairs > self.mask + 1:
            self.slots = _grow_pairs(self.slots, &self.mask)
            self.grown = True
            if self.slots == NULL:
                self.oom = True
                return -1
        return <int64_t>slot

    cdef inline int64_t _get(self, uint64_t key) noexcept nogil:
        """The count of a pair key, 0 when absent."""
        cdef uint64_t slot = _pair_slot(key, self.mask)
        while self.slots[slot].key != key:
            if self.slots[slot].key == 0:
                return 0
            slot = (slot + 1) & self.mask
        return self.slots[slot].count

    def count(self, const uint32_t[::1] symbols, const int64_t[::1] offsets, const int64_t[::1] weights,
              uint32_t[::1] lv, int64_t lo, int64_t hi):
        """Pass 1 over sequences ``lo:hi``: count every window, note its slot in ``lv``."""
        cdef int64_t u, k, a, b, r
        cdef uint64_t key
        if self.oom:
            raise MemoryError("pair_levels: no memory for the pair table")
        with nogil:
            for u in range(lo, hi):
                a = offsets[u]
                b = offsets[u + 1]
                for k in range(a, b - 1):
                    if k + 17 < b:              # the cell of a window ahead (a hint only)
                        __builtin_prefetch(&self.slots[_pair_slot(
                            ((<uint64_t>symbols[k + 16] << 32) | symbols[k + 17]) + 1, self.mask)])
                    key = ((<uint64_t>symbols[k] << 32) | symbols[k + 1]) + 1
                    r = self._add(key, weights[u])
                    if r < 0:
                        break
                    lv[k] = <uint32_t>r         # the slot for now (while the table does not grow)
                if self.oom:
                    break
        if self.oom:
            raise MemoryError("pair_levels: no memory for the pair table")

    def levels(self, _PairTable other, const uint32_t[::1] symbols, const int64_t[::1] offsets,
               uint32_t[::1] lv, int64_t lo, int64_t hi):
        """Pass 2 over sequences ``lo:hi``: each window's count, this table's plus ``other``'s."""
        cdef int64_t u, k, a, b, c
        cdef uint64_t key, slot
        cdef bint two = other is not None
        with nogil:
            for u in range(lo, hi):
                a = offsets[u]
                b = offsets[u + 1]
                for k in range(a, b - 1):
                    if self.grown or two:       # the pair's key is needed
                        if k + 17 < b:
                            key = ((<uint64_t>symbols[k + 16] << 32) | symbols[k + 17]) + 1
                            if self.grown:
                                __builtin_prefetch(&self.slots[_pair_slot(key, self.mask)])
                            if two:
                                __builtin_prefetch(&other.slots[_pair_slot(key, other.mask)])
                        key = ((<uint64_t>symbols[k] << 32) | symbols[k + 1]) + 1
                    if self.grown:              # the slots moved: find the pair again
                        c = self._get(key)
                    else:
                        if k + 16 < b - 1:
                            __builtin_prefetch(&self.slots[lv[k + 16]])
                        c = self.slots[lv[k]].count
                    if two:
                        c += other._get(key)
                    if c > <int64_t>0xFFFFFFFF:
                        c = <int64_t>0xFFFFFFFF
                    lv[k] = <uint32_t>c
                if b > a:
                    lv[b - 1] = 0

    cdef inline int64_t _find(self, uint64_t key) noexcept nogil:
        """The slot of a pair key, -1 when absent."""
        cdef uint64_t slot = _pair_slot(key, self.mask)
        while self.slots[slot].key != key:
            if self.slots[slot].key == 0:
                return -1
            slot = (slot + 1) & self.mask
        return <int64_t>slot

    def share_totals(self, _PairTable other):
        """Make both tables hold the totals: every pair of ``other`` also here gets the sum in both
        tables (one lookup per pair of ``other``, none per window); returns each distinct pair's total
        (int64, in no particular order), as ``counts_with``."""
        cdef vector[int64_t] out
        cdef uint64_t j
        cdef int64_t slot
        with nogil:
            for j in range(other.mask + 1):
                if other.slots[j].key != 0:
                    slot = self._find(other.slots[j].key)
                    if slot >= 0:
                        self.slots[slot].count += other.slots[j].count
                        other.slots[j].count = self.slots[slot].count
                    else:
                        out.push_back(other.slots[j].count)
            for j in range(self.mask + 1):
                if self.slots[j].key != 0:
                    out.push_back(self.slots[j].count)
        return _int64_array(out)

    def counts_with(self, _PairTable other):
        """Each distinct pair's count over this table and ``other`` (int64, in slot order)."""
        cdef vector[int64_t] out
        cdef uint64_t j
        with nogil:
            for j in range(self.mask + 1):
                if self.slots[j].key != 0:
                    out.push_back(self.slots[j].count + (other._get(self.slots[j].key) if other is not None
                                                         else 0))
            if other is not None:
                for j in range(other.mask + 1):
                    if other.slots[j].key != 0 and not self._has(other.slots[j].key):
                        out.push_back(other.slots[j].count)
        return _int64_array(out)


def pair_levels(const uint32_t[::1] symbols, const int64_t[::1] offsets, const int64_t[::1] weights,
                int threads=1):
    """The weighted count of every window's pair, over all sequences: returns ``(levels, pair_counts)``.

    ``levels[k]`` (uint32, saturating at 2**32 - 1) is the count of the pair ``(symbols[k],
    symbols[k + 1])`` summed over every window of every sequence, each window weighted by its
    sequence's weight; the last position of a sequence (no window) gets 0. ``pair_counts`` (int64)
    holds each distinct pair's count once (in no particular order).

    >>> lv, pc = pair_levels(np.array([1, 2, 1, 2, 3], np.uint32), np.array([0, 2, 5]), np.array([3, 1]))
    >>> lv.tolist(), sorted(pc.tolist())        # (1, 2): 3 + 1; (2, 3): 1; the ends of sequences: 0
    ([4, 0, 4, 1, 0], [1, 4])

    Two passes over the windows, one hash-table cell each (asked for 16 windows ahead): the count
    lives in the cell beside its pair; the first pass notes each window's cell, so the second reads it
    without hashing (unless the table had to grow). With ``threads=2`` each half of the sequences is
    counted on its own thread into its own table; then each pair of the second table that the first
    also holds gets the sum in both (one lookup per distinct pair), and the second pass reads each
    window's own cell on both threads (had a table grown, each window looks its pair up in both
    tables instead); the result is the same.

    Plain equivalent: ``Counter`` of ``(s[k], s[k+1])`` over the windows, times the weight, read back
    per window.
    """
    cdef int64_t n_seq = offsets.shape[0] - 1, n_sym = symbols.shape[0], mid
    cdef uint64_t cap = 1 << 16
    levels = prefault(np.empty(n_sym, dtype=np.uint32))       # written whole: faulted in at once
    if n_seq < 2 or n_sym < (1 << 20):
        threads = 1
    while cap < <uint64_t>(n_sym // (4 * threads)) and cap < (<uint64_t>1 << 31):
        cap <<= 1       # room for a pair per 8 windows: on text the table rarely grows (en_train at
                        # 32k: 4.1 M pairs in 60 M windows, which a pair per 16 outgrew on each thread)
    if threads <= 1:
        table = _PairTable(cap)
        table.count(symbols, offsets, weights, levels, 0, n_seq)
        counts = table.counts_with(None)
        table.levels(None, symbols, offsets, levels, 0, n_seq)
        return levels, counts
    from concurrent.futures import ThreadPoolExecutor
    mid = int(np.searchsorted(np.asarray(offsets), n_sym // 2))       # halves by symbols
    mid = min(max(mid, 1), n_seq - 1)
    left, right = _PairTable(cap), _PairTable(cap)
    with ThreadPoolExecutor(2, thread_name_prefix="bpe_core-levels") as ex:
        jobs = [ex.submit(left.count, symbols, offsets, weights, levels, 0, mid),
                ex.submit(right.count, symbols, offsets, weights, levels, mid, n_seq)]
        for j in jobs:
            j.result()
        if left.grown or right.grown:       # a half's noted slots moved: look the pairs up again
            counts = left.counts_with(right)
            jobs = [ex.submit(left.levels, right, symbols, offsets, levels, 0, mid),
                    ex.submit(right.levels, left, symbols, offsets, levels, mid, n_seq)]
        else:                               # both tables hold the totals: each half reads its slots
            counts = left.share_totals(right)
            jobs = [ex.submit(left.levels, None, symbols, offsets, levels, 0, mid),
                    ex.submit(right.levels, None, symbols, offsets, levels, mid, n_seq)]
        for j in jobs:
            j.result()
    return levels, counts

