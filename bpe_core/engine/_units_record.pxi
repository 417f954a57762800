# _units.pyx, part 4 of 9 (``include``d: compiled into the module as if written there).
# The units from the counting pass's record (id_unit_stream, record_rows); the lists lent to numpy, and the
# unit writer (UnitState, _emit, ...) the scan uses too.

cdef class _IdList:
    """A ``vector[uint32_t]`` lent to numpy as an array's memory (buffer protocol, format ``I``)."""
    cdef vector[uint32_t] v
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        self.shape[0] = <Py_ssize_t>self.v.size()
        lend_u32(buffer, self, self.v.data() if self.v.size() > 0 else NULL, self.shape, self.strides)

    def __releasebuffer__(self, Py_buffer* buffer):
        pass

    def array(self):
        return np.frombuffer(self, dtype=np.uint32)


cdef class _U16List:
    """A ``vector[uint16_t]`` lent to numpy as an array's memory (``_IdList`` for uint16)."""
    cdef vector[uint16_t] v
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        self.shape[0] = <Py_ssize_t>self.v.size()
        lend_items(buffer, self, <void*>self.v.data() if self.v.size() > 0 else NULL, sizeof(uint16_t), b"H",
                   self.shape, self.strides)

    def __releasebuffer__(self, Py_buffer* buffer):
        pass

    def array(self):
        return np.frombuffer(self, dtype=np.uint16)


cdef class _I64List:
    """A ``vector[int64_t]`` lent to numpy as an array's memory (``_IdList`` for int64)."""
    cdef vector[int64_t] v
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        self.shape[0] = <Py_ssize_t>self.v.size()
        lend_items(buffer, self, <void*>self.v.data() if self.v.size() > 0 else NULL, sizeof(int64_t), b"q",
                   self.shape, self.strides)

    def __releasebuffer__(self, Py_buffer* buffer):
        pass

    def array(self):
        return np.frombuffer(self, dtype=np.int64)


cdef object _int64_array(const vector[int64_t]& v):
    """A copy of a vector as an int64 array (unit bounds: small beside the ids, which are lent:
    ``_IdList``; pair counts)."""
    out = np.empty(v.size(), dtype=np.int64)
    cdef int64_t[::1] ov = out
    if v.size() > 0:
        memcpy(&ov[0], v.data(), v.size() * sizeof(int64_t))
    return out


cdef struct UnitState:
    int64_t uw          # words in the open unit (a word may have no tokens)
    size_t rfirst       # the first unit of the current region
    uint8_t prev        # the flags of the word before
    int64_t r_n, r_ws, r_punct, r_alnum, r_digit    # the current region's class counts
    int64_t n_seen, n_kept
    vector[uint8_t]* enc    # NULL: the units of an encoded region get ENCODED_MARK; else 1 here per unit
    vector[uint16_t]* out16 # not NULL: the units go here as uint16 (``id_unit_stream(narrow=True)``)
    # a sample (``chunk_unit_stream(keep_below=)``): a unit stays when the content
    # hash of its word ids (``_hash_ids``, with ENCODED_MARK after them in an encoded region) is below
    # ``keep_below``. ``uh``: the open unit's hash state, word by word. With regions the decision waits
    # for the region's end (the mark is known then): ``rh``/``rn`` hold each listed unit's state and
    # word count since ``rfirst``
    bint sampled
    uint64_t keep_below
    uint64_t uh
    vector[uint64_t]* rh
    vector[int64_t]* rn


cdef inline size_t _out_size(UnitState* st, vector[uint32_t]& ids) noexcept nogil:
    """How many ids the output holds (``st.out16`` when narrow, else ``ids``)."""
    return st.out16.size() if st.out16 != NULL else ids.size()


cdef inline void _out_resize(UnitState* st, vector[uint32_t]& ids, size_t n) noexcept nogil:
    """Cut the output back to ``n`` ids (``st.out16`` when narrow, else ``ids``)."""
    if st.out16 != NULL:
        st.out16.resize(n)
    else:
        ids.resize(n)


cdef inline void _out_move(UnitState* st, vector[uint32_t]& ids, size_t dst, size_t src, size_t n) noexcept nogil:
    """Move ``n`` ids of the output from ``src`` to ``dst`` (memmove: the ranges may overlap)."""
    if st.out16 != NULL:
        memmove(st.out16.data() + dst, st.out16.data() + src, n * sizeof(uint16_t))
    else:
        memmove(ids.data() + dst, ids.data() + src, n * sizeof(uint32_t))


cdef inline void _out_push(UnitState* st, vector[uint32_t]& ids, uint32_t x) noexcept nogil:
    if st.out16 != NULL:
        st.out16.push_back(<uint16_t>x)
    else:
        ids.push_back(x)


cdef inline void _encoded_region(UnitState* st, vector[uint32_t]& ids, vector[int64_t]& bounds) noexcept nogil:
    """The units from ``st.rfirst`` on make a region that looks encoded: marked (``_mark_units``,
    moving them), or flagged in ``st.enc`` (nothing moves)."""
    cdef size_t u, n_units = bounds.size() - 1
    if st.enc == NULL:                       # (never narrow: marks need 32 bits)
        _mark_units(ids, bounds, st.rfirst)
        return
    if st.enc.size() < n_units:
        st.enc.resize(n_units, 0)
    for u in range(st.rfirst, n_units):
        st.enc[0][u] = 1


