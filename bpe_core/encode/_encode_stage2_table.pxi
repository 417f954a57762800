# _encode.pyx, part 7 of 10 (``include``d: compiled into the module as if written there).
# Stage-aware encoding (SuperBPE), part one: UTF-8 characters, pretoken flags and the stage-2
# table (Stage2Table).

# ==== Stage-aware encoding (SuperBPE) ===========================================================
# A SuperBPE model encodes in two stages: stage-1 merges inside pretokens (the Encoder above, with
# its cache), then stage-2 merges inside units, runs of pretokens cut at hard boundaries. This is
# the "hf" and "units" splits of ``methods/superbpe`` (SupraTok's is "units") for a whole text in
# one call: its plain twins are ``StageAwareEncoder.encode_python`` (numpy + RankMerger per
# document) and ``reference.encode_superbpe``.

cdef enum:
    SHORT_SEG = 32          # longest segment merged by _merge_short; longer ones: RankMerger._merge

cdef enum:
    SPLIT_HF = 0            # units end at numeric pretokens and inside runs of whitespace
    SPLIT_UNITS = 1         # units end at numeric pretokens, cut inside into digit groups

cdef enum:
    PT_NUMERIC = 1          # the pretoken holds a \p{N}
    PT_STARTS_SPACE = 2     # its first character is \s
    PT_ENDS_SPACE = 4       # its last character is \s


cdef inline Py_ssize_t _utf8_char(const uint8_t* s, Py_ssize_t i, Py_ssize_t n, uint32_t* cp) noexcept nogil:
    """Decode the character at ``s[i]`` (``i < n``) as Python's strict UTF-8 decoder would; returns
    its length. An invalid byte is one character of its own, a surrogate (``surrogateescape``)."""
    cdef uint8_t b0 = s[i], b1, b2, b3
    cdef uint8_t lo = 0x80, hi = 0xBF
    if b0 < 0x80:
        cp[0] = b0
        return 1
    cp[0] = 0xDC00 | b0
    if b0 >= 0xC2 and b0 <= 0xDF:
        if i + 1 < n and (s[i + 1] & 0xC0) == 0x80:
            cp[0] = ((b0 & 0x1F) << 6) | (s[i + 1] & 0x3F)
            return 2
        return 1
    if b0 >= 0xE0 and b0 <= 0xEF:
        if b0 == 0xE0:
            lo = 0xA0
        elif b0 == 0xED:
            hi = 0x9F
        if i + 2 < n:
            b1 = s[i + 1]
            b2 = s[i + 2]
            if b1 >= lo and b1 <= hi and (b2 & 0xC0) == 0x80:
                cp[0] = ((b0 & 0x0F) << 12) | ((b1 & 0x3F) << 6) | (b2 & 0x3F)
                return 3
        return 1
    if b0 >= 0xF0 and b0 <= 0xF4:
        if b0 == 0xF0:
            lo = 0x90
        elif b0 == 0xF4:
            hi = 0x8F
        if i + 3 < n:
            b1 = s[i + 1]
            b2 = s[i + 2]
            b3 = s[i + 3]
            if b1 >= lo and b1 <= hi and (b2 & 0xC0) == 0x80 and (b3 & 0xC0) == 0x80:
                cp[0] = ((b0 & 0x07) << 18) | ((b1 & 0x3F) << 12) | ((b2 & 0x3F) << 6) | (b3 & 0x3F)
                return 4
    return 1


cdef uint8_t _ASCII_FLAGS[128]
# per ASCII byte (0 for the others): the PT_* flags it gives as a pretoken's first character
# (PT_NUMERIC, PT_STARTS_SPACE = 2: ``_pretoken_flags`` shifts it onto PT_NUMERIC) and last one
# (PT_ENDS_SPACE), and 1 for a digit (the second character after a space)
cdef uint8_t _PT_FIRST[256]
cdef uint8_t _PT_LAST[256]
cdef uint8_t _PT_DIGIT[256]
for _c in range(256):
    _PT_FIRST[_c] = _PT_LAST[_c] = _PT_DIGIT[_c] = 0
