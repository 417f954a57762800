# _units.pyx, part 7 of 9 (``include``d: compiled into the module as if written there).
# Stage 2's pair sketch: an upper bound of every pair's count in a small array (pair_sketch,
# pair_sketch_parts, sketch_bounds); the exact counts of a few pairs (pair_counts).

# ---- an upper bound of every pair's count in a small array (the count-min sketch of one row)

cdef inline uint64_t _sketch_slot(uint64_t key, uint64_t mask) noexcept nogil:
    # another multiplier than _pair_slot's: the sample below is drawn by _pair_slot's bits
    return ((key * <uint64_t>0xD6E8FEB86659FD93u) >> 29) & mask


cdef inline bint _sampled(uint64_t key, int sample_bits) noexcept nogil:
    """Whether a pair is in the sample of ``pair_sketch``: 1 in ``2**sample_bits`` of the distinct
    pairs, by the top bits of a hash of the pair (so a sampled pair is counted at every window)."""
    return sample_bits == 0 or ((key * <uint64_t>0x9E3779B97F4A7C15u) >> (64 - sample_bits)) == 0


#: A sketch counter holds at most this (uint16, saturating; what goes over is summed in ``excess``).
SKETCH_MAX = 0xFFFF


cdef class _SketchPart:
    """One thread's share of ``pair_sketch``: its sketch, the weight its saturated counters could not
    hold (``excess``) and the exact counts of its sampled pairs."""
    cdef object sketch_obj
    cdef _PairTable sample
    cdef public uint64_t excess

    def __init__(self, int bits, uint64_t cap):
        self.sketch_obj = np.zeros(<int64_t>1 << bits, dtype=np.uint16)
        self.sample = _PairTable(cap)
        self.excess = 0
        # huge pages for the counters (8 MiB at 32k on en_train): with 4 KiB pages nearly every
        # increment also missed the TLB (a hint only; asked before the zero pages are touched)
        cdef uint16_t[::1] v = self.sketch_obj
        cdef size_t a = <size_t>&v[0], huge = <size_t>1 << 21
        cdef size_t lo = (a + huge - 1) & ~(huge - 1), hi = (a + v.shape[0] * sizeof(uint16_t)) & ~(huge - 1)
        if hi > lo:
            madvise(<void*>lo, hi - lo, MADV_HUGEPAGE)

    def count(self, const sym_t[::1] symbols, const int64_t[::1] offsets, const int64_t[::1] weights,
              int64_t lo, int64_t hi, int sample_bits):
        cdef uint16_t[::1] sk = self.sketch_obj
        cdef uint64_t smask = sk.shape[0] - 1, key, slot, c, w, excess = self.excess
        cdef int64_t u, k, a, b, last = offsets[hi] if hi > lo else 0
        cdef _PairTable t = self.sample
        if t.oom:
            raise MemoryError("pair_sketch: no memory for the sampled pairs")
        with nogil:
            for u in range(lo, hi):
                if weights[u] <= 0:         # adds nothing (encoded units weigh 0)
                    continue
                w = <uint64_t>weights[u]
                a = offsets[u]
                b = offsets[u + 1]
                for k in range(a, b - 1):
                    # the counter of a window ahead (a hint only), in this unit or the ones after it:
                    # a unit has ~22 windows, so asking within the unit left most of them unasked
                    if k + 17 < last:
                        __builtin_prefetch(&sk[_sketch_slot(
                            ((<uint64_t>symbols[k + 16] << 32) | symbols[k + 17]) + 1, smask)])
                    key = ((<uint64_t>symbols[k] << 32) | symbols[k + 1]) + 1
                    slot = _sketch_slot(key, smask)
                    c = sk[slot] + w
                    if c < <uint64_t>0xFFFF:
                        sk[slot] = <uint16_t>c
                    else:
                        sk[slot] = 0xFFFF
                        excess += c - 0xFFFF
                    if _sampled(key, sample_bits) and t._add(key, weights[u]) < 0:
                        break
                if t.oom:
                    break
        self.excess = excess
        if t.oom:
            raise MemoryError("pair_sketch: no memory for the sampled pairs")