cdef inline void _unit_word(UnitState* st, vector[uint32_t]& out_ids, vector[int64_t]& out_bounds, uint32_t w,
                            uint8_t f, bint cut_spaces, const int32_t* cls, const uint32_t* seg_sym,
                            const int64_t* seg_off) noexcept nogil:
    """One word of a span (no sample): a numeric word is a unit of its own; with ``cut_spaces`` a unit
    ends between a word ending with whitespace and one starting with it; ``cls`` (the word's five
    class counts, or NULL) turns on regions: a region ends where ``cut_spaces`` cuts, and when it
    looks encoded its units get ``ENCODED_MARK`` (``_mark_units``, in place), or a flag
    (``st.enc``)."""
    if cls != NULL:
        if cut_spaces and (st.prev & 4) and (f & 2) and (st.uw > 0 or out_bounds.size() - 1 > st.rfirst):
            _close_unit(st, out_ids, out_bounds)
            _end_region(st, out_ids, out_bounds,
                        _looks_encoded(st.r_n, st.r_ws, st.r_punct, st.r_alnum, st.r_digit))
            st.rfirst = out_bounds.size() - 1
            st.r_n = st.r_ws = st.r_punct = st.r_alnum = st.r_digit = 0
        st.r_n += cls[0]
        st.r_ws += cls[1]
        st.r_punct += cls[2]
        st.r_alnum += cls[3]
        st.r_digit += cls[4]
    elif cut_spaces and (st.prev & 4) and (f & 2):
        _close_unit(st, out_ids, out_bounds)
    if f & 1:
        _close_unit(st, out_ids, out_bounds)
        if st.sampled:
            st.uh = _hash_step(FNV_OFFSET, w)
        _put_word(st, out_ids, w, seg_sym, seg_off)
        st.uw = 1
        _close_unit(st, out_ids, out_bounds)
    else:
        if st.sampled:
            st.uh = _hash_step(FNV_OFFSET if st.uw == 0 else st.uh, w)
        _put_word(st, out_ids, w, seg_sym, seg_off)
        st.uw += 1
    st.prev = f


cdef inline void _unit_span_end(UnitState* st, vector[uint32_t]& out_ids, vector[int64_t]& out_bounds,
                                bint regions) noexcept nogil:
    """The end of a span: its last unit and region end (marked when it looks encoded)."""
    _close_unit(st, out_ids, out_bounds)
    if regions:
        _end_region(st, out_ids, out_bounds,
                    out_bounds.size() - 1 > st.rfirst and _looks_encoded(st.r_n, st.r_ws, st.r_punct, st.r_alnum,
                                                                         st.r_digit))
        st.rfirst = out_bounds.size() - 1
        st.r_n = st.r_ws = st.r_punct = st.r_alnum = st.r_digit = 0
    st.prev = 0


cdef struct UnitWord:
    uint32_t tok          # where the word's stage-1 tokens start in the segmentation
    uint16_t n_tok        # how many there are
    uint8_t flags         # the word's flags
    uint8_t pad
    int32_t cls[5]        # its five class counts (regions)
    int32_t pad2          # (32 bytes: two words a cache line)


cdef inline uint32_t _word_at(const uint32_t* p, const uint32_t* m, int64_t mn, int64_t k,
                              uint32_t none) noexcept nogil:
    """The word of position ``k`` of a segment: ``p[k]``, or through its map ``m`` (``m[p[k]]``;
    ``none`` when ``p[k]`` is not below the map's ``mn`` entries)."""
    cdef uint32_t x = p[k]
    if m == NULL:
        return x
    return m[x] if x < <uint64_t>mn else none


#: the words of the positions ahead of the loops of ``id_unit_stream``, kept from when they were read
#: (a power of two, above the farthest look-ahead)
DEF AHEAD_RING = 64


cdef struct IdCursor:
    # reads the word of each position of the segments of ``id_unit_stream`` in order (``_cursor_word``)
    const int64_t* sstart       # where each segment starts; one more entry, the end
    const uint32_t* const* sp   # each segment's ids
    const uint32_t* const* mp   # each segment's map (NULL: its ids are word ids)
    const int64_t* mn           # each map's size
    size_t cur                  # the segment of the position read last
    int64_t base, end           # where it starts and ends
    uint32_t none               # the word read for an id not below its map's size (not a word)


cdef inline void _cursor_init(IdCursor* c, vector[int64_t]& sstart, vector[const uint32_t*]& sp,
                              vector[const uint32_t*]& mp, vector[int64_t]& mn, uint32_t none) noexcept nogil:
    c.sstart = sstart.data()
    c.sp = sp.data()
    c.mp = mp.data()
    c.mn = mn.data()
    c.cur = 0
    c.base = 0
    c.end = sstart[1]
    c.none = none


cdef inline uint32_t _cursor_word(IdCursor* c, int64_t j) noexcept nogil:
    """The word at position ``j`` of all the segments (``j`` not before the one read last, and
    below their end): its id, or through its segment's map (``_word_at``)."""
    while j >= c.end:
        c.cur += 1
        c.base = c.end
        c.end = c.sstart[c.cur + 1]
    return _word_at(c.sp[c.cur], c.mp[c.cur], c.mn[c.cur], j - c.base, c.none)


cdef inline void _narrow_close(vector[int64_t]& bounds, size_t* n, int64_t* uw, int64_t* n_seen, int64_t* n_kept,
                               uint64_t uh, bint sampled, bint regions, uint64_t keep_below,
                               vector[uint64_t]& rh, vector[int64_t]& rn) noexcept nogil:
    """``_narrow_units``' end of the open unit (``_close_unit`` on its locals): listed; with a sample
    and no regions listed only when its hash is below ``keep_below`` (else its tokens are taken off,
    ``n`` back to the last bound); with a sample and regions listed with its hash state and word
    count in ``rh``/``rn`` until its region ends (``_narrow_region``)."""
    if uw[0] > 0:
        n_seen[0] += 1
        if not sampled:
            bounds.push_back(n[0])
        elif regions:
            bounds.push_back(n[0])
            rh.push_back(uh)
            rn.push_back(uw[0])
        elif _mix(uh ^ <uint64_t>uw[0]) < keep_below:
            bounds.push_back(n[0])
            n_kept[0] += 1
        else:
            n[0] = <size_t>bounds.back()
        uw[0] = 0


