# _encode.pyx, part 8 of 10 (``include``d: compiled into the module as if written there).
# Stage-aware encoding (SuperBPE), part two: the merge across pretokens (XView, segments, digit
# groups) and encode_stage_aware.

cdef struct XView:
    # Stage2Table as plain C data (the hot loop reads it without touching the object)
    const uint64_t* filter
    int fshift
    const CrossSlot* slots
    uint64_t mask
    int shift
    bint all_cross
    void* merger                        # the RankMerger (borrowed)
    const uint32_t* lengths             # bytes of each id (n_lengths of them)
    Py_ssize_t n_lengths
    const uint8_t* sides                # what each id tells of its pretoken (n_sides of them; _id_sides)
    Py_ssize_t n_sides


cdef inline XView _xview(Stage2Table t) noexcept:
    cdef XView v
    v.filter = t.filter.data()
    v.fshift = t.fshift
    v.slots = t.slots.data()
    v.mask = t.mask
    v.shift = t.shift
    v.all_cross = t.all_cross
    v.merger = <void*>t.merger
    v.lengths = t.lengths.data()
    v.n_lengths = <Py_ssize_t>t.lengths.size()
    v.sides = t.sides.data()
    v.n_sides = <Py_ssize_t>t.sides.size()
    return v


cdef inline uint64_t _filter_hit(const XView* v, pair_key_t key) noexcept nogil:
    """1 when the pair ``key`` may be crossable (its bit of the filter is set), else 0: the bit
    the top ``64 - fshift`` bits of ``key * MUL1`` name."""
    cdef uint64_t h = (key * MUL1) >> v.fshift
    return (v.filter[h >> 6] >> (h & 63)) & 1


cdef inline bint _cross(const XView* v, token_id_t a, token_id_t b, uint32_t* rank, token_id_t* res) noexcept nogil:
    """Whether ``(a, b)`` is crossable; ``rank`` gets its first rank (or NO_RANK; the LATER_RANKS
    flag stays set) and ``res`` the id it merges into."""
    cdef pair_key_t key = pack_pair(a, b)
    cdef uint64_t slot
    cdef int64_t r
    if v.all_cross:
        r = (<RankMerger>v.merger)._rank(a, b, -1, res)
        rank[0] = <uint32_t>r if r >= 0 else NO_RANK
        return True
    if not _filter_hit(v, key):
        return False
    slot = (key * MUL2) >> v.shift
    while True:
        if v.slots[slot].key == key:
            rank[0] = v.slots[slot].rank
            res[0] = v.slots[slot].res
            return True
        if v.slots[slot].key == EMPTY_KEY:
            return False
        slot = (slot + 1) & v.mask


cdef inline uint32_t _rank_after(const XView* v, token_id_t a, token_id_t b, int64_t after,
                                 token_id_t* res) noexcept nogil:
    """The first rank > ``after`` that merges ``(a, b)`` (``res``: its result), or NO_RANK
    (``RankMerger._rank``, from the table)."""
    cdef uint32_t r = NO_RANK
    cdef int64_t r2
    if v.all_cross:
        r2 = (<RankMerger>v.merger)._rank(a, b, after, res)
        return <uint32_t>r2 if r2 >= 0 else NO_RANK
    if not _cross(v, a, b, &r, res) or r == NO_RANK:
        return NO_RANK
    if <int64_t>(r & ~LATER_RANKS) > after:
        return r & ~LATER_RANKS
    if r & LATER_RANKS:                     # the same pair merged again (rare): the chain
        r2 = (<RankMerger>v.merger)._rank(a, b, after, res)
        return <uint32_t>r2 if r2 >= 0 else NO_RANK
    return NO_RANK