for _c in range(128):
    _ASCII_FLAGS[_c] = bpe_ut_flags(_c) & (BPE_UT_N | BPE_UT_S)
    _PT_FIRST[_c] = (PT_NUMERIC if _ASCII_FLAGS[_c] & BPE_UT_N else 0) | (PT_STARTS_SPACE if _ASCII_FLAGS[_c] & BPE_UT_S else 0)
    _PT_LAST[_c] = PT_ENDS_SPACE if _ASCII_FLAGS[_c] & BPE_UT_S else 0
    _PT_DIGIT[_c] = 1 if _ASCII_FLAGS[_c] & BPE_UT_N else 0


cdef inline uint16_t _char_flags(const uint8_t* s, Py_ssize_t i, Py_ssize_t e, Py_ssize_t* k) noexcept nogil:
    """``bpe_ut_flags`` of the character at ``s[i]`` (``i < e``); ``k`` gets its length."""
    cdef uint32_t cp
    if s[i] < 0x80:
        k[0] = 1
        return _ASCII_FLAGS[s[i]]
    k[0] = _utf8_char(s, i, e, &cp)
    return bpe_ut_flags(cp)


cdef inline uint8_t _pretoken_flags(const uint8_t* s, Py_ssize_t a, Py_ssize_t e) noexcept nogil:
    """PT_* flags of the pretoken ``s[a:e]`` (``a < e``) of a named pattern, as ``superbpe.word_flags``
    (``_pretoken_flags_any``); inline and without a branch on the text for what English is made
    of: a pretoken whose first and last bytes are ASCII (each a character of its own), and whose
    second byte is ASCII too when the first is whitespace (the digit that may follow it)."""
    cdef uint8_t c0 = s[a], c1 = s[a + (e - a > 1)], cl = s[e - 1]
    cdef uint8_t t0 = _PT_FIRST[c0]
    if ((c0 | cl) < 0x80) & ((c1 < 0x80) | ((t0 & PT_STARTS_SPACE) == 0)):
        return t0 | _PT_LAST[cl] | ((t0 >> 1) & _PT_DIGIT[c1] & (e - a > 1))
    return _pretoken_flags_any(s, a, e)


cdef uint8_t _pretoken_flags_any(const uint8_t* s, Py_ssize_t a, Py_ssize_t e) noexcept nogil:
    """PT_* flags of the pretoken ``s[a:e]`` (``a < e``) of a named pattern, as ``superbpe.word_flags``.

    In the named patterns (gpt2, cl100k, o200k) a pretoken that holds a digit is `` ?\p{N}+`` or
    ``\p{N}{1,3}``: a digit is its first character or follows a leading space, so two characters
    are read (tested against the whole-pretoken check of the plain path).
    """
    cdef uint8_t f = 0
    cdef Py_ssize_t k, j
    cdef uint16_t u = _char_flags(s, a, e, &k)
    if u & BPE_UT_N:
        f |= PT_NUMERIC
    if u & BPE_UT_S:
        f |= PT_STARTS_SPACE
        if a + k < e and (_char_flags(s, a + k, e, &j) & BPE_UT_N):
            f |= PT_NUMERIC
    if a + k >= e:                           # one character
        if u & BPE_UT_S:
            f |= PT_ENDS_SPACE
        return f
    # the last character: back over continuation bytes (at most 3) to a start that decodes to the end
    j = e - 1
    if s[j] < 0x80:
        if _ASCII_FLAGS[s[j]] & BPE_UT_S:
            f |= PT_ENDS_SPACE
        return f
    while j > a and j > e - 4 and (s[j] & 0xC0) == 0x80:
        j -= 1
    if _char_flags(s, j, e, &k) & BPE_UT_S and j + k == e:
        f |= PT_ENDS_SPACE
    return f


def _first_last_sets(lefts, rights, results):
    """Per id made by a merge: the ids a sequence that merges into it can start with (``first``) and
    end with (``last``), itself included (an id not in the dicts: only itself).

    A fixed point over the merges (the same id can be made by several merges, also after it is used).

    >>> f, l = _first_last_sets([1, 5], [2, 3], [5, 6])       # (1,2)->5, (5,3)->6
    >>> sorted(f[6]), sorted(l[6])
    ([1, 5, 6], [3, 6])
    """
    first: dict = {}
    last: dict = {}
    changed = True
    while changed:
        changed = False
        for a, b, c in zip(lefts, rights, results):
            fc = first.setdefault(c, {c})
            fa = first.get(a, (a,))
            if not fc.issuperset(fa):
                fc.update(fa)
                changed = True
            lc = last.setdefault(c, {c})
            lb = last.get(b, (b,))
            if not lc.issuperset(lb):
                lc.update(lb)
                changed = True
    return first, last