cdef inline void _narrow_region(vector[uint16_t]& out, vector[int64_t]& bounds, vector[uint8_t]& enc,
                                size_t* n, size_t rfirst, bint encoded, bint sampled, uint64_t keep_below,
                                int64_t* n_kept, vector[uint64_t]& rh, vector[int64_t]& rn) noexcept nogil:
    """``_narrow_units``' end of a region (``_end_region`` on its locals): with a sample each unit since
    ``rfirst`` stays when the hash of its word ids (and ``ENCODED_MARK`` when ``encoded``) is below
    ``keep_below``, the kept ones moved left in order; then the units left are flagged when
    ``encoded``."""
    cdef size_t n_units = bounds.size() - 1, u, out_u, nu
    cdef int64_t a, b, pos, cnt
    cdef uint64_t h
    if sampled:
        out_u = rfirst
        pos = bounds[rfirst]
        a = pos
        for u in range(rfirst, n_units):
            b = bounds[u + 1]
            h = rh[u - rfirst]
            cnt = rn[u - rfirst]
            if encoded:
                h = _hash_step(h, _ENCODED_MARK)
                cnt += 1
            if _mix(h ^ <uint64_t>cnt) < keep_below:
                if pos != a:
                    memmove(out.data() + pos, out.data() + a, (b - a) * sizeof(uint16_t))
                pos += b - a
                out_u += 1
                bounds[out_u] = pos
                n_kept[0] += 1
            a = b
        bounds.resize(out_u + 1)
        n[0] = <size_t>pos
        rh.clear()
        rn.clear()
    if encoded:
        nu = bounds.size() - 1
        if enc.size() < nu:
            enc.resize(nu, 0)
        for u in range(rfirst, nu):
            enc[u] = 1


cdef int64_t _narrow_units(IdCursor* ac, int64_t n_ids, const int64_t* brk,
                           int64_t n_brk, const UnitWord* words, int64_t n_words, bint cut_spaces,
                           bint regions, const uint32_t* seg_sym,
                           vector[uint16_t]& out, vector[int64_t]& bounds, vector[uint8_t]& enc,
                           uint64_t keep_below, int64_t* kept) noexcept nogil:
    """``id_unit_stream``'s loop for its common case (stage-1 tokens as uint16, encoded units flagged
    in ``enc``), the state in locals and the output written through a pointer (``out`` comes sized to
    the room hoped for; grown when a word does not fit, cut to size at the end): what ``_unit_word``
    and ``_unit_span_end`` do word by word, in one function. What the loop reads of a word (its
    flags, class counts and where its tokens are) is one record of 32 bytes (``words``): one cache
    miss a pretoken instead of three. A segment with a map (``mp``, not NULL) holds ids into it: each
    position's word is read once, 32 positions ahead (``ac``, at position 0), and kept in a ring
    until the loop comes to it. With a sample (``keep_below`` below 2**64 - 1) the units are drawn as
    the general loop draws them (``_close_unit``, ``_end_region``: ``_narrow_close``,
    ``_narrow_region``): the 1 GB growing-vocabulary corpus at 32k trains on 0.988 of its units, and
    took the general loop, three misses a pretoken. Returns the units seen (``kept``: those kept),
    or -1 at a word id not below ``n_words`` (or an id not below its map's entries)."""
    cdef int64_t k, i, a, b, j, n_seen = 0, uw = 0, n_kept = 0
    cdef int64_t r_n = 0, r_ws = 0, r_punct = 0, r_alnum = 0, r_digit = 0
    cdef size_t n = 0, cap = out.size(), rfirst = 0
    cdef uint16_t* o = out.data()
    cdef const UnitWord* rec
    cdef uint32_t w, ahead
    cdef uint32_t ring[AHEAD_RING]
    cdef uint8_t f, prev = 0
    cdef bint looks
    cdef bint sampled = keep_below != 0xFFFFFFFFFFFFFFFFu
    cdef uint64_t uh = 0
    cdef vector[uint64_t] rh          # with a sample and regions: the listed units' hash states ...
    cdef vector[int64_t] rn           # ... and word counts, since ``rfirst``
    for j in range(min(32, n_ids)):
        ring[j & (AHEAD_RING - 1)] = _cursor_word(ac, j)
    for k in range(n_brk - 1):
        for i in range(brk[k], brk[k + 1]):
            if i + 32 < n_ids:               # the word 32 ahead read, its record asked for (a hint)
                ahead = _cursor_word(ac, i + 32)
                ring[(i + 32) & (AHEAD_RING - 1)] = ahead
                if ahead < n_words:
                    __builtin_prefetch(&words[ahead])
            if i + 12 < n_ids:               # the stage-1 tokens of a word nearer ahead
                ahead = ring[(i + 12) & (AHEAD_RING - 1)]
                if ahead < n_words:
                    __builtin_prefetch(&seg_sym[words[ahead].tok])
            w = ring[i & (AHEAD_RING - 1)]
            if w >= n_words:
                return -1
            rec = &words[w]
            f = rec.flags
            if regions:
                if cut_spaces and (prev & 4) and (f & 2) and (uw > 0 or bounds.size() - 1 > rfirst):
                    # the unit ends, and its region
                    _narrow_close(bounds, &n, &uw, &n_seen, &n_kept, uh, sampled, regions, keep_below, rh, rn)
                    _narrow_region(out, bounds, enc, &n, rfirst,
                                   _looks_encoded(r_n, r_ws, r_punct, r_alnum, r_digit), sampled, keep_below,
                                   &n_kept, rh, rn)
                    rfirst = bounds.size() - 1
                    r_n = r_ws = r_punct = r_alnum = r_digit = 0
                r_n += rec.cls[0]
                r_ws += rec.cls[1]
                r_punct += rec.cls[2]
                r_alnum += rec.cls[3]
                r_digit += rec.cls[4]
            elif cut_spaces and (prev & 4) and (f & 2):
                _narrow_close(bounds, &n, &uw, &n_seen, &n_kept, uh, sampled, regions, keep_below, rh, rn)
            if f & 1:                        # a numeric word is a unit of its own
                _narrow_close(bounds, &n, &uw, &n_seen, &n_kept, uh, sampled, regions, keep_below, rh, rn)
            if sampled:
                uh = _hash_step(FNV_OFFSET if uw == 0 else uh, w)
            a = rec.tok
            b = a + rec.n_tok
            if n + <size_t>(b - a) > cap:
                out.resize(max(2 * cap, n + <size_t>(b - a)) + 1024)
                cap = out.size()
                o = out.data()
            for j in range(a, b):
                o[n] = <uint16_t>seg_sym[j]
                n += 1
            uw += 1
            if f & 1:
                _narrow_close(bounds, &n, &uw, &n_seen, &n_kept, uh, sampled, regions, keep_below, rh, rn)
            prev = f
        # the end of a span: its last unit and region end
        _narrow_close(bounds, &n, &uw, &n_seen, &n_kept, uh, sampled, regions, keep_below, rh, rn)
        if regions:
            looks = bounds.size() - 1 > rfirst and _looks_encoded(r_n, r_ws, r_punct, r_alnum, r_digit)
            _narrow_region(out, bounds, enc, &n, rfirst, looks, sampled, keep_below, &n_kept, rh, rn)
            rfirst = bounds.size() - 1
            r_n = r_ws = r_punct = r_alnum = r_digit = 0
        prev = 0
    out.resize(n)
    kept[0] = n_kept if sampled else n_seen
    return n_seen