cdef Py_ssize_t _merge_short(const XView* v, token_id_t* tok, Py_ssize_t m, const uint32_t* rk0,
                             const token_id_t* rs0) noexcept nogil:
    """Merge ``tok[0:m]`` (``m <= SHORT_SEG``) in place by repeated min-rank scans; the new length.

    ``RankMerger._merge`` without a heap: take the lowest rank scheduled, merge its pairs left to
    right without overlap, give each pair that touches a merged token its first rank after the one
    applied (the others keep theirs), repeat. The heap version pops the same ranks in the same
    position order, and its stale entries never apply (a rank names one pair, and a merged token
    is never its own left part), so both give the same result (tested against it).

    ``rk0, rs0``: what ``_cross`` gave for each pair ``tok[i], tok[i + 1]`` (its first rank, with
    the LATER_RANKS flag, and result).
    """
    cdef uint32_t rk[SHORT_SEG]
    cdef token_id_t rs[SHORT_SEG]
    cdef Py_ssize_t old_at[SHORT_SEG]
    cdef bint fresh[SHORT_SEG]
    cdef Py_ssize_t i, w, j
    cdef uint32_t r, r1, r2
    cdef token_id_t t, res = 0
    if m == 3:                              # the common case, unrolled: the lower rank first
        r1 = rk0[0] if rk0[0] == NO_RANK else rk0[0] & ~LATER_RANKS
        r2 = rk0[1] if rk0[1] == NO_RANK else rk0[1] & ~LATER_RANKS
        if r1 == NO_RANK and r2 == NO_RANK:
            return 3
        if r1 <= r2:                        # (a tie: the same pair twice, the left one wins)
            t = rs0[0]
            r = _rank_after(v, t, tok[2], r1, &res)
            if r != NO_RANK:
                tok[0] = res
                return 1
            tok[0] = t
            tok[1] = tok[2]
            return 2
        t = rs0[1]
        r = _rank_after(v, tok[0], t, r2, &res)
        if r != NO_RANK:
            tok[0] = res
            return 1
        tok[1] = t
        return 2
    for i in range(m - 1):
        rk[i] = rk0[i] if rk0[i] == NO_RANK else rk0[i] & ~LATER_RANKS
        rs[i] = rs0[i]
    while m > 1:
        r = NO_RANK
        for i in range(m - 1):
            if rk[i] < r:
                r = rk[i]
        if r == NO_RANK:
            break
        # in place: position w <= i is written after i is read; a pair kept moves down (old_at >= j)
        w = 0
        i = 0
        while i < m:
            if i + 1 < m and rk[i] == r:
                tok[w] = rs[i]
                fresh[w] = True
                i += 2
            else:
                tok[w] = tok[i]
                fresh[w] = False
                old_at[w] = i
                i += 1
            w += 1
        for j in range(w - 1):
            if fresh[j] or fresh[j + 1]:
                rk[j] = _rank_after(v, tok[j], tok[j + 1], r, &rs[j])
            else:
                rk[j] = rk[old_at[j]]
                rs[j] = rs[old_at[j]]
        m = w
    return m


cdef inline Py_ssize_t _merge3(const XView* v, token_id_t* out, Py_ssize_t a, Py_ssize_t w,
                               const uint32_t* rk0, const token_id_t* rs0) noexcept nogil:
    """``_merge_short`` of the three ids ``out[a:a + 3]`` (its ``m == 3`` case), written at
    ``out[w:]`` (``w <= a``); returns how many ids it wrote. Inline in ``_flush_segments``: a third
    of the segments that need a merge are three ids."""
    cdef token_id_t x0 = out[a], x1 = out[a + 1], x2 = out[a + 2], t, res = 0
    cdef uint32_t r1 = rk0[0], r2 = rk0[1]
    if r1 != NO_RANK:
        r1 &= ~LATER_RANKS
    if r2 != NO_RANK:
        r2 &= ~LATER_RANKS
    if r1 == NO_RANK and r2 == NO_RANK:
        out[w] = x0
        out[w + 1] = x1
        out[w + 2] = x2
        return 3
    if r1 <= r2:                            # (a tie: the same pair twice, the left one wins)
        t = rs0[0]
        if _rank_after(v, t, x2, r1, &res) != NO_RANK:
            out[w] = res
            return 1
        out[w] = t
        out[w + 1] = x2
        return 2
    t = rs0[1]
    if _rank_after(v, x0, t, r2, &res) != NO_RANK:
        out[w] = res
        return 1
    out[w] = x0
    out[w + 1] = t
    return 2


cdef class Stage2Scratch:
    """The scratch of one thread's stage-2 merging (``encode_stage_aware``)."""


cdef Py_ssize_t _merge_segment(const XView* v, Stage2Scratch sc, token_id_t* out, Py_ssize_t a,
                               Py_ssize_t b, Py_ssize_t w, const uint32_t* rk0,
                               const token_id_t* rs0) noexcept nogil:
    """Stage-2 merge the segment ``out[a:b]`` and write it at ``out[w:]`` (``w <= a``); returns the
    new ``w``. Up to ``SHORT_SEG`` ids: ``_merge_short`` (``rk0, rs0``: its pairs' lookups);
    longer: ``RankMerger._merge`` (a heap)."""
    cdef Py_ssize_t n = b - a, m, i
    if n <= 0:
        return w
    if n == 1:
        out[w] = out[a]
        return w + 1
    if n <= SHORT_SEG:
        m = _merge_short(v, out + a, n, rk0, rs0)
        for i in range(m):                  # a few ids, down (w <= a): no call to memmove
            out[w + i] = out[a + i]
        return w + m
    m = (<RankMerger>v.merger)._merge(out + a, n, sc.nxt, sc.prv, sc.heap)
    if w != a:
        memmove(out + w, out + a, m * sizeof(token_id_t))
    return w + m