def pair_sketch(const sym_t[::1] symbols, const int64_t[::1] offsets, const int64_t[::1] weights,
                int bits, int sample_bits=0, int threads=1):
    """An upper bound of every window's pair count in ``2**bits`` counters, and the exact counts of a
    sample of the pairs: returns ``(sketch, sampled_counts, excess)``.

    ``sketch[_sketch_slot(pair)]`` (uint16) is the weighted count of all the pairs that share the
    pair's counter, capped at ``SKETCH_MAX`` (65535), so it is at least the pair's own count or the
    cap (``sketch_bounds`` reads it per window): a count-min sketch of one row. ``excess`` is the
    weight the capped counters did not hold, so the counters plus ``excess`` are every window's weight
    (the caller checks that). ``sampled_counts`` (int64, no order) are the exact weighted counts of the
    distinct pairs a hash puts in a ``1 / 2**sample_bits`` sample (every pair with ``sample_bits=0``),
    pairs of weight 0 left out. SuperBPE's stage 2 draws its first cut from the sample and cuts its
    units where the bound is below the cut (``cut_pieces(keep=)``, the cut capped at ``SKETCH_MAX``
    too): a bound, never below the count or the cap, cuts no window the exact count keeps (exact
    whatever the collisions). 16-bit counters: the 2**22 of en_train at 32k are 8 MiB a thread, so
    both threads' sketches stay in a 32 MiB cache.

    >>> sk, pc, over = pair_sketch(np.array([1, 2, 1, 2, 3], np.uint32), np.array([0, 2, 5]),
    ...                            np.array([3, 1]), 4)
    >>> sorted(pc.tolist()), int(sk.sum()), over       # (1, 2): 3 + 1, (2, 3): 1 -> 5 in all
    ([1, 4], 5, 0)
    >>> bounds = sketch_bounds(sk, np.array([1, 2, 1, 2, 3], np.uint32), np.array([0, 2, 5]))
    >>> [int(b) >= c for b, c in zip(bounds, [4, 0, 4, 1, 0])]        # never below the exact levels
    [True, True, True, True, True]
    >>> sk, pc, over = pair_sketch(np.array([1, 2], np.uint32), np.array([0, 2]), np.array([70000]), 4)
    >>> int(sk.max()), over                  # capped; the rest is counted as excess
    (65535, 4465)

    One pass over the windows, one counter each (asked for 16 windows ahead); the sampled ones also
    go to a small exact table. With ``threads=2`` each half of the sequences is counted on its own
    thread into its own sketch and sample; the sketches are added (saturating, what goes over joins
    the excess) and the samples summed: the same result.

    Plain equivalent: ``Counter`` of ``(s[k], s[k+1])`` over the windows, times the weight, summed per
    counter (``_sketch_slot``), and the ``Counter`` restricted to the sampled pairs.
    """
    return pair_sketch_parts(unit_halves(threads, symbols, offsets, weights), bits, sample_bits)