def id_unit_stream(ids, const int64_t[::1] breaks, const uint8_t[::1] flags,
                   bint cut_spaces=False, const int32_t[:, ::1] word_classes=None,
                   const uint32_t[::1] seg_symbols=None, const int64_t[::1] seg_offsets=None,
                   int64_t reserve=0, bint marks=True, bint narrow=False,
                   uint64_t keep_below=0xFFFFFFFFFFFFFFFFu, maps=None):
    """The units of text given as word ids (rows of the word table) instead of bytes: span ``k`` is
    ``ids[breaks[k]:breaks[k+1]]`` (the pretokens of the text between two special tokens, in order).
    Returns ``(ids, bounds, n_seen, n_kept)``: what ``chunk_unit_stream`` lists (with the same
    ``keep_below``, the same sample) for the same spans (``flags``, ``cut_spaces``, ``word_classes`` and the segmentation as there).

    >>> ids, bounds, seen, kept = id_unit_stream(np.array([0, 1, 0], np.uint32), np.array([0, 3]),
    ...                                          np.zeros(2, np.uint8))
    >>> ids.tolist(), bounds.tolist(), seen, kept
    ([0, 1, 0], [0, 3], 1, 1)

    ``reserve``: about how many ids the output will hold (with a segmentation, more than the input's):
    the room is asked for at once (address space: pages are touched as written), so the output does
    not grow by copies, each into fresh pages. A hint only; 0: the input's size.

    ``marks=False``: the units of a region that looks encoded do not end with ``ENCODED_MARK``; a
    fifth value says which units they are (bool per unit), so no one has to take the marks off
    again (``strip_marks`` moves every unit after the first mark).

    ``ids`` may also be a list of uint32 arrays, read as one after the other (the record's chunks,
    rewritten to rows in place: no copy of them into one array); ``breaks`` are positions in that
    sequence.

    ``narrow=True`` (with ``marks=False`` and every id written below 65536: stage-1 tokens of a
    vocabulary under 64 Ki): the output is uint16, half the bytes to write and for stage 2 to read
    (the same values; ``ValueError`` when an id does not fit). With a segmentation it takes its own
    loop (``_narrow_units``: one 32-byte record a word, made for the call); with a sample too, unless
    those records would take more than the units' room (``reserve``, 2 bytes a token): then the
    general loop (the same units).

    ``keep_below``: a sample, as ``chunk_unit_stream(keep_below=)`` draws it (a unit stays when the
    hash of its word ids, with ``ENCODED_MARK`` in a region that looks encoded, is below it).

    ``maps`` (a list of uint32 arrays, one per array of ``ids``; an entry may be None): the ids of an
    array with a map are indices into it, and the map gives their word ids (``maps[j][ids[j]]``):
    the record's chunks as counted, each with the table row of each of its own words, read without
    a pass that rewrites them. ``ValueError`` when an id is not below its map's size.

    >>> id_unit_stream([np.array([1, 0], np.uint32), np.array([0], np.uint32)], np.array([0, 3]),
    ...                np.zeros(3, np.uint8), maps=[np.array([2, 0], np.uint32), None])[0].tolist()
    [0, 2, 0]

    Plain equivalent: ``chunk_unit_stream`` over the text the ids came from (tested equal).
    """
    cdef Py_ssize_t k, i, n_words = flags.shape[0]
    cdef const uint32_t* seg_sym = NULL
    cdef const int64_t* seg_off = NULL
    cdef bint regions = word_classes is not None
    cdef uint32_t w
    # the ids as segments: their data and where each starts in the whole sequence
    cdef vector[const uint32_t*] sp
    cdef vector[int64_t] sstart
    cdef vector[const uint32_t*] mp     # each segment's map (NULL: its ids are word ids)
    cdef vector[int64_t] mn
    cdef const uint32_t[::1] view
    cdef const uint32_t[::1] mview
    cdef int64_t n_ids = 0
    arrays = ids if isinstance(ids, (list, tuple)) else [ids]
    if maps is not None and len(maps) != len(arrays):
        raise ValueError("maps must have one entry per array of ids")
    for j, a in enumerate(arrays):
        view = a
        sp.push_back(&view[0] if view.shape[0] > 0 else &_NO_SEG)
        sstart.push_back(n_ids)
        n_ids += view.shape[0]
        mp.push_back(NULL)
        mn.push_back(0)
        if maps is not None and maps[j] is not None:
            mview = maps[j]
            for i in range(mview.shape[0]):
                if mview[i] >= <uint64_t>flags.shape[0]:
                    raise ValueError(f"a map's word id is not below the {flags.shape[0]} words of the table")
            mp[j] = &mview[0] if mview.shape[0] > 0 else &_NO_SEG
            mn[j] = mview.shape[0]
    sstart.push_back(n_ids)
    sp.push_back(&_NO_SEG)
    mp.push_back(NULL)
    mn.push_back(0)
    if breaks.shape[0] < 1 or breaks[0] != 0 or breaks[breaks.shape[0] - 1] != n_ids:
        raise ValueError("breaks must start at 0 and end at len(ids)")
    for k in range(breaks.shape[0] - 1):
        if breaks[k + 1] < breaks[k]:
            raise ValueError("breaks must be non-decreasing")
    if regions and (word_classes.shape[0] != n_words or word_classes.shape[1] != 5):
        raise ValueError("word_classes must have one row of 5 per word")
    if (seg_symbols is None) != (seg_offsets is None):
        raise ValueError("seg_symbols and seg_offsets go together")
    if seg_symbols is not None:
        if seg_offsets.shape[0] != n_words + 1:
            raise ValueError("seg_offsets must have one entry per word, plus one")
        seg_off = &seg_offsets[0]
        seg_sym = &seg_symbols[0] if seg_symbols.shape[0] > 0 else &_NO_SEG
    cdef vector[uint32_t] out_ids
    cdef vector[int64_t] out_bounds
    cdef UnitState st
    cdef bint bad = False
    cdef vector[uint8_t] enc
    cdef vector[uint16_t] out16
    cdef uint32_t widest = 0
    if narrow:
        if marks:
            raise ValueError("narrow units need marks=False (marks take 32 bits)")
        if seg_symbols is not None:
            for k in range(seg_symbols.shape[0]):
                if seg_symbols[k] > widest:
                    widest = seg_symbols[k]
        elif n_words > 0:
            widest = <uint32_t>(n_words - 1)
        if widest > 0xFFFF:
            raise ValueError(f"narrow units: id {widest} does not fit 16 bits")
    cdef vector[uint64_t] region_hashes
    cdef vector[int64_t] region_words
    memset(&st, 0, sizeof(UnitState))
    if not marks:
        st.enc = &enc
    st.keep_below = keep_below
    st.sampled = keep_below != 0xFFFFFFFFFFFFFFFFu
    if st.sampled and regions:      # the sample of a region's units waits for its end
        st.rh = &region_hashes
        st.rn = &region_words
    if narrow:
        st.out16 = &out16
        out16.reserve(max(reserve, n_ids) + 16)
    else:
        out_ids.reserve(max(reserve, n_ids) + 16)
    out_bounds.push_back(0)
    cdef int64_t fast_seen = 0
    cdef uint32_t none = <uint32_t>(n_words if n_words < <Py_ssize_t>0xFFFFFFFFLL else <Py_ssize_t>0xFFFFFFFFLL)
    cdef IdCursor ac                    # the position ahead whose word is read (``_cursor_word``)
    cdef uint32_t ring[AHEAD_RING]      # the words read ahead, by position
    _cursor_init(&ac, sstart, sp, mp, mn, none)
    cdef vector[UnitWord] uwords
    cdef int64_t fast_kept = 0
    cdef bint fits = narrow and seg_off != NULL and seg_off[n_words] <= <int64_t>0xFFFFFFFF
    # the narrow loop's output is sized (and its pages touched) at once: for the room hoped for, and
    # with a sample for the tokens the sample keeps (``reserve``), not one a pretoken of the input (at
    # a sample of 0.36 that held twice the tokens listed until stage 2 cut them)
    cdef int64_t room = reserve if (st.sampled and reserve > 0) else max(reserve, n_ids)
    # A sample is drawn where stage 2's budget cannot hold all the units: there the words' records
    # (32 bytes a word of the table, per call) must not cost more than the units it writes (2 bytes
    # a token of ``room``), so the listing stays far inside the share the sample was sized for (32
    # bytes a token); the 1 GB corpus (0.988) takes the narrow loop, 60 MB under 250M (0.36) and the
    # 15 GB corpus under 2 GB (18.5 M words) the general loop as before.
    if st.sampled and <uint64_t>n_words * sizeof(UnitWord) > <uint64_t>room * sizeof(uint16_t):
        fits = False
    if fits:
        uwords.resize(n_words)
        with nogil:
            for k in range(n_words):
                if seg_off[k + 1] - seg_off[k] > 0xFFFF:
                    fits = False
                    break
                uwords[k].tok = <uint32_t>seg_off[k]
                uwords[k].n_tok = <uint16_t>(seg_off[k + 1] - seg_off[k])
                uwords[k].flags = flags[k]
                for i in range(5):
                    uwords[k].cls[i] = word_classes[k, i] if regions else 0
    if fits:
        # the common case (stage 2's units from the record): one function, the same units (tested)
        out16.resize(room + 16)
        with nogil:
            fast_seen = _narrow_units(&ac, n_ids, &breaks[0], breaks.shape[0], uwords.data(), n_words,
                                      cut_spaces,
                                      regions, seg_sym, out16, out_bounds, enc, keep_below, &fast_kept)
        if fast_seen < 0:
            raise ValueError(f"a word id is not below the {n_words} words of the table")
        st.n_seen = fast_seen
        st.n_kept = fast_kept
    else:
        with nogil:
            for i in range(min(16, n_ids)):
                ring[i & (AHEAD_RING - 1)] = _cursor_word(&ac, i)
            for k in range(breaks.shape[0] - 1):
                for i in range(breaks[k], breaks[k + 1]):
                    if i + 16 < n_ids:               # the word 16 ahead read, its rows asked for (hints)
                        w = _cursor_word(&ac, i + 16)
                        ring[(i + 16) & (AHEAD_RING - 1)] = w
                        if w < n_words:
                            if regions:
                                __builtin_prefetch(&word_classes[w, 0])
                            if seg_off != NULL:
                                __builtin_prefetch(&seg_off[w])
                    # the stage-1 tokens of a word nearer ahead: its offset was asked for 12 words ago
                    # (the tokens were the loop's main miss: 7 MB of them at 32k on en_train)
                    if seg_off != NULL and i + 4 < n_ids:
                        w = ring[(i + 4) & (AHEAD_RING - 1)]
                        if w < n_words:
                            __builtin_prefetch(&seg_sym[seg_off[w]])
                    w = ring[i & (AHEAD_RING - 1)]
                    if w >= n_words:
                        bad = True
                        break
                    _unit_word(&st, out_ids, out_bounds, w, flags[w], cut_spaces,
                               &word_classes[w, 0] if regions else NULL, seg_sym, seg_off)
                if bad:
                    break
                _unit_span_end(&st, out_ids, out_bounds, regions)
    if bad:
        raise ValueError(f"a word id is not below the {n_words} words of the table")
    cdef _IdList held_ids = _IdList()
    cdef _U16List held16 = _U16List()
    held_ids.v.swap(out_ids)
    held16.v.swap(out16)
    units = held16.array() if narrow else held_ids.array()
    if marks:
        return units, _int64_array(out_bounds), st.n_seen, st.n_kept
    encoded = np.zeros(out_bounds.size() - 1, dtype=bool)
    cdef uint8_t[::1] ev = encoded.view(np.uint8)
    for k in range(<Py_ssize_t>enc.size()):
        ev[k] = enc[k]
    return units, _int64_array(out_bounds), st.n_seen, st.n_kept, encoded