cdef int _digit_group_cuts(const XView* v, Stage2Scratch sc, const uint8_t* s, Py_ssize_t q,
                           Py_ssize_t e, const token_id_t* toks, Py_ssize_t n_toks) except -1 nogil:
    """``sc.inner_cut[t]`` = 1 where the ``"units"`` split cuts the numeric pretoken ``s[q:e]``
    before its stage-1 id ``toks[t]`` (``t >= 1``), as ``superbpe.words.numeric_cuts``: at a byte
    offset between digits and other characters, or between groups of three digits counted from the
    right inside a run of digits (characters decoded as Python's UTF-8 decoder with
    ``surrogateescape`` does, ``\p{N}`` from the Unicode tables)."""
    cdef Py_ssize_t i = q, k = 0, nc = 0, j, c, first, h = 0, nh, t
    cdef int64_t pos = 0
    cdef token_id_t x
    cdef uint8_t digit
    cdef uint8_t* cut
    # (values go through plain locals: Cython passes a conditional expression to push_back or a
    # vector item by a reference to a temporary)
    sc.char_offs.clear()
    sc.char_digit.clear()
    sc.hard.clear()
    while i < e:
        sc.char_offs.push_back(i - q)
        digit = 0
        if _char_flags(s, i, e, &k) & BPE_UT_N:
            digit = 1
        sc.char_digit.push_back(digit)
        i += k
    nc = <Py_ssize_t>sc.char_offs.size()
    i = 0
    while i < nc:
        if not sc.char_digit[i]:
            i += 1
            continue
        j = i
        while j < nc and sc.char_digit[j]:
            j += 1
        if i > 0:
            sc.hard.push_back(sc.char_offs[i])
        first = i + ((j - i) % 3 if (j - i) % 3 else 3)
        c = first
        while c < j:
            sc.hard.push_back(sc.char_offs[c])
            c += 3
        if j < nc:
            sc.hard.push_back(sc.char_offs[j])
        i = j
    if <Py_ssize_t>sc.inner_cut.size() < n_toks:
        sc.inner_cut.resize(n_toks)
    cut = sc.inner_cut.data()
    nh = <Py_ssize_t>sc.hard.size()
    for t in range(n_toks):
        if t > 0:
            while h < nh and sc.hard[h] < pos:
                h += 1
            cut[t] = 0
            if h < nh and sc.hard[h] == pos:
                cut[t] = 1
        x = toks[t]
        pos += v.lengths[x] if <Py_ssize_t>x < v.n_lengths else 0
    return 0


cdef int _cut_digit_groups(const XView* v, Stage2Scratch sc, const uint8_t* s, Py_ssize_t q,
                           Py_ssize_t e, const token_id_t* out, Py_ssize_t k, Py_ssize_t k1,
                           uint8_t* cross, Py_ssize_t lo) except -1 nogil:
    """The ``"units"`` split's cuts inside the numeric pretoken ``s[q:e]`` (stage-1 ids
    ``out[k:k1]``): ``cross[c - lo] = 0`` before each id ``c`` that starts a new digit group."""
    cdef Py_ssize_t t
    _digit_group_cuts(v, sc, s, q, e, out + k, k1 - k)
    for t in range(1, k1 - k):
        if sc.inner_cut[t]:
            cross[k + t - lo] = 0
    return 0


cdef enum:
    STAGE_WINDOW = 1024      # pretokens a window of _stage_span (its pair arrays, ~17 bytes an id, stay in L1/L2)

cdef enum:
    PROBE_AHEAD = 8          # pairs whose slot is asked for ahead of its probe (_look_up_pairs)


cdef inline uint8_t _unit_joins(uint8_t fp, uint8_t fc, int split) noexcept nogil:
    """1 when a unit goes on between two pretokens with flags ``fp`` and ``fc``: neither holds a
    digit and (``SPLIT_HF``) they do not meet inside a run of whitespace."""
    return ((((fp | fc) & PT_NUMERIC) == 0)
            & ((split == SPLIT_UNITS) | ((fp & PT_ENDS_SPACE) == 0) | ((fc & PT_STARTS_SPACE) == 0)))


