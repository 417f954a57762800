# _units.pyx, part 5 of 9 (``include``d: compiled into the module as if written there).
# UnitCounter (unique units with counts, sampled by content hash), expand_units, strip_marks, unit_sums.

# ==== Unit counter ============================================================================

cdef class UnitCounter:
    """Counts unique id sequences.

    >>> c = UnitCounter()
    >>> c.add_units(np.array([1, 2, 1, 2, 3], np.uint32), np.array([0, 2, 4, 5]))
    >>> data, starts, counts = c.to_arrays()
    >>> [data[starts[i]:starts[i + 1]].tolist() for i in range(len(counts))], counts.tolist()
    ([[1, 2], [3]], [2, 1])

    Plain equivalent: ``Counter(tuple(ids[b[k]:b[k+1]]) for k in range(len(b) - 1))``.
    """
    cdef vector[uint32_t] data
    cdef vector[int64_t] starts
    cdef vector[int64_t] counts
    cdef vector[uint64_t] hashes
    cdef vector[int64_t] slots
    cdef uint64_t mask
    cdef public int64_t n_seen
    cdef public int64_t n_kept

    def __init__(self):
        self.starts.push_back(0)
        self.slots.assign(1024, -1)
        self.mask = 1023
        self.n_seen = 0
        self.n_kept = 0

    @property
    def n_units(self):
        return self.counts.size()

    @property
    def n_symbols(self):
        return self.data.size()

    def reserve(self, int64_t n_ids, int64_t n_units):
        """Room for about ``n_ids`` ids in ``n_units`` units (address space: pages are touched as
        written), so the lists do not grow by copies, each into fresh pages; a hint only (they still
        grow past it), the same counts either way.

        >>> c = UnitCounter()
        >>> c.reserve(100, 10)
        >>> c.add_units(np.array([1, 2, 1, 2], np.uint32), np.array([0, 2, 4]))
        >>> [a.tolist() for a in c.to_arrays()]
        [[1, 2], [0, 2], [2]]
        """
        if n_ids > 0:
            self.data.reserve(n_ids)
        if n_units > 0:
            self.starts.reserve(n_units + 1)
            self.counts.reserve(n_units)
            self.hashes.reserve(n_units)

    cdef void _grow(self) noexcept nogil:
        cdef uint64_t cap = (self.mask + 1) * 2, slot
        cdef size_t u
        self.slots.assign(cap, -1)
        self.mask = cap - 1
        for u in range(self.counts.size()):
            slot = self.hashes[u] & self.mask
            while self.slots[slot] != -1:
                slot = (slot + 1) & self.mask
            self.slots[slot] = u

    cdef void _add(self, const uint32_t* p, int64_t n, int64_t weight, uint64_t h) noexcept nogil:
        cdef uint64_t slot = h & self.mask
        cdef int64_t u, s
        while True:
            u = self.slots[slot]
            if u == -1:
                break
            if self.hashes[u] == h:
                s = self.starts[u]
                if self.starts[u + 1] - s == n and (n == 0 or memcmp(&self.data[s], p, n * sizeof(uint32_t)) == 0):
                    self.counts[u] += weight
                    return
            slot = (slot + 1) & self.mask
        u = self.counts.size()
        self.slots[slot] = u
        self.hashes.push_back(h)
        self.counts.push_back(weight)
        for s in range(n):
            self.data.push_back(p[s])
        self.starts.push_back(self.data.size())
        if 2 * self.counts.size() > self.mask + 1:
            self._grow()

    cdef inline void _add_sampled(self, const uint32_t* p, int64_t n, int64_t weight, uint64_t keep_below) noexcept nogil:
        cdef uint64_t h = _hash_ids(p, n)
        self.n_seen += weight
        if keep_below != 0xFFFFFFFFFFFFFFFFu and h >= keep_below:
            return
        self.n_kept += weight
        self._add(p, n, weight, h)

    def add_units(self, const uint32_t[::1] ids, const int64_t[::1] bounds, int64_t weight=1,
                  uint64_t keep_below=0xFFFFFFFFFFFFFFFFu, int64_t min_len=1):
        """Add units ``ids[bounds[k]:bounds[k+1]]`` with ``weight`` each.

        Units shorter than ``min_len`` are skipped; a unit whose content hash is >= ``keep_below`` is
        left out of the sample (the default keeps all).
        """
        cdef Py_ssize_t k
        cdef int64_t a, b
        cdef uint64_t h
        cdef const uint32_t* base = &ids[0] if ids.shape[0] > 0 else NULL
        with nogil:
            for k in range(bounds.shape[0] - 1):
                a = bounds[k]
                b = bounds[k + 1]
                if b - a < min_len:
                    continue
                self.n_seen += weight
                h = _hash_ids(base + a, b - a)
                if keep_below != 0xFFFFFFFFFFFFFFFFu and h >= keep_below:
                    continue
                self.n_kept += weight
                self._add(base + a, b - a, weight, h)

    def add_table(self, const uint32_t[::1] data, const int64_t[::1] starts, const int64_t[::1] counts):
        """Add another counter's ``to_arrays()`` (summing counts of equal units)."""
        cdef Py_ssize_t k
        cdef int64_t a, b
        cdef const uint32_t* base = &data[0] if data.shape[0] > 0 else NULL
        with nogil:
            for k in range(counts.shape[0]):
                a = starts[k]
                b = starts[k + 1]
                self._add(base + a, b - a, counts[k], _hash_ids(base + a, b - a))

    def to_arrays(self, bint take=False):
        """``(data uint32, starts int64, counts int64)``, units in first-seen order.

        ``take``: the counter's own memory becomes the arrays' (lent to numpy: no copy, no second
        set of pages beside it); the counter is empty afterwards (its figures stay).

        >>> c = UnitCounter()
        >>> c.add_units(np.array([4, 4, 5], np.uint32), np.array([0, 1, 2, 3]))
        >>> [a.tolist() for a in c.to_arrays(take=True)], c.n_units, c.n_seen
        ([[4, 5], [0, 1, 2], [2, 1]], 0, 3)
        """
        cdef _IdList dl
        cdef _I64List sl, cl
        if take:
            dl, sl, cl = _IdList(), _I64List(), _I64List()
            dl.v.swap(self.data)
            sl.v.swap(self.starts)
            cl.v.swap(self.counts)
            self.hashes.clear()
            self.hashes.shrink_to_fit()
            self.slots.assign(1024, -1)
            self.slots.shrink_to_fit()
            self.mask = 1023
            self.starts.push_back(0)
            return dl.array(), sl.array(), cl.array()
        data = np.empty(self.data.size(), dtype=np.uint32)
        starts = np.empty(self.starts.size(), dtype=np.int64)
        counts = np.empty(self.counts.size(), dtype=np.int64)
        cdef uint32_t[::1] dv = data
        cdef int64_t[::1] sv = starts
        cdef int64_t[::1] cv = counts
        cdef size_t i
        for i in range(self.data.size()):
            dv[i] = self.data[i]
        for i in range(self.starts.size()):
            sv[i] = self.starts[i]
        for i in range(self.counts.size()):
            cv[i] = self.counts[i]
        return data, starts, counts