def record_rows(const int64_t[::1] rows, const uint32_t[::1] ids, const int64_t[::1] word_offsets,
                const int64_t[::1] span_ends, uint32_t[::1] out, int64_t at, int64_t[::1] counts):
    """One recorded chunk into the corpus-wide lists: ``out[at + k] = rows[ids[k]]`` (the table row of
    each pretoken, ``rows`` mapping the chunk's own table to the word table), ``counts[row] += 1``,
    and the end (in pretokens) of each span, ``span_ends`` being where the spans end in text bytes
    (their lengths summed): returns them (int64). Raises ``ValueError`` when an id, a row or the
    bytes do not add up (a span must end exactly at a pretoken's end).

    >>> out, counts = np.zeros(3, np.uint32), np.zeros(4, np.int64)
    >>> record_rows(np.array([2, 3]), np.array([1, 0, 1], np.uint32), np.array([0, 1, 3]),
    ...             np.array([3, 5]), out, 0, counts).tolist(), out.tolist(), counts.tolist()
    ([2, 3], [3, 2, 3], [0, 0, 1, 2])

    Plain equivalent: ``out[at:at + n] = rows[ids]``, ``np.add.at(counts, rows[ids], 1)``, and
    ``np.searchsorted(np.cumsum(lengths[ids]), span_ends, side="right")``.
    """
    cdef Py_ssize_t n = ids.shape[0], n_local = rows.shape[0], n_spans = span_ends.shape[0], k, j = 0
    cdef int64_t n_rows = counts.shape[0], r, done = 0
    cdef uint32_t i
    cdef int err = 0
    if word_offsets.shape[0] != n_local + 1:
        raise ValueError("word_offsets must have one entry per local word, plus one")
    if at < 0 or at + n > out.shape[0]:
        raise ValueError("out is too short")
    cuts = np.empty(n_spans, dtype=np.int64)
    cdef int64_t[::1] cv = cuts
    # per local word, its row and byte length side by side (one cache line for both), and its
    # pretokens counted locally (a small array), added to ``counts`` once per word at the end
    cdef vector[int64_t] row_len
    cdef vector[int64_t] local
    row_len.resize(2 * n_local)
    local.assign(n_local, 0)
    with nogil:
        for i in range(<uint32_t>n_local):
            row_len[2 * i] = rows[i]
            row_len[2 * i + 1] = word_offsets[i + 1] - word_offsets[i]
        while j < n_spans and span_ends[j] <= 0:
            cv[j] = 0
            j += 1
        for k in range(n):
            i = ids[k]
            if i >= n_local:
                err = 1
                break
            r = row_len[2 * i]
            if r < 0 or r >= n_rows:
                err = 2
                break
            out[at + k] = <uint32_t>r
            local[i] += 1
            done += row_len[2 * i + 1]
            while j < n_spans and done >= span_ends[j]:
                if done != span_ends[j]:
                    err = 3
                    break
                cv[j] = k + 1
                j += 1
            if err:
                break
        if not err and j != n_spans:
            err = 3
        if not err:
            for i in range(<uint32_t>n_local):
                if local[i]:
                    counts[rows[i]] += local[i]
    if err == 1:
        raise ValueError("a pretoken id is not below the chunk's words")
    if err == 2:
        raise ValueError("a chunk word has no row in the word table")
    if err == 3:
        raise ValueError("the pretokens do not cover the text spans exactly")
    return cuts