cdef uint8_t _UNIT_JOIN[2][64]
# _unit_joins as a table: [split][(fp << 3) | fc] (the PT_* flags are 3 bits)
for _split in range(2):
    for _f in range(64):
        _UNIT_JOIN[_split][_f] = _unit_joins(<uint8_t>(_f >> 3), <uint8_t>(_f & 7), _split)

cdef uint8_t _BND_CODE[2][256]
# per split, per ((last id's sides & 15) << 4) | (first id's sides >> 4) of the two ids that meet
# at a pretoken start: bit 0, the pair may join there (a unit goes on, or the ids cannot tell);
# bit 1, the pretoken needs ``_resolve_cuts`` (the ids cannot tell: its bytes are read; or the
# "units" split and a pretoken that starts with a digit: its digit groups)
for _split in range(2):
    for _f in range(256):
        if (_f >> 4) & SIDE_L_UNSURE or _f & (SIDE_R_UNSURE >> 4):
            _BND_CODE[_split][_f] = 3
        else:
            _BND_CODE[_split][_f] = (_UNIT_JOIN[_split][(((_f >> 4) & 7) << 3) | (_f & 7)]
                                     | (2 if _split == SPLIT_UNITS and _f & PT_NUMERIC else 0))


cdef void _look_up_pairs(const XView* v, Stage2Scratch sc, const token_id_t* out, Py_ssize_t lo,
                         Py_ssize_t hi) noexcept nogil:
    """Step 1 of ``_stage_span``: ``_cross`` of every pair ``out[k - 1], out[k]`` for
    ``lo <= k < hi`` (``lo >= 1``), into ``sc.pair_cross[k - lo]`` (0 or 1), ``sc.pair_rank`` and
    ``sc.pair_res`` (rank NO_RANK: no merge; the result is then not set), with few branches on the
    answer: a pass tests every pair against the filter and lists those that pass (no branch), a
    second probes the slots of the listed ones (each asked for ``PROBE_AHEAD`` pairs ahead). About
    40% of pairs are crossable, in no order a branch predictor can learn: one branch on that per
    pair costs more than the lookups."""
    cdef Py_ssize_t k, t, m = 0
    cdef uint64_t key, slot, h
    cdef uint32_t r
    cdef uint8_t* cross = sc.pair_cross.data()
    cdef uint32_t* ranks = sc.pair_rank.data()
    cdef token_id_t* results = sc.pair_res.data()
    cdef int64_t* cand = sc.pair_cand.data()
    cdef uint64_t* keys = sc.pair_key.data()
    # the table's fields as locals: a store through a uint8_t* may alias anything, so the compiler
    # would read them again from ``v`` after each one
    cdef const uint64_t* filt = v.filter
    cdef int fshift = v.fshift
    cdef const CrossSlot* slots = v.slots
    cdef int shift = v.shift
    cdef uint64_t mask = v.mask
    cdef token_id_t res = 0
    if v.all_cross:
        for k in range(lo, hi):
            r = NO_RANK
            cross[k - lo] = _cross(v, out[k - 1], out[k], &r, &res)
            ranks[k - lo] = r
            results[k - lo] = res
        return
    for k in range(lo, hi):
        key = pack_pair(out[k - 1], out[k])
        h = (key * MUL1) >> fshift
        cross[k - lo] = 0
        ranks[k - lo] = NO_RANK
        cand[m] = k
        keys[m] = key
        m += (filt[h >> 6] >> (h & 63)) & 1
    for t in range(min(m, <Py_ssize_t>PROBE_AHEAD)):
        prefetch(&slots[(keys[t] * MUL2) >> shift])
    for t in range(m):
        if t + PROBE_AHEAD < m:
            prefetch(&slots[(keys[t + PROBE_AHEAD] * MUL2) >> shift])
        k = cand[t]
        key = keys[t]
        slot = (key * MUL2) >> shift
        while True:
            if slots[slot].key == key:
                cross[k - lo] = 1
                ranks[k - lo] = slots[slot].rank
                results[k - lo] = slots[slot].res
                break
            if slots[slot].key == EMPTY_KEY:
                break
            slot = (slot + 1) & mask


def _boundary_code(int split, uint8_t last_side, uint8_t first_side):
    """``_BND_CODE`` for the ``Stage2Table.sides`` bytes of the two ids that meet at a pretoken
    start (``split``: 0 "hf", 1 "units"): bit 0, the pair may join there; bit 1, its pretokens'
    bytes are read or its digit groups found (``_resolve_cuts``). For tests.

    >>> _boundary_code(0, 0x00, 0x00), _boundary_code(0, 0x01, 0x00), _boundary_code(0, 0x08, 0x00)
    (1, 0, 3)
    """
    if split not in (SPLIT_HF, SPLIT_UNITS):
        raise ValueError(f"unknown split {split}")
    return _BND_CODE[split][((last_side & 15) << 4) | (first_side >> 4)]