def expand_units(const uint32_t[::1] data, const int64_t[::1] starts, const uint32_t[::1] seg_symbols,
                 const int64_t[::1] seg_offsets, bint narrow=False):
    """Replace each word id by its segmentation: returns ``(symbols uint32, offsets int64)``;
    ``ENCODED_MARK`` stays itself.

    >>> s, o = expand_units(np.array([0, 1], np.uint32), np.array([0, 2]),
    ...                     np.array([7, 8, 9], np.uint32), np.array([0, 2, 3]))
    >>> s.tolist(), o.tolist()
    ([7, 8, 9], [0, 3])

    ``narrow``: the symbols as uint16 (half the bytes for stage 2 to hold and read), when every
    segmentation symbol fits (``ValueError`` otherwise, and for a unit with ``ENCODED_MARK``):

    >>> s, o = expand_units(np.array([0, 1], np.uint32), np.array([0, 2]),
    ...                     np.array([7, 8, 9], np.uint32), np.array([0, 2, 3]), narrow=True)
    >>> s.dtype.name, s.tolist()
    ('uint16', [7, 8, 9])

    Plain equivalent: ``[sum((seg[w] for w in unit), []) for unit in units]``.
    """
    cdef Py_ssize_t n_units = starts.shape[0] - 1, u, k
    cdef int64_t total = 0, pos = 0, w, j
    for k in range(data.shape[0]):
        w = data[k]
        if w == _ENCODED_MARK:
            if narrow:
                raise ValueError("expand_units: narrow units cannot hold ENCODED_MARK")
            total += 1
        elif w + 1 >= seg_offsets.shape[0]:
            raise ValueError(f"word id {w} is not in the segmentation")
        else:
            total += seg_offsets[w + 1] - seg_offsets[w]
    if narrow:
        for k in range(seg_symbols.shape[0]):
            if seg_symbols[k] > 0xFFFF:
                raise ValueError(f"expand_units: symbol {seg_symbols[k]} does not fit uint16")
    symbols = np.empty(total, dtype=np.uint16 if narrow else np.uint32)
    offsets = np.empty(n_units + 1, dtype=np.int64)
    cdef uint32_t[::1] sv
    cdef uint16_t[::1] nv
    cdef int64_t[::1] ov = offsets
    if narrow:
        nv = symbols
        with nogil:
            for u in range(n_units):
                ov[u] = pos
                for k in range(starts[u], starts[u + 1]):
                    w = data[k]
                    for j in range(seg_offsets[w], seg_offsets[w + 1]):
                        nv[pos] = <uint16_t>seg_symbols[j]
                        pos += 1
            ov[n_units] = pos
        return symbols, offsets
    sv = symbols
    with nogil:
        for u in range(n_units):
            ov[u] = pos
            for k in range(starts[u], starts[u + 1]):
                w = data[k]
                if w == _ENCODED_MARK:
                    sv[pos] = _ENCODED_MARK
                    pos += 1
                    continue
                for j in range(seg_offsets[w], seg_offsets[w + 1]):
                    sv[pos] = seg_symbols[j]
                    pos += 1
        ov[n_units] = pos
    return symbols, offsets