cdef inline int _bytes_cmp(const uint8_t* a, int64_t na, const uint8_t* b, int64_t nb) noexcept nogil:
    """Python ``bytes`` order of ``a[:na]`` and ``b[:nb]``: negative, 0 or positive."""
    cdef int r = memcmp(a, b, na if na < nb else nb) if na > 0 and nb > 0 else 0
    if r != 0:
        return r
    return (na > nb) - (na < nb)


def find_rows(const uint8_t[::1] words_arena, const int64_t[::1] words_offsets, const uint8_t[::1] arena,
              const int64_t[::1] offsets):
    """The row in the table ``(arena, offsets)`` of each word of ``(words_arena, words_offsets)``
    (uint32): both sorted in ``bytes`` order, words unique, as counting makes them (a chunk's own
    table and the corpus's). One walk through both in order: from the row found last, the next is
    found by doubling steps, then halving (a few comparisons when the words are dense in the table,
    ``log`` of the gap when sparse); no hash table. Raises ``ValueError`` when a word is not in the
    table (or the words are not sorted).

    >>> find_rows(np.frombuffer(b"bd", np.uint8), np.array([0, 1, 2]),
    ...           np.frombuffer(b"abcd", np.uint8), np.array([0, 1, 2, 3, 4])).tolist()
    [1, 3]

    Plain equivalent: ``[table_words.index(w) for w in words]``.
    """
    cdef int64_t n = words_offsets.shape[0] - 1, n_rows = offsets.shape[0] - 1, k, lo, hi, mid, step, cur = 0
    cdef int64_t a, na
    cdef int err = 0
    if n < 0 or n_rows < 0:
        raise ValueError("offsets must have one entry per word, plus one")
    if n_rows >= <int64_t>0xFFFFFFFF:
        raise ValueError("find_rows: the table has too many words for uint32 rows")
    if n > 0 and (words_offsets[0] < 0 or words_offsets[n] > words_arena.shape[0]) or \
            n_rows > 0 and (offsets[0] < 0 or offsets[n_rows] > arena.shape[0]):
        raise ValueError("offsets must lie inside their arena")
    out = np.empty(n, dtype=np.uint32)
    cdef uint32_t[::1] ov = out
    cdef const uint8_t* wb = &words_arena[0] if words_arena.shape[0] > 0 else NULL
    cdef const uint8_t* tb = &arena[0] if arena.shape[0] > 0 else NULL
    with nogil:
        for k in range(n):
            a = words_offsets[k]
            na = words_offsets[k + 1] - a
            if na < 0:
                err = 1
                break
            # the first row at or after ``cur`` that is not below the word: rows[lo] < word <= rows[hi]
            if cur >= n_rows:
                err = 1
                break
            if _bytes_cmp(tb + offsets[cur], offsets[cur + 1] - offsets[cur], wb + a, na) >= 0:
                hi = cur
            else:
                lo = cur
                step = 1
                hi = cur + 1
                while hi < n_rows and _bytes_cmp(tb + offsets[hi], offsets[hi + 1] - offsets[hi], wb + a, na) < 0:
                    lo = hi
                    step *= 2
                    hi = lo + step
                if hi > n_rows:
                    hi = n_rows
                while hi - lo > 1:
                    mid = lo + (hi - lo) // 2
                    if _bytes_cmp(tb + offsets[mid], offsets[mid + 1] - offsets[mid], wb + a, na) < 0:
                        lo = mid
                    else:
                        hi = mid
            if hi >= n_rows or _bytes_cmp(tb + offsets[hi], offsets[hi + 1] - offsets[hi], wb + a, na) != 0:
                err = 1
                break
            ov[k] = <uint32_t>hi
            cur = hi + 1
    if err:
        raise ValueError("a word is not in the table (or the words are not sorted)")
    return out