cdef Py_ssize_t _cut_units(const XView* v, Stage2Scratch sc, const token_id_t* out, Py_ssize_t lo,
                           const int64_t* starts, Py_ssize_t j0, Py_ssize_t n, int split) noexcept nogil:
    """Step 2 of ``_stage_span``, what the ids tell: at each pretoken start ``starts[j]``
    (``j0 <= j < n``) the pair is a cut when a unit ends there (``sc.pair_cross[k - lo] &= 0``), read
    from the two ids that meet there (``_BND_CODE`` of their ``Stage2Table.sides``), without a branch.
    Returns how many pretokens it listed in ``sc.todo`` (their indices ``j``) for ``_resolve_cuts``:
    those where the ids cannot tell (their bytes are read) or, with the "units" split, that may be
    cut into digit groups."""
    cdef Py_ssize_t j, k, nt = 0
    cdef uint8_t c
    cdef uint8_t* cross = sc.pair_cross.data()
    cdef int64_t* todo = sc.todo.data()
    cdef const uint8_t* sides = v.sides
    cdef const uint8_t* codes = _BND_CODE[split]
    cdef token_id_t last_side = <token_id_t>(v.n_sides - 1)     # the table's 0xFF pad: "unsure"
    for j in range(j0, n):
        k = starts[j]
        c = codes[((sides[min(out[k - 1], last_side)] & 15) << 4) | (sides[min(out[k], last_side)] >> 4)]
        cross[k - lo] &= c
        todo[nt] = j
        nt += c >> 1
    return nt


cdef int _resolve_cuts(const XView* v, Stage2Scratch sc, int split, const uint8_t* s, Py_ssize_t q,
                       const int64_t* ends, const int64_t* starts, const token_id_t* out,
                       Py_ssize_t lo, Py_ssize_t n_todo, uint8_t* fl) except -1 nogil:
    """The rest of step 2 of ``_stage_span``, for the pretokens ``_cut_units`` listed: where
    the ids that meet at a pretoken's start cannot tell whether a unit ends there, the flags of
    both pretokens are read from their bytes (``fl``: those of the window's previous pretoken,
    carried over for ``j == 0``); with SPLIT_UNITS, a numeric pretoken of several ids is cut into
    digit groups (``_cut_digit_groups``)."""
    cdef Py_ssize_t t, j, k
    cdef uint8_t sa, sb, fc
    cdef uint8_t* cross = sc.pair_cross.data()
    cdef token_id_t last_side = <token_id_t>(v.n_sides - 1)
    for t in range(n_todo):
        j = sc.todo[t]
        k = starts[j]
        sa = v.sides[min(out[k - 1], last_side)]
        sb = v.sides[min(out[k], last_side)]
        if (sa & SIDE_L_UNSURE) | (sb & SIDE_R_UNSURE):
            if j > 0:
                fl[0] = _pretoken_flags(s, ends[j - 2] if j >= 2 else q, ends[j - 1])
            fc = _pretoken_flags(s, ends[j - 1] if j >= 1 else q, ends[j])
            cross[k - lo] &= _UNIT_JOIN[split][(fl[0] << 3) | fc]
        else:
            fc = (sb >> 4) & 7
        if split == SPLIT_UNITS and fc & PT_NUMERIC and starts[j + 1] - k >= 2:
            _cut_digit_groups(v, sc, s, ends[j - 1] if j >= 1 else q, ends[j], out, k, starts[j + 1], cross, lo)
    return 0


