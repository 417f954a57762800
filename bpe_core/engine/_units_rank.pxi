# _units.pyx, part 9 of 9 (``include``d: compiled into the module as if written there).
# Merging a token-id sequence by rank (RankMerger, declared in _units.pxd) and its heap.

# ==== Merging a sequence by rank ==============================================================

cdef inline bint _entry_after(RankEntry x, RankEntry y) noexcept nogil:
    """Min-heap order: lower rank first, then lower position."""
    if x.rank != y.rank:
        return x.rank > y.rank
    return x.pos > y.pos


@cython.final
cdef class RankMerger:
    """Apply ranked merges to sequences of token ids.

    Args:
        lefts, rights: uint32 ids of each merge's pair, in rank order.
        results: uint32 id each merge produces (the canonical id of the merged bytes).

    ``merge(ids)`` replays the merges in rank order: it repeatedly takes the lowest rank present that
    is above the rank just applied, and merges all of its occurrences left to right without overlap.
    That is how training rewrote its words, so it reproduces training, also in the corner case where
    a merge builds bytes an earlier token already has and so creates a pair of an earlier rank (which
    training never revisits), and where the same pair was merged twice.

    >>> m = RankMerger(np.array([1, 5], np.uint32), np.array([1, 1], np.uint32), np.array([5, 6], np.uint32))
    >>> m.merge(np.array([1, 1, 1, 1, 1], np.uint32)).tolist()     # (1,1)->5 then (5,1)->6
    [5, 6]

    Plain equivalent: ``reference.encode_pretoken`` on ids instead of bytes.
    """
    # (attributes and the C methods other kernels call: _units.pxd)

    def __init__(self, const uint32_t[::1] lefts, const uint32_t[::1] rights, const uint32_t[::1] results):
        cdef int64_t n = lefts.shape[0], r
        cdef uint64_t cap = 16, key, slot
        self.n_merges = n
        while cap < <uint64_t>(2 * n + 2):
            cap <<= 1
        self.keys.assign(cap, 0xFFFFFFFFFFFFFFFFu)
        self.ranks.assign(cap, -1)
        self.later.assign(n, -1)
        self.res_of_rank.resize(n)
        self.mask = cap - 1
        cdef vector[int64_t] last_of_slot
        last_of_slot.assign(cap, -1)
        for r in range(n):
            self._mark(lefts[r], 1)
            self._mark(rights[r], 2)
        for r in range(n):
            self.res_of_rank[r] = results[r]
            key = (<uint64_t>lefts[r] << 32) | rights[r]
            slot = _mix(key) & self.mask
            while self.keys[slot] != 0xFFFFFFFFFFFFFFFFu and self.keys[slot] != key:
                slot = (slot + 1) & self.mask
            if self.keys[slot] == key:
                self.later[last_of_slot[slot]] = r      # the same pair merged again, later
            else:
                self.keys[slot] = key
                self.ranks[slot] = r
            last_of_slot[slot] = r

    cdef void _mark(self, uint32_t tok, uint8_t bit):
        if tok >= self.side.size():
            self.side.resize(<size_t>tok + 1, 0)
        self.side[tok] |= bit

    cdef inline int64_t _rank(self, uint32_t a, uint32_t b, int64_t after, uint32_t* out) noexcept nogil:
        """The first rank > ``after`` that merges ``(a, b)``, or -1; ``out`` gets its result id."""
        cdef uint64_t key, slot
        cdef int64_t r
        # most pairs are no merge: a byte per id (is it a left part? a right part?) says so first
        if a >= self.side.size() or b >= self.side.size() or not (self.side[a] & 1) or not (self.side[b] & 2):
            return -1
        key = (<uint64_t>a << 32) | b
        slot = _mix(key) & self.mask
        while True:
            if self.keys[slot] == key:
                r = self.ranks[slot]
                while r >= 0 and r <= after:
                    r = self.later[r]
                if r >= 0:
                    out[0] = self.res_of_rank[r]
                return r
            if self.keys[slot] == 0xFFFFFFFFFFFFFFFFu:
                return -1
            slot = (slot + 1) & self.mask

    cdef int64_t _merge(self, uint32_t* s, int64_t n, vector[int64_t]& nxt, vector[int64_t]& prv,
                        vector[RankEntry]& heap) noexcept nogil:
        """Merge in place; returns the new length (symbols compacted to the front)."""
        cdef int64_t i, j, k, h, r, cur, m
        cdef uint32_t out, a, b
        cdef RankEntry e
        if n < 2:
            return n
        heap.clear()
        for i in range(n - 1):
            r = self._rank(s[i], s[i + 1], -1, &out)
            if r >= 0:
                e.rank = r
                e.pos = i
                heap.push_back(e)
        if heap.size() == 0:
            return n                             # no merge applies (most units of a text)
        nxt.resize(n)
        prv.resize(n)
        for i in range(n):
            nxt[i] = i + 1 if i + 1 < n else -1
            prv[i] = i - 1
        m = <int64_t>heap.size() // 2            # heapify bottom-up (Floyd)
        while m > 0:
            m -= 1
            _sift_down(heap, m)
        while heap.size() > 0:
            # The lowest rank, its entries in position order: they are applied left to right,
            # skipping stale ones. Entries pushed meanwhile have a later rank (step 3), so popping
            # one at a time is the same as taking the rank's whole batch first.
            cur = heap[0].rank
            i = heap[0].pos
            _pop(heap)
            if s[i] == 0xFFFFFFFFu:
                continue
            j = nxt[i]
            if j < 0:
                continue
            r = self._rank(s[i], s[j], cur - 1, &out)
            if r != cur:
                continue
            s[i] = out
            s[j] = 0xFFFFFFFFu
            k = nxt[j]
            nxt[i] = k
            if k >= 0:
                prv[k] = i
            h = prv[i]
            # 3. New neighbours: only merges after this rank apply (replay order).
            if h >= 0:
                r = self._rank(s[h], s[i], cur, &out)
                if r >= 0:
                    e.rank = r
                    e.pos = h
                    heap.push_back(e)
                    _sift_up(heap, heap.size() - 1)
            if k >= 0:
                r = self._rank(s[i], s[k], cur, &out)
                if r >= 0:
                    e.rank = r
                    e.pos = i
                    heap.push_back(e)
                    _sift_up(heap, heap.size() - 1)
        m = 0
        i = 0
        while i >= 0:
            s[m] = s[i]
            m += 1
            i = nxt[i]
        return m

    def merge(self, ids):
        """Merge one sequence; returns a new uint32 array."""
        arr = np.array(ids, dtype=np.uint32, copy=True)
        cdef uint32_t[::1] v = arr
        cdef vector[int64_t] nxt, prv
        cdef vector[RankEntry] heap
        cdef int64_t n
        if arr.shape[0] < 2:
            return arr
        with nogil:
            n = self._merge(&v[0], v.shape[0], nxt, prv, heap)
        return arr[:n].copy()

    def merge_many(self, const uint32_t[::1] symbols, const int64_t[::1] offsets):
        """Merge every sequence of a CSR; returns ``(symbols, offsets)`` of the results."""
        cdef Py_ssize_t n_seq = offsets.shape[0] - 1, q
        out = np.array(symbols, dtype=np.uint32, copy=True)
        out_offsets = np.empty(n_seq + 1, dtype=np.int64)
        cdef uint32_t[::1] ov = out
        cdef int64_t[::1] oo = out_offsets
        cdef vector[int64_t] nxt, prv
        cdef vector[RankEntry] heap
        cdef int64_t pos = 0, n, a, k
        with nogil:
            for q in range(n_seq):
                a = offsets[q]
                n = offsets[q + 1] - a
                if n >= 2:
                    n = self._merge(&ov[a], n, nxt, prv, heap)
                for k in range(n):
                    ov[pos + k] = ov[a + k]
                oo[q] = pos
                pos += n
            oo[n_seq] = pos
        return out[:pos].copy(), out_offsets


cdef inline void _sift_up(vector[RankEntry]& heap, size_t i) noexcept nogil:
    cdef RankEntry e = heap[i]
    cdef size_t parent
    while i > 0:
        parent = (i - 1) >> 1
        if not _entry_after(heap[parent], e):
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = e


cdef inline void _sift_down(vector[RankEntry]& heap, size_t i) noexcept nogil:
    cdef RankEntry e = heap[i]
    cdef size_t n = heap.size(), child
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and _entry_after(heap[child], heap[child + 1]):
            child += 1
        if not _entry_after(e, heap[child]):
            break
        heap[i] = heap[child]
        i = child
    heap[i] = e


cdef inline void _pop(vector[RankEntry]& heap) noexcept nogil:
    cdef RankEntry last = heap.back()
    cdef size_t n, i, child
    heap.pop_back()
    n = heap.size()
    if n == 0:
        return
    i = 0
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and _entry_after(heap[child], heap[child + 1]):
            child += 1
        if not _entry_after(last, heap[child]):
            break
        heap[i] = heap[child]
        i = child
    heap[i] = last