cdef inline void _put_word(UnitState* st, vector[uint32_t]& ids, uint32_t w, const uint32_t* seg_sym,
                           const int64_t* seg_off) noexcept nogil:
    """Append a word: its id, or with ``seg_sym`` its stage-1 tokens (most words are one)."""
    cdef int64_t a, b, k
    if seg_sym == NULL:
        _out_push(st, ids, w)
        return
    a = seg_off[w]
    b = seg_off[w + 1]
    for k in range(a, b):           # (not insert: a call to memmove per word cost more than the copy)
        _out_push(st, ids, seg_sym[k])


cdef inline void _close_unit(UnitState* st, vector[uint32_t]& ids, vector[int64_t]& bounds) noexcept nogil:
    """End the open unit (the ids after the last bound) if it holds a word (``st.uw``, reset). With a
    sample: without regions a unit the sample leaves out is taken off the output at once; with
    regions it stays listed until the region ends (``_end_region`` decides)."""
    if st.uw > 0:
        st.n_seen += 1
        if not st.sampled:
            bounds.push_back(_out_size(st, ids))
            st.n_kept += 1
        elif st.rh != NULL:
            bounds.push_back(_out_size(st, ids))
            st.rh.push_back(st.uh)
            st.rn.push_back(st.uw)
        elif _mix(st.uh ^ <uint64_t>st.uw) < st.keep_below:
            bounds.push_back(_out_size(st, ids))
            st.n_kept += 1
        else:
            _out_resize(st, ids, bounds.back())
        st.uw = 0


cdef inline uint64_t _hash_step(uint64_t h, uint32_t w) noexcept nogil:
    """One id into ``_hash_ids``' state (``_mix(state ^ n)`` after ``n`` ids is the hash)."""
    h = (h ^ w) * FNV_PRIME
    return h ^ (h >> 29)


cdef void _end_region(UnitState* st, vector[uint32_t]& ids, vector[int64_t]& bounds, bint encoded) noexcept nogil:
    """The region of the units from ``st.rfirst`` on ends: with a sample (and regions), each of them
    stays when the hash of its word ids (and ENCODED_MARK when ``encoded``) is below ``keep_below``,
    the others are taken out (the kept ones move left, in order); then the kept ones are marked or
    flagged when ``encoded`` (``_encoded_region``)."""
    cdef size_t first = st.rfirst, n_units = bounds.size() - 1, u, out_u
    cdef int64_t a, b, pos, n
    cdef uint64_t h
    if st.sampled and st.rh != NULL:
        out_u = first
        pos = bounds[first]
        a = pos
        for u in range(first, n_units):
            b = bounds[u + 1]
            h = st.rh[0][u - first]
            n = st.rn[0][u - first]
            if encoded:
                h = _hash_step(h, _ENCODED_MARK)
                n += 1
            if _mix(h ^ <uint64_t>n) < st.keep_below:
                if pos != a:
                    _out_move(st, ids, pos, a, b - a)
                pos += b - a
                out_u += 1
                bounds[out_u] = pos
                st.n_kept += 1
            a = b
        bounds.resize(out_u + 1)
        _out_resize(st, ids, pos)
        st.rh.clear()
        st.rn.clear()
    if encoded:
        _encoded_region(st, ids, bounds)