cdef int _stage_span(Encoder enc, const XView* v, Stage2Scratch sc, int pattern_id, int split,
                     const uint8_t* s, Py_ssize_t a, Py_ssize_t b, const uint8_t* limit) except -1 nogil:
    """Encode the text ``s[a:b]`` (no special token in it): stage 1 per pretoken, then stage 2.

    Pretokens are scanned ``STAGE_WINDOW`` at a time and their stage-1 ids emitted (the
    ``Encoder`` and its cache). Then, for the window, in passes with few branches on the data:

    1. every pair of neighbouring ids is looked up (``Stage2Table``: crossable, first rank, result;
       ``_look_up_pairs``);
    2. between two pretokens, a crossable pair is a cut when a unit ends there: the flags of both,
       read from the two ids that meet there (``Stage2Table.sides``, one table lookup a pretoken:
       ``_cut_units``), or from the pretokens' bytes where an id cannot tell (a non-ASCII byte at
       that end, a lone space first: ``_resolve_cuts``); ``split`` SPLIT_HF or SPLIT_UNITS, and with
       SPLIT_UNITS the pairs of a numeric pretoken between two digit groups are cuts
       (``_digit_group_cuts``);
    3. the cuts, 64 ids to a bit mask, are visited in order (count trailing zeros), and each segment
       between two cuts is merged and written back, compacted, in place: one id as it is, two ids
       as their pair's lookup says (without a branch), more by ``_merge_segment``.

    The unfinished segment at the end of a window moves down to the written ids before the next
    window's ids are emitted after it (its pairs are looked up again with them when it is short).
    """
    cdef int64_t* ends = enc.ends_buf
    cdef int64_t* starts
    cdef Py_ssize_t p = a, q = a, n, w, seg, lo = 0, hi, first, length, open_at = -1, j0
    cdef Py_ssize_t n_todo
    cdef uint8_t* pr_cross
    cdef token_id_t* out
    cdef uint8_t fl = 0
    cdef bint have_prev = False
    if <Py_ssize_t>sc.starts.size() < ENDS_CAP + 1:
        sc.starts.resize(ENDS_CAP + 1)
    if <Py_ssize_t>sc.todo.size() < ENDS_CAP + 1:
        sc.todo.resize(ENDS_CAP + 1)
    starts = sc.starts.data()
    w = seg = enc.out_n
    while p < b:
        n = _split_ends(pattern_id, s, &p, b, ends, STAGE_WINDOW)
        if n == 0:
            continue
        first = enc.out_n                   # the window's first id (the unfinished segment before it)
        enc._emit_pieces(s, q, ends, n, limit, starts)
        starts[n] = enc.out_n
        out = enc.out_buf
        hi = enc.out_n
        if not have_prev:
            seg = first                     # no pair before the text's first id
            lo = first + 1
            j0 = 1
        else:
            # the unfinished segment's pairs again when it is short (cheap; all of them joined),
            # a long one merges without its pairs' lookups
            lo = seg + 1 if first - seg <= SHORT_SEG else first
            j0 = 0
        if <Py_ssize_t>sc.pair_rank.size() < hi - lo + 1:
            sc.pair_rank.resize(hi - lo + 1)
            sc.pair_res.resize(hi - lo + 1)
            sc.pair_cross.resize(hi - lo + 1)
            sc.pair_cand.resize(hi - lo + 1)
            sc.pair_key.resize(hi - lo + 1)
        pr_cross = sc.pair_cross.data()
        # 1, 2. the lookups and the unit cuts the ids tell
        if hi > lo:
            _look_up_pairs(v, sc, out, lo, hi)
        n_todo = _cut_units(v, sc, out, lo, starts, j0, n, split)
        if not have_prev:                   # the text's first pretoken: no pair before it
            have_prev = True
            if (split == SPLIT_UNITS and starts[1] - starts[0] >= 2
                    and _pretoken_flags(s, q, ends[0]) & PT_NUMERIC):
                _cut_digit_groups(v, sc, s, q, ends[0], out, starts[0], starts[1], pr_cross, lo)
        # 2. the cuts read from the bytes, the digit groups
        if n_todo:
            _resolve_cuts(v, sc, split, s, q, ends, starts, out, lo, n_todo, &fl)
        # the window's last pretoken, for the pair after it (read from its bytes when unsure)
        fl = _pretoken_flags(s, ends[n - 2] if n >= 2 else q, ends[n - 1])
        q = ends[n - 1]
        # 3. the segments, cut by cut
        w = _flush_segments(v, sc, out, lo, hi, seg, w, &seg)
        open_at = seg + 1 - lo              # where the lookups of its pairs are (< 0: not looked up)
        if seg > w:                         # the unfinished segment moves down
            memmove(out + w, out + seg, (hi - seg) * sizeof(token_id_t))
            enc.out_n = w + (hi - seg)
            seg = w
    # the last segment
    out = enc.out_buf
    hi = enc.out_n
    length = hi - seg
    if length <= 0:
        enc.out_n = w
    elif length == 1 or open_at < 0:        # one id, or a long segment (no lookups needed)
        enc.out_n = _merge_segment(v, sc, out, seg, hi, w, sc.pair_rank.data(), sc.pair_res.data())
    else:
        enc.out_n = _merge_segment(v, sc, out, seg, hi, w, sc.pair_rank.data() + open_at,
                                   sc.pair_res.data() + open_at)
    return 0