def strip_marks(uint32_t[::1] data, int64_t[::1] starts):
    """Take ``ENCODED_MARK`` off the end of the units ``data[starts[u]:starts[u+1]]`` that carry it,
    in place (one pass, no copy of the arrays): returns ``(data[:n], starts, encoded)`` with ``starts``
    rewritten and ``encoded`` (bool per unit) saying which units carried the mark.

    >>> d = np.array([1, 2, ENCODED_MARK, 3, 4, ENCODED_MARK], np.uint32)
    >>> data, starts, enc = strip_marks(d, np.array([0, 3, 4, 6]))
    >>> data.tolist(), starts.tolist(), enc.tolist()
    ([1, 2, 3, 4], [0, 2, 3, 4], [True, False, True])

    Plain equivalent: ``encoded = data[starts[1:] - 1] == ENCODED_MARK`` (for non-empty units), then
    ``data[data != ENCODED_MARK]`` and ``starts - cumsum(encoded)``.
    """
    cdef Py_ssize_t n_units = starts.shape[0] - 1, u
    cdef int64_t a, b, pos
    if n_units < 0:
        raise ValueError("starts must hold at least one entry")
    if starts[n_units] > data.shape[0] or starts[0] < 0:
        raise ValueError("starts go past the data")
    encoded = np.zeros(max(n_units, 0), dtype=bool)
    cdef uint8_t[::1] ev = encoded.view(np.uint8)
    cdef uint32_t* dp = &data[0] if data.shape[0] > 0 else NULL
    with nogil:
        a = starts[0]
        pos = a
        for u in range(n_units):
            b = starts[u + 1]
            if b < a:
                with gil:
                    raise ValueError("starts must not decrease")
            if b > a and dp[b - 1] == _ENCODED_MARK:
                ev[u] = 1
                b -= 1
            if pos != a:
                memmove(dp + pos, dp + a, (b - a) * sizeof(uint32_t))
            pos += b - a
            a = starts[u + 1]
            starts[u + 1] = pos
    return np.asarray(data)[:pos], np.asarray(starts), encoded


def unit_sums(const uint32_t[::1] symbols, const int64_t[::1] offsets, const int64_t[::1] values):
    """Per sequence ``u``: the sum of ``values[s]`` over its symbols ``s`` (int64).

    >>> unit_sums(np.array([0, 1, 1, 2], np.uint32), np.array([0, 3, 3, 4]), np.array([1, 10, 100])).tolist()
    [21, 0, 100]

    Plain equivalent: ``[values[symbols[offsets[u]:offsets[u + 1]]].sum() for u in ...]``.
    """
    cdef int64_t n_seq = offsets.shape[0] - 1, u, k, total
    out = np.empty(n_seq, dtype=np.int64)
    cdef int64_t[::1] ov = out
    with nogil:
        for u in range(n_seq):
            total = 0
            for k in range(offsets[u], offsets[u + 1]):
                total += values[symbols[k]]
            ov[u] = total
    return out