cdef void _mark_units(vector[uint32_t]& ids, vector[int64_t]& bounds, size_t first) noexcept nogil:
    """Append ``ENCODED_MARK`` to every unit from ``first`` on (the last ones of the list), in place:
    the units move right, the last one first, each by the marks before it."""
    cdef size_t n_units = bounds.size() - 1, u
    cdef int64_t a, b, shift
    if n_units <= first:
        return
    ids.resize(ids.size() + (n_units - first))
    u = n_units
    while u > first:
        u -= 1
        shift = <int64_t>(u - first)
        a = bounds[u]
        b = bounds[u + 1]
        if shift > 0:
            memmove(ids.data() + a + shift, ids.data() + a, (b - a) * sizeof(uint32_t))
        ids[b + shift] = _ENCODED_MARK
        bounds[u + 1] = b + shift + 1


cdef inline void _emit(const uint32_t* p, size_t n, uint64_t keep_below, vector[uint32_t]& ids,
                       vector[int64_t]& bounds, int64_t* n_seen, int64_t* n_kept,
                       const uint32_t* seg_sym, const int64_t* seg_off) noexcept nogil:
    """Append one unit (word ids ``p[:n]``) unless the sample leaves it out (by the hash of its word
    ids); with ``seg_sym`` (not NULL) each word id is written as its stage-1 tokens
    (``seg_sym[seg_off[w]:seg_off[w + 1]]``), ``ENCODED_MARK`` as itself."""
    cdef size_t k
    cdef int64_t j
    cdef uint32_t w
    n_seen[0] += 1
    if keep_below != 0xFFFFFFFFFFFFFFFFu and _hash_ids(p, n) >= keep_below:
        return
    n_kept[0] += 1
    if seg_sym == NULL:
        ids.insert(ids.end(), p, p + n)
    else:
        for k in range(n):
            w = p[k]
            if w == _ENCODED_MARK:
                ids.push_back(w)
            else:
                for j in range(seg_off[w], seg_off[w + 1]):      # (no insert: a memmove call a word)
                    ids.push_back(seg_sym[j])
    bounds.push_back(ids.size())




def units_in_encoded_regions(const uint32_t[::1] ids, const int64_t[::1] bounds, const uint8_t[::1] flags,
                             const int32_t[:, ::1] word_classes, const int64_t[::1] doc_starts=None):
    """SupraTok's encoded-unit rule in one native pass (bool per unit ``ids[bounds[k]:bounds[k+1]]``):
    a *region* starts at position 0, at each of ``doc_starts`` and where a word ending with whitespace
    (``flags`` bit 4) meets one starting with it (bit 2); a region looks encoded by
    ``reference.looks_encoded`` on its words' summed ``word_classes``; a unit is encoded when more than
    half of its bytes lie in such regions. An empty unit counts the word at its start, as numpy's
    ``reduceat`` does.

    >>> cls = np.array([[41, 1, 10, 30, 2], [3, 1, 0, 2, 0]], np.int32)  # encoded-looking, ending with a space; " ab"
    >>> units_in_encoded_regions(np.array([0, 1, 1], np.uint32), np.array([0, 2, 3]),
    ...                          np.array([4, 2], np.uint8), cls).tolist()
    [True, False]

    Plain equivalent: ``supratok.documents.encoded_units`` (tested equal).
    """
    cdef Py_ssize_t n = ids.shape[0], n_words = flags.shape[0], n_units, k, i, r0
    cdef int64_t a, b, nb, eb, d
    cdef int64_t s_n = 0, s_ws = 0, s_punct = 0, s_alnum = 0, s_digit = 0
    cdef const int32_t* c
    if bounds.shape[0] < 1 or bounds[0] < 0 or bounds[bounds.shape[0] - 1] > n:
        raise ValueError("bounds must lie inside ids")
    n_units = bounds.shape[0] - 1
    for k in range(n_units):
        if bounds[k + 1] < bounds[k] or (bounds[k + 1] == bounds[k] and bounds[k] >= n):
            raise ValueError("bounds must be non-decreasing, an empty unit inside ids")
    if word_classes.shape[0] != n_words or word_classes.shape[1] != 5:
        raise ValueError("word_classes must have one row of 5 per word")
    for i in range(n):
        if ids[i] >= n_words:
            raise ValueError(f"a word id is not below the {n_words} words")
    # per position: where a region starts (bit 1) and, once its region is known, whether it lies in
    # one that looks encoded (bit 2); and its word's byte count (so the units' pass reads no word
    # row again: one random read of a word's classes per position, asked for 16 positions ahead)
    marks = np.zeros(n, dtype=np.uint8)
    n_bytes = np.empty(n, dtype=np.int32)
    cdef uint8_t[::1] mv = marks
    cdef int32_t[::1] bv = n_bytes
    cdef uint8_t f, prev_f = 0
    if n > 0:
        mv[0] = 1
    if doc_starts is not None:
        for k in range(doc_starts.shape[0]):
            d = doc_starts[k]
            if 0 <= d < n:
                mv[d] = 1
    out = np.zeros(n_units, dtype=bool)
    cdef uint8_t[::1] ov = out.view(np.uint8)
    with nogil:
        r0 = 0
        for i in range(n + 1):
            if i < n:
                if i + 16 < n:
                    __builtin_prefetch(&word_classes[ids[i + 16], 0])
                f = flags[ids[i]]
                if i > 0 and (prev_f & 4) and (f & 2):
                    mv[i] = 1
                prev_f = f
            if i == n or (mv[i] & 1 and i > r0):
                if _looks_encoded(s_n, s_ws, s_punct, s_alnum, s_digit):
                    for k in range(r0, i):
                        mv[k] |= 2
                s_n = s_ws = s_punct = s_alnum = s_digit = 0
                r0 = i
                if i == n:
                    break
            c = &word_classes[ids[i], 0]
            bv[i] = c[0]
            s_n += c[0]
            s_ws += c[1]
            s_punct += c[2]
            s_alnum += c[3]
            s_digit += c[4]
        for k in range(n_units):
            a = bounds[k]
            b = bounds[k + 1]
            if b <= a:
                b = a + 1
            nb = 0
            eb = 0
            for i in range(a, b):
                d = bv[i]
                nb += d
                if mv[i] & 2:
                    eb += d
            ov[k] = 2 * eb > nb
    return out