cdef extern from *:
    """
    #if defined(__SSE2__) || defined(_M_X64)
    #include <emmintrin.h>
    #endif
    /* bit i set where p[i] == 0, for i < n (n <= 64): 16 bytes a compare with SSE2 */
    static inline uint64_t bpe_enc_zero_bytes_mask(const uint8_t* p, Py_ssize_t n) {
        uint64_t bits = 0;
        Py_ssize_t i = 0;
    #if defined(__SSE2__) || defined(_M_X64)
        const __m128i zero = _mm_setzero_si128();
        for (; i + 16 <= n; i += 16) {
            __m128i v = _mm_loadu_si128((const __m128i*)(p + i));
            bits |= (uint64_t)(uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, zero)) << i;
        }
    #endif
        for (; i < n; i++)
            bits |= (uint64_t)(p[i] == 0) << i;
        return bits;
    }
    """
    uint64_t _zero_bytes_mask "bpe_enc_zero_bytes_mask"(const uint8_t* p, Py_ssize_t n) noexcept nogil


cdef Py_ssize_t _flush_segments(const XView* v, Stage2Scratch sc, token_id_t* out, Py_ssize_t lo,
                                Py_ssize_t hi, Py_ssize_t seg, Py_ssize_t w, Py_ssize_t* seg_out) noexcept nogil:
    """Step 3 of ``_stage_span``: merge and write back (at ``out[w:]``) every segment that ends
    before ``hi``: a cut before id ``c`` (``lo <= c < hi``) where ``sc.pair_cross[c - lo]`` is 0.
    ``seg``: where the open segment starts (``lo - 1 <= seg``, or a long one further back).
    Returns the new ``w``; ``seg_out`` gets the start of the segment left open at ``hi``."""
    cdef const uint8_t* cross = sc.pair_cross.data()
    cdef const uint32_t* ranks = sc.pair_rank.data()
    cdef const token_id_t* results = sc.pair_res.data()
    cdef Py_ssize_t k = lo, nb, i, c, length, has
    cdef uint64_t bits
    cdef token_id_t x0, x1, mask
    while k < hi:
        nb = hi - k if hi - k < 64 else 64
        bits = _zero_bytes_mask(cross + (k - lo), nb)
        while bits:
            c = k + ctz64(bits)
            bits &= bits - 1
            length = c - seg
            if length <= 2 and seg + 1 >= lo:
                # one id, or two: the pair's first rank applies or nothing does (out[seg + 1] is
                # read and written back even for one id: it is out[c], or already consumed)
                x0 = out[seg]
                x1 = out[seg + 1]
                has = (length == 2) & (ranks[seg + 1 - lo] != NO_RANK)
                mask = (<token_id_t>0) - <token_id_t>has      # all ones when the pair merges
                out[w] = (results[seg + 1 - lo] & mask) | (x0 & ~mask)
                out[w + 1] = x1
                w += length - has
            elif length == 3 and seg + 1 >= lo:
                w += _merge3(v, out, seg, w, ranks + (seg + 1 - lo), results + (seg + 1 - lo))
            elif seg + 1 >= lo:
                w = _merge_segment(v, sc, out, seg, c, w, ranks + (seg + 1 - lo), results + (seg + 1 - lo))
            else:                           # a long segment from an earlier window
                w = _merge_segment(v, sc, out, seg, c, w, ranks, results)
            seg = c
        k += nb
    seg_out[0] = seg
    return w


cdef int _stage_text(Encoder enc, const XView* v, Stage2Scratch sc, int pattern_id, int split_id,
                     const Specials* sp, const uint8_t* s, Py_ssize_t n_buf) except -1 nogil:
    """Encode the whole text ``s[:n_buf]`` (special tokens ``sp``, may be NULL) after the ids
    already in ``enc``'s buffer (``encode_stage_aware``'s loop: spans between special tokens)."""
    cdef Py_ssize_t pos = 0, ms = 0, me = 0
    cdef token_id_t mid = 0
    cdef bint found
    while pos < n_buf:
        found = sp != NULL and _find_special(sp, s, pos, n_buf, n_buf, &ms, &me, &mid)
        if not found:
            ms = me = n_buf
        if ms > pos:
            _stage_span(enc, v, sc, pattern_id, split_id, s, pos, ms, s + n_buf)
        if found:
            enc._reserve_out(1)
            enc.out_buf[enc.out_n] = mid
            enc.out_n += 1
        pos = me
    return 0


cdef int _split_id(str split, const XView* v) except -1:
    """SPLIT_HF or SPLIT_UNITS for the name ``split`` (ValueError for another, or for "units"
    without token lengths)."""
    if split == "hf":
        return SPLIT_HF
    if split == "units":
        if v.n_lengths == 0:
            raise ValueError("the 'units' split needs a Stage2Table built with token_lengths")
        return SPLIT_UNITS
    raise ValueError(f"the native stage-aware encoder has no split {split!r} (hf, units)")