cdef enum:
    # ``Stage2Table.sides``: what a stage-1 id tells of the pretoken it ends (low half) or starts
    # (high half), for the unit cut between two pretokens (``_UNIT_JOIN``'s flags)
    SIDE_L_UNSURE = 8       # its last byte is not ASCII: read the pretoken's bytes
    SIDE_R_UNSURE = 0x80    # its first byte is not ASCII, or it is one whitespace character (a digit
                            # may follow in the same pretoken), or whitespace then a non-ASCII byte


def _id_sides(token_bytes):
    """Per token id, one byte: as the last id of a pretoken (bits 0-3), its PT_NUMERIC and
    PT_ENDS_SPACE flags or SIDE_L_UNSURE; as the first id (bits 4-7, shifted), its PT_NUMERIC and
    PT_STARTS_SPACE flags or SIDE_R_UNSURE (``_pretoken_flags`` of the pretoken, read from the id).

    In the named patterns a pretoken that holds a digit is `` ?\p{N}+`` or ``\p{N}{1,3}``: it
    starts with a digit or a space and a digit, and ends with a digit; an ASCII byte is a whole
    character. So an id whose last byte is ASCII gives its pretoken's last character (ENDS_SPACE)
    and whether it holds a digit; an id whose first two bytes are ASCII (or whose first is ASCII and
    not whitespace) gives its first character and whether a digit is first or follows the space.

    >>> s = _id_sides({0: b" 1", 1: b" ", 2: b"ab ", 3: "é".encode(), 4: b"7"})
    >>> [(int(v) & 15, int(v) >> 4) for v in s]       # (as last: 1 digit, 4 ends space, 8 unsure; as first: 1, 2 starts space, 8)
    [(1, 3), (4, 8), (4, 0), (8, 8), (1, 1)]
    """
    items = token_bytes.items() if isinstance(token_bytes, dict) else enumerate(token_bytes)
    pairs = [(int(i), bytes(b)) for i, b in items]
    sides = np.full(max((i for i, _ in pairs), default=-1) + 1, SIDE_L_UNSURE | SIDE_R_UNSURE, dtype=np.uint8)
    cdef uint8_t left, right, c0, c1, cl
    for i, b in pairs:
        if not b:
            continue
        cl = b[len(b) - 1]
        if cl < 0x80:
            left = (PT_NUMERIC if _ASCII_FLAGS[cl] & BPE_UT_N else 0) | (PT_ENDS_SPACE if _ASCII_FLAGS[cl] & BPE_UT_S else 0)
        else:
            left = SIDE_L_UNSURE
        c0 = b[0]
        if c0 >= 0x80:
            right = SIDE_R_UNSURE >> 4
        elif not (_ASCII_FLAGS[c0] & BPE_UT_S):
            right = PT_NUMERIC if _ASCII_FLAGS[c0] & BPE_UT_N else 0
        elif len(b) >= 2 and b[1] < 0x80:
            c1 = b[1]
            right = PT_STARTS_SPACE | (PT_NUMERIC if _ASCII_FLAGS[c1] & BPE_UT_N else 0)
        else:
            right = SIDE_R_UNSURE >> 4
        sides[i] = left | (right << 4)
    return sides