def unit_halves(int threads, symbols, offsets, *per_seq):
    """``[(symbols, offsets, *per_seq)]``, or with ``threads=2`` (and enough symbols) the same cut in
    two halves by symbols: ``offsets`` (and each per-sequence array) sliced; the symbols are shared,
    as offsets are positions in them."""
    cdef int64_t n_seq = offsets.shape[0] - 1, n_sym = symbols.shape[0], mid
    if threads <= 1 or n_seq < 2 or n_sym < (1 << 20):
        return [(symbols, offsets) + tuple(per_seq)]
    mid = int(np.searchsorted(np.asarray(offsets), n_sym // 2))
    mid = min(max(mid, 1), n_seq - 1)
    return [(symbols, offsets[:mid + 1]) + tuple(a[:mid] for a in per_seq),
            (symbols, offsets[mid:]) + tuple(a[mid:] for a in per_seq)]


def half_at(list parts):
    """Where ``parts`` (one or more ``(symbols, offsets, ...)``, each offsets' positions in its own
    symbols) are parted between two threads: the first ``k`` parts, as few as cover half of the
    symbols their sequences cover (at least one, and one left for the second): 1 for two parts.

    >>> p = lambda n: (None, np.array([0, n]))
    >>> half_at([p(5), p(5)]), half_at([p(1), p(1), p(1), p(5)]), half_at([p(9), p(1), p(1)])
    (1, 3, 1)
    """
    cdef int64_t total = 0, acc = 0, k = 0, n = len(parts)
    covers = [int(p[1][len(p[1]) - 1] - p[1][0]) if len(p[1]) > 0 else 0 for p in parts]
    total = sum(covers)
    while k < n - 1 and (k == 0 or 2 * acc < total):
        acc += covers[k]
        k += 1
    return k


def _count_parts(_SketchPart t, list group, int sample_bits):
    """One thread's parts of ``pair_sketch_parts``, counted one after the other into ``t``."""
    for sym, off, w in group:
        t.count(sym, off, w, 0, len(off) - 1, sample_bits)


def pair_sketch_parts(list parts, int bits, int sample_bits=0):
    """:func:`pair_sketch` over the sequences of one part or more ``(symbols, offsets, weights)``
    (each part's offsets are positions in its own symbols), one thread per part, or with more than
    two the first :func:`half_at` parts on one thread and the rest on the other, each counted in
    turn: the result of ``pair_sketch`` on the parts joined (tested)."""
    cdef uint64_t cap = 1 << 10
    cdef int64_t n_sym = sum(int(p[0].shape[0]) for p in parts)
    cdef int n_parts = len(parts)
    if bits < 3 or bits > 30:        # 3: the keep bitmap (cut_pieces) has whole bytes
        raise ValueError(f"pair_sketch: bits must be in 3..30, not {bits}")
    if sample_bits < 0 or sample_bits > 16:
        raise ValueError(f"pair_sketch: sample_bits must be in 0..16, not {sample_bits}")
    if n_parts < 1:
        raise ValueError("pair_sketch_parts: one part or more")
    cdef int n_threads = 1 if n_parts == 1 else 2
    while cap < <uint64_t>((n_sym >> sample_bits) // (4 * n_threads)) and cap < (<uint64_t>1 << 31):
        cap <<= 1       # as pair_levels: room for a sampled pair per 8 sampled windows
    cdef _SketchPart left = _SketchPart(bits, cap), right
    if n_parts == 1:
        sym, off, w = parts[0]
        left.count(sym, off, w, 0, len(off) - 1, sample_bits)
        return left.sketch_obj, left.sample.counts_with(None), int(left.excess)
    from concurrent.futures import ThreadPoolExecutor
    right = _SketchPart(bits, cap)
    sketches = (left, right)
    cdef int64_t k = half_at(parts)
    with ThreadPoolExecutor(2, thread_name_prefix="bpe_core-sketch") as ex:
        jobs = [ex.submit(_count_parts, t, g, sample_bits) for t, g in zip(sketches, (parts[:k], parts[k:]))]
        for j in jobs:
            j.result()
    over = _add_saturating(left.sketch_obj, right.sketch_obj)
    return left.sketch_obj, left.sample.counts_with(right.sample), int(left.excess + right.excess) + over


cdef uint64_t _add_saturating_c(uint16_t* a, const uint16_t* b, int64_t n) noexcept nogil:
    cdef int64_t i
    cdef uint32_t c
    cdef uint64_t over = 0
    for i in range(n):
        c = <uint32_t>a[i] + b[i]
        if c < 0xFFFF:
            a[i] = <uint16_t>c
        else:
            a[i] = 0xFFFF
            over += c - 0xFFFF
    return over


def _add_saturating(uint16_t[::1] a, const uint16_t[::1] b):
    """``a += b`` in place, each sum capped at ``SKETCH_MAX``; returns what the caps left out."""
    cdef uint64_t over
    with nogil:
        over = _add_saturating_c(&a[0], &b[0], a.shape[0])
    return int(over)


def sketch_bounds(const uint16_t[::1] sketch, const uint32_t[::1] symbols, const int64_t[::1] offsets):
    """Per position, the sketch's bound of its window's pair count (0 at a sequence's last position):
    what ``cut_pieces(keep=)`` compares with the cut, as an array (tests and tools)."""
    cdef int64_t n_seq = offsets.shape[0] - 1, u, k
    cdef uint64_t smask = sketch.shape[0] - 1
    out = np.zeros(symbols.shape[0], dtype=np.uint32)
    cdef uint32_t[::1] ov = out
    with nogil:
        for u in range(n_seq):
            for k in range(offsets[u], offsets[u + 1] - 1):
                ov[k] = sketch[_sketch_slot(((<uint64_t>symbols[k] << 32) | symbols[k + 1]) + 1, smask)]
    return out



def pair_counts(const sym_t[::1] symbols, const int64_t[::1] offsets, const int64_t[::1] weights,
                const uint64_t[::1] keys):
    """The exact weighted count of each pair ``keys[i] = (a << 32) | b`` over the windows of the
    sequences (``symbols`` split by ``offsets``, sequence ``u`` weighing ``weights[u]``; a weight of 0
    or less adds nothing, as in ``pair_sketch``): int64, one per key. ``keys`` unique, any order.

    For a few pairs against many windows (stage 2's guard, ``superbpe.stage2``): a table of the keys
    at most 1/4 full, in the L1 cache for a few hundred of them, probed once a window.

    >>> pair_counts(np.array([1, 2, 1, 2, 3], np.uint32), np.array([0, 2, 5]), np.array([3, 1]),
    ...             np.array([(1 << 32) | 2, (2 << 32) | 3, (3 << 32) | 1], np.uint64)).tolist()
    [4, 1, 0]

    Plain equivalent: ``Counter`` of ``(s[k], s[k+1])`` over the windows, times the weight.
    """
    cdef int64_t n_keys = keys.shape[0], i, u, k, a, b, n_seq = offsets.shape[0] - 1
    cdef uint64_t cap = 16, mask, key, slot
    while cap < <uint64_t>(4 * n_keys):
        cap <<= 1
    mask = cap - 1
    table = np.zeros(cap, dtype=np.uint64)          # key + 1 (0: empty)
    where = np.zeros(cap, dtype=np.int64)
    out = np.zeros(n_keys, dtype=np.int64)
    cdef uint64_t[::1] tk = table
    cdef int64_t[::1] tw = where
    cdef int64_t[::1] ov = out
    for i in range(n_keys):
        key = keys[i] + 1
        slot = _sketch_slot(key, mask)
        while tk[slot] != 0 and tk[slot] != key:
            slot = (slot + 1) & mask
        if tk[slot] == key:
            raise ValueError("pair_counts: the keys must be unique")
        tk[slot] = key
        tw[slot] = i
    if n_keys == 0:
        return out
    with nogil:
        for u in range(n_seq):
            if weights[u] <= 0:
                continue
            a = offsets[u]
            b = offsets[u + 1]
            for k in range(a, b - 1):
                key = ((<uint64_t>symbols[k] << 32) | symbols[k + 1]) + 1
                slot = _sketch_slot(key, mask)
                while tk[slot] != 0:
                    if tk[slot] == key:
                        ov[tw[slot]] += weights[u]
                        break
                    slot = (slot + 1) & mask
    return out