def encode_stage_aware(Encoder enc not None, Stage2Table stage2 not None, Stage2Scratch scratch not None,
                       object buf not None, int pattern_id, SpecialTable specials,
                       str split="hf"):
    """Encode a whole text with a SuperBPE model (the ``"hf"`` or ``"units"`` stage-2 split; SupraTok's
    is ``"units"``), without the GIL.

    Args:
        enc: an ``Encoder`` over the model's stage-1 merges (its ``RankTable``).
        stage2: a ``Stage2Table`` over the stage-2 ``RankMerger`` (canonical ids).
        scratch: this thread's ``Stage2Scratch``.
        buf: the text (bytes-like, or a ``str``: its UTF-8 with ``surrogateescape``, written into
            ``enc``'s scratch buffer where the ``str`` does not hold it, as ``Encoder.encode_all``
            does); special tokens (``specials``, may be None) become their id and end units.
        pattern_id: the named pattern (``PATTERN_IDS``).
        split: ``"hf"`` or ``"units"`` (which needs ``stage2`` built with ``token_lengths``).

    Returns:
        uint32 ids. Equivalent to ``superbpe.StageAwareEncoder.encode_python`` and
        ``reference.encode_superbpe(..., split=split)``.
    """
    cdef Py_ssize_t n_buf = 0
    cdef const uint8_t* p = NULL
    cdef const Specials* sp = &specials.c if specials is not None else NULL
    cdef XView v = _xview(stage2)
    cdef int split_id
    if pattern_id < 0 or pattern_id > 2:
        raise ValueError(f"unknown pattern id {pattern_id}")
    split_id = _split_id(split, &v)
    keep = _text_in(enc, buf, &p, &n_buf)
    enc.out_n = 0
    try:
        if n_buf:
            with nogil:
                _stage_text(enc, &v, scratch, pattern_id, split_id, sp, p, n_buf)
    finally:
        _text_done(enc)
    return enc._take_out()


def encode_stage_aware_flat(Encoder enc not None, Stage2Table stage2 not None, Stage2Scratch scratch not None,
                            list bufs not None, int pattern_id, SpecialTable specials, str split="hf"):
    """``encode_stage_aware`` of each text of ``bufs`` (UTF-8 buffers: ``bytes``, ``utf8_of``'s
    views), back to back in one array: ``(ids, offsets)``, text ``k`` is
    ``ids[offsets[k]:offsets[k + 1]]`` (int64 offsets, ``len(bufs) + 1``). One buffer of ids and one
    array made for the whole run (no array per text), the GIL released once.

    >>> from bpe_core.engine.units import RankMerger
    >>> t = Stage2Table(RankMerger(np.array([32], np.uint32), np.array([97], np.uint32), np.array([256], np.uint32)))
    >>> none = np.zeros(0, np.uint32)
    >>> enc = Encoder(RankTable(none, none, none, np.arange(256, dtype=np.uint32)))
    >>> ids, offs = encode_stage_aware_flat(enc, t, Stage2Scratch(), [b"x a", b"", b" a"], 0, None)
    >>> ids.tolist(), offs.tolist()
    ([120, 256, 256], [0, 2, 2, 3])
    """
    cdef Py_ssize_t n = len(bufs), k
    cdef const Specials* sp = &specials.c if specials is not None else NULL
    cdef XView v = _xview(stage2)
    cdef int split_id
    cdef const uint8_t[::1] mv
    cdef vector[const uint8_t*] ptrs
    cdef vector[Py_ssize_t] lens
    if pattern_id < 0 or pattern_id > 2:
        raise ValueError(f"unknown pattern id {pattern_id}")
    split_id = _split_id(split, &v)
    offsets = np.empty(n + 1, dtype=np.int64)
    cdef int64_t[::1] offs = offsets
    ptrs.resize(n)
    lens.resize(n)
    held = []                           # the views stay open while their bytes are read
    for k in range(n):
        mv = bufs[k]
        held.append(mv)
        lens[k] = mv.shape[0]
        ptrs[k] = &mv[0] if mv.shape[0] else NULL
    enc.out_n = 0
    with nogil:
        for k in range(n):
            offs[k] = enc.out_n
            if lens[k]:
                _stage_text(enc, &v, scratch, pattern_id, split_id, sp, ptrs[k], lens[k])
        offs[n] = enc.out_n
    return enc._take_out(), offsets