cdef class Stage2Table:
    """The stage-2 merges of a SuperBPE model, with the pairs of ids that a stage-2 merge can join.

    Merging a sequence by rank (``RankMerger.merge``) only ever joins two neighbours ``x, y`` when
    ``(x, y)`` is *crossable*: some merge ``(l, r)`` has ``x`` among the ids a sequence merging into
    ``l`` can end with and ``y`` among those a sequence merging into ``r`` can start with
    (``_first_last_sets``). A token covering the ids ``t_i .. t_j`` has ``t_i`` and ``t_j`` in those
    sets (by induction over the merges), so no merge happens across a pair that is not crossable,
    and the merges on either side never see each other (a merge is decided by its own neighbours and
    its rank). A sequence therefore merges as its segments, cut at every pair that is not crossable,
    merge one by one: ``merge(seq) == concat(merge(seg) for seg in segments)`` (tested).

    Every merge's own pair is crossable (``l`` ends ``l``), so the table also gives each merge's
    first rank and result: ``_merge_short`` merges a short segment from it alone.

    Args:
        merger: the stage-2 ``RankMerger``.
        all_cross: treat every pair as crossable (no cuts: a unit is one segment, merged through
            ``merger``); also used when the crossable pairs would be more than ``max_pairs``
            (default ``max(2**20, 16 * merges)``).
        token_lengths: the byte length of every token id (the ``"units"`` split needs them to
            find digit groups inside a numeric pretoken).
        token_bytes: the bytes of every token id (a ``{id: bytes}`` dict or a sequence), for the
            unit cuts between two pretokens read from the ids that meet there (``_id_sides``);
            without them every cut is read from the text's bytes (the same cuts).

    >>> from bpe_core.engine.units import RankMerger
    >>> m = RankMerger(np.array([1, 5], np.uint32), np.array([2, 3], np.uint32), np.array([5, 6], np.uint32))
    >>> t = Stage2Table(m)                                   # (1, 2) -> 5, (5, 3) -> 6
    >>> t.lookup(1, 2), t.lookup(5, 3), t.lookup(2, 3), t.lookup(3, 1)   # 2-3: inside 1 2 3 -> 6
    ((True, 0, 5), (True, 1, 6), (True, None, None), (False, None, None))
    """

    def __init__(self, RankMerger merger not None, bint all_cross=False, Py_ssize_t max_pairs=-1,
                 token_lengths=None, token_bytes=None):
        cdef uint64_t cap = 16, slot, key
        cdef Py_ssize_t slot_i
        cdef int64_t r
        cdef uint32_t out = 0
        cdef CrossSlot empty
        cdef uint64_t h
        if merger.n_merges >= LATER_RANKS:
            raise ValueError("too many stage-2 merges")
        self.merger = merger
        if token_lengths is not None:
            self.lengths = np.ascontiguousarray(token_lengths, dtype=np.uint32)
        # one more entry than ids, 0xFF ("unsure": the bytes are read): the encoder reads
        # ``sides[min(id, len - 1)]`` (an id without bytes, or no token_bytes at all)
        sides = _id_sides(token_bytes) if token_bytes is not None else np.zeros(0, np.uint8)
        self.sides = np.append(sides, np.uint8(SIDE_L_UNSURE | SIDE_R_UNSURE))
        rank_pairs = []
        for slot_i in range(<Py_ssize_t>merger.keys.size()):
            key = merger.keys[slot_i]
            if key == EMPTY_KEY:
                continue
            r = merger.ranks[slot_i]
            while r >= 0:
                rank_pairs.append((r, int(key >> 32), int(key & 0xFFFFFFFFu), int(merger.res_of_rank[r])))
                r = merger.later[r]
        rank_pairs.sort()
        lefts = [a for _, a, _, _ in rank_pairs]
        rights = [b for _, _, b, _ in rank_pairs]
        results = [c for _, _, _, c in rank_pairs]
        if max_pairs < 0:
            max_pairs = max(1 << 20, 16 * len(lefts))
        pairs = set()
        if not all_cross:
            first, last = _first_last_sets(lefts, rights, results)
            total = 0
            for a, b in zip(lefts, rights):
                total += len(last.get(a, (a,))) * len(first.get(b, (b,)))
                if total > max_pairs:
                    all_cross = True
                    break
            if not all_cross:
                for a, b in zip(lefts, rights):
                    for x in last.get(a, (a,)):
                        for y in first.get(b, (b,)):
                            pairs.add((x << 32) | y)
        self.all_cross = all_cross
        self.n_cross = len(pairs)
        # at most 1/3 full (16-byte slots, 48 bytes a pair): a pair is found at its first slot ~85%
        # of the time (2/3 full: ~2 slots a hit, and a probe loop whose length a branch predictor
        # cannot guess took ~40% of the stage-2 scan's time)
        self.shift = 60
        while cap < <uint64_t>(3 * len(pairs) + 3):
            cap <<= 1
            self.shift -= 1
        self.mask = cap - 1
        empty.key = EMPTY_KEY
        empty.res = 0
        empty.rank = NO_RANK
        self.slots.assign(cap, empty)
        # the filter: one bit per pair hash (a one-hash Bloom filter), about 12 bits per pair (~8%
        # false hits), 2**12 .. 2**18 bits (0.5 .. 32 KiB, so it stays in L1): a test is a multiply,
        # a shift and one load, with no branch (three bits of one word cost twice the instructions)
        fbits = 12
        while fbits < 18 and (1 << fbits) < 12 * len(pairs):
            fbits += 1
        self.fshift = 64 - fbits
        self.filter.assign((1 << fbits) // 64, 0)
        for key in pairs:
            h = (key * MUL1) >> self.fshift
            self.filter[h >> 6] |= (<uint64_t>1) << (h & 63)
            slot = (key * MUL2) >> self.shift
            while self.slots[slot].key != EMPTY_KEY:
                slot = (slot + 1) & self.mask
            self.slots[slot].key = key
            r = merger._rank(<uint32_t>(key >> 32), <uint32_t>(key & 0xFFFFFFFFu), -1, &out)
            if r >= 0:
                self.slots[slot].res = out
                self.slots[slot].rank = <uint32_t>r
                if merger.later[r] >= 0:
                    self.slots[slot].rank |= LATER_RANKS

    def lookup(self, token_id_t a, token_id_t b):
        """``(crossable, first rank, result)`` of the pair (rank and result None: no merge)."""
        cdef XView v = _xview(self)
        cdef token_id_t res = 0
        cdef uint32_t r = NO_RANK
        cdef bint c = _cross(&v, a, b, &r, &res)
        return bool(c), (None if r == NO_RANK else int(r)), (None if r == NO_RANK else int(res))

    def digit_group_cuts(self, const uint8_t[::1] pretoken not None, ids):
        """Where the ``"units"`` split cuts a numeric pretoken between its stage-1 ``ids`` (their
        indices), as the encoder does (``_digit_group_cuts``). Equals ``superbpe.words.numeric_cuts``
        on the ids' byte lengths (for tests); needs ``token_lengths``."""
        arr = np.array(ids, dtype=np.uint32, copy=True)
        cdef uint32_t[::1] v = arr
        cdef Stage2Scratch sc = Stage2Scratch()
        cdef XView x = _xview(self)
        cdef Py_ssize_t t, n = v.shape[0]
        if x.n_lengths == 0:
            raise ValueError("a Stage2Table without token_lengths")
        if n == 0 or pretoken.shape[0] == 0:
            return []
        _digit_group_cuts(&x, sc, &pretoken[0], 0, pretoken.shape[0], &v[0], n)
        return [t for t in range(1, n) if sc.inner_cut[t] != 0]

    def merge(self, ids):
        """Merge one sequence segment by segment, as the encoder does (``_merge_segment``); a new
        uint32 array. Equals ``RankMerger.merge`` (for tests)."""
        arr = np.array(ids, dtype=np.uint32, copy=True)
        cdef uint32_t[::1] v = arr
        cdef Stage2Scratch sc = Stage2Scratch()
        cdef XView x = _xview(self)
        cdef Py_ssize_t n = v.shape[0], k, seg = 0, w = 0
        cdef uint32_t seg_rk[SHORT_SEG]
        cdef token_id_t seg_rs[SHORT_SEG]
        cdef uint32_t r = NO_RANK
        cdef token_id_t res = 0
        if n == 0:
            return arr
        with nogil:
            for k in range(1, n + 1):
                if k < n and _cross(&x, v[k - 1], v[k], &r, &res):
                    if k - seg - 1 < SHORT_SEG:
                        seg_rk[k - seg - 1] = r
                        seg_rs[k - seg - 1] = res
                else:
                    w = _merge_segment(&x, sc, &v[0], seg, k, w, seg_rk, seg_rs)
                    seg = k
        return arr[:w].copy()
