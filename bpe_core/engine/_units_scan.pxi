# _units.pyx, part 3 of 9 (``include``d: compiled into the module as if written there).
# The units of a text buffer in text order, scanned with a named pattern (chunk_unit_stream), and the rule
# that marks the units of encoded-looking regions.

ENCODED_MARK = 0xFFFFFFFF
cdef uint32_t _ENCODED_MARK = 0xFFFFFFFFu
cdef uint32_t _NO_SEG = 0      # a non-NULL pointer for an empty segmentation

#: The rule of ``reference.looks_encoded`` (and ``superbpe.ENCODED_*``): at least 40 bytes that are not
#: ASCII whitespace, whitespace at most 1/16 of the bytes, of the other bytes at least a quarter ASCII
#: punctuation, at least a quarter ASCII letters or digits, and at least 1/20 digits.
cdef inline bint _looks_encoded(int64_t n, int64_t ws, int64_t punct, int64_t alnum, int64_t digits) noexcept nogil:
    cdef int64_t nonspace = n - ws
    return (nonspace >= 40 and ws * 16 <= n and punct * 4 >= nonspace and alnum * 4 >= nonspace
            and digits * 20 >= nonspace)


cdef inline void _flush_region(vector[uint32_t]& rdata, vector[int64_t]& rbounds, bint encoded,
                               vector[uint32_t]& tmp, uint64_t keep_below, vector[uint32_t]& out_ids,
                               vector[int64_t]& out_bounds, int64_t* n_seen, int64_t* n_kept,
                               const uint32_t* seg_sym, const int64_t* seg_off) noexcept nogil:
    """Emit the buffered units of one region (``rdata[rbounds[k]:rbounds[k+1]]``), each with the
    encoded mark appended when the region looks encoded; empties the buffer."""
    cdef size_t k
    cdef int64_t a, b
    for k in range(rbounds.size() - 1):
        a = rbounds[k]
        b = rbounds[k + 1]
        if encoded:
            tmp.assign(rdata.begin() + a, rdata.begin() + b)
            tmp.push_back(_ENCODED_MARK)
            _emit(tmp.data(), tmp.size(), keep_below, out_ids, out_bounds, n_seen, n_kept, seg_sym, seg_off)
        else:
            _emit(rdata.data() + a, b - a, keep_below, out_ids, out_bounds, n_seen, n_kept, seg_sym, seg_off)
    rdata.clear()
    rbounds.clear()
    rbounds.push_back(0)


def chunk_unit_stream(const uint8_t[::1] buf, const int64_t[:, ::1] spans, int pattern_id, WordIndex index,
                      const uint8_t[::1] flags, uint64_t keep_below=0xFFFFFFFFFFFFFFFFu, bint cut_spaces=False,
                      const int32_t[:, ::1] word_classes=None, const uint32_t[::1] seg_symbols=None,
                      const int64_t[::1] seg_offsets=None, int64_t[::1] span_ends=None, bint buffered=False,
                      bint narrow=False):
    """Scan the text spans of a chunk with a native pattern and list its units: every unit in text
    order (not deduplicated), as
    ``(ids uint32, bounds int64, n_seen, n_kept, n_missing)`` (unit ``k`` is ``ids[bounds[k]:bounds[k+1]]``;
    a unit whose content hash is >= ``keep_below`` is left out, as ``UnitCounter`` samples).

    SuperBPE's stage 2 deduplicates its pieces (``cut_pieces``) and units are nearly all distinct, so
    counting them first would only cost a hash table.

    >>> idx = WordIndex(np.frombuffer(b" a b", np.uint8), np.array([0, 2, 4]))    # " a", " b"
    >>> ids, bounds, seen, kept, missing = chunk_unit_stream(np.frombuffer(b" a b a", np.uint8),
    ...     np.array([[0, 6]]), 0, idx, np.zeros(2, np.uint8))
    >>> ids.tolist(), bounds.tolist(), seen, kept, missing
    ([0, 1, 0], [0, 3], 1, 1, 0)

    ``word_classes`` (rows: bytes, ASCII whitespace, ASCII punctuation, ASCII letters and digits,
    ASCII digits of each word; ``superbpe.word_classes``) turns on the encoded-region mark: a *region*
    is a span, cut only where ``cut_spaces`` cuts (numeric words do not end it), and when the bytes of
    a region look encoded (``reference.looks_encoded``) each of its units ends with ``ENCODED_MARK``.

    ``seg_symbols``/``seg_offsets`` (the stage-1 segmentation of the table's words, CSR) write each
    word as its stage-1 tokens instead of its id (``expand_units`` fused into the scan; the sample
    still hashes the word ids; ``ENCODED_MARK`` stays itself):

    >>> ids, bounds, _, _, _ = chunk_unit_stream(np.frombuffer(b" a b a", np.uint8), np.array([[0, 6]]), 0,
    ...     idx, np.zeros(2, np.uint8), seg_symbols=np.array([7, 8, 9], np.uint32),
    ...     seg_offsets=np.array([0, 2, 3]))
    >>> ids.tolist(), bounds.tolist()
    ([7, 8, 9, 7, 8], [0, 5])

    A unit is a run of word ids of consecutive pretokens inside one span. ``flags[w]`` per word:
    bit 1 numeric (the word is a unit of its own), bit 2 starts with whitespace, bit 4 ends with
    whitespace; with ``cut_spaces`` a unit is also cut between a word ending with whitespace and one
    starting with it. ``n_missing`` counts pretokens missing from ``index`` (0 when the word table
    was counted from the same text).

    ``span_ends`` (int64, one per span; no sample, no ``word_classes``): filled with where each
    span's ids end in the output, so span ``k``'s ids are ``ids[span_ends[k - 1]:span_ends[k]]``
    (with ``seg_symbols=None``: the word id of every pretoken of the span, in order):

    >>> ends = np.zeros(2, np.int64)
    >>> ids, bounds, _, _, _ = chunk_unit_stream(np.frombuffer(b" a b a b", np.uint8),
    ...     np.array([[0, 4], [4, 8]]), 0, idx, np.zeros(2, np.uint8), span_ends=ends)
    >>> ids.tolist(), ends.tolist()
    ([0, 1, 0, 1], [2, 4])

    Every word goes straight to the output as it comes (the units of a region marked when it ends;
    with a sample, the units it leaves out are taken off again: at once, or with regions when the
    region ends, by the hash of their word ids and mark). ``buffered=True`` takes the older path
    instead: each unit and region gathered in buffers of word ids, then written out (the twin the
    tests compare the direct path with; the same lists).

    ``narrow=True`` (with a segmentation whose tokens all fit 16 bits, the direct path, no
    ``span_ends``): the stage-1 tokens as uint16 (half the bytes to write, hold and read in stage 2)
    and no ``ENCODED_MARK`` (it needs 32 bits): a sixth value says which units came from regions
    that look encoded (bool per unit); the same units, sample and figures (tested:
    ``strip_marks`` of the units with marks).

    Plain equivalent: ``superbpe._units_of`` with the Python scanner (``pretoken_ends``), and
    ``reference.superbpe_units`` on word ids; with ``word_classes``,
    ``reference.superbpe_units(with_regions=True)`` and ``looks_encoded`` per region; with
    ``seg_symbols``, ``expand_units`` of that list.
    """
    cdef Py_ssize_t k, i, e, end, n_missing = 0, q, nb
    cdef const uint32_t* seg_sym = NULL
    cdef const int64_t* seg_off = NULL
    if (seg_symbols is None) != (seg_offsets is None):
        raise ValueError("seg_symbols and seg_offsets go together")
    if seg_symbols is not None:
        if seg_offsets.shape[0] != index.offsets.shape[0]:
            raise ValueError("seg_offsets must have one entry per word of the index, plus one")
        if seg_symbols.shape[0] < seg_offsets[seg_offsets.shape[0] - 1]:
            raise ValueError("seg_symbols is shorter than seg_offsets says")
        seg_off = &seg_offsets[0]
        seg_sym = &seg_symbols[0] if seg_symbols.shape[0] > 0 else &_NO_SEG
    cdef bint regions = word_classes is not None
    cdef bint want_ends = span_ends is not None
    if want_ends and (span_ends.shape[0] != spans.shape[0] or regions
                      or keep_below != 0xFFFFFFFFFFFFFFFFu):
        raise ValueError("span_ends: one per span, with no sample and no word_classes")
    cdef vector[uint32_t] rdata, tmp
    cdef vector[int64_t] rbounds
    cdef int64_t r_n = 0, r_ws = 0, r_punct = 0, r_alnum = 0, r_digit = 0
    if regions and word_classes.shape[1] != 5:
        raise ValueError("word_classes must have 5 columns (bytes, whitespace, punctuation, alnum, digits)")
    rbounds.push_back(0)
    cdef int64_t w
    cdef vector[uint32_t] unit
    cdef vector[uint32_t] out_ids
    cdef vector[int64_t] out_bounds
    cdef int64_t n_seen = 0, n_kept = 0
    cdef bint direct = not buffered
    cdef UnitState st                   # (direct) the open unit and region
    cdef vector[uint64_t] region_hashes
    cdef vector[int64_t] region_words
    cdef vector[uint16_t] out16
    cdef vector[uint8_t] enc
    cdef Py_ssize_t t
    if narrow:
        if seg_symbols is None or buffered or want_ends:
            raise ValueError("narrow units: a segmentation, the direct path and no span_ends")
        for t in range(seg_symbols.shape[0]):
            if seg_symbols[t] > 0xFFFF:
                raise ValueError(f"narrow units: token {seg_symbols[t]} does not fit 16 bits")
    memset(&st, 0, sizeof(UnitState))
    if narrow:                          # uint16 out, encoded units flagged (no marks)
        st.out16 = &out16
        st.enc = &enc
    st.keep_below = keep_below
    st.sampled = keep_below != 0xFFFFFFFFFFFFFFFFu
    if st.sampled and regions:      # (direct) the sample of a region's units waits for its end
        st.rh = &region_hashes
        st.rn = &region_words
    cdef uint32_t one
    cdef uint8_t f, prev
    cdef const uint8_t* base = &buf[0] if buf.shape[0] > 0 else NULL
    # Pretokens are found a batch ahead and their index slots asked for (a hint only), so the lookups'
    # cache misses overlap instead of coming one after another; the order and the result are the same.
    cdef Py_ssize_t bstart[BATCH]
    cdef Py_ssize_t bend[BATCH]
    cdef uint64_t bw0[BATCH]
    cdef uint64_t bw1[BATCH]
    cdef uint64_t bslot[BATCH]
    cdef int64_t bword[BATCH]           # (direct) the batch's word ids, looked up before any is written
    cdef Py_ssize_t j
    cdef const uint8_t* limit = base + buf.shape[0]
    # a token or a word id per byte at most (marks aside): address space only, pages are touched as
    # written, and the list never moves while it grows
    if narrow:
        out16.reserve(buf.shape[0] + 16)
    else:
        out_ids.reserve(buf.shape[0] + 16)
    out_bounds.push_back(0)
    with nogil:
        for k in range(spans.shape[0]):
            i = spans[k, 0]
            end = spans[k, 1]
            unit.clear()
            prev = 0
            nb = 0
            q = 0
            while True:
                if q == nb:                 # the next batch
                    nb = 0
                    q = 0
                    while nb < BATCH and i < end:
                        e = _next_end(pattern_id, base, i, end)
                        bstart[nb] = i
                        bend[nb] = e
                        bslot[nb] = index._slot_of(base + i, e - i, limit, &bw0[nb], &bw1[nb])
                        __builtin_prefetch(&index.slots[bslot[nb]])
                        nb += 1
                        i = e
                    if nb == 0:
                        break
                    if direct:
                        # the whole batch looked up at once (its slots were asked for above), and each
                        # word's flags, classes and stage-1 tokens asked for in turn (hints only: a
                        # word's data is a miss in a large table; the words are written in order after)
                        for j in range(nb):
                            w = index._probe(base + bstart[j], bend[j] - bstart[j], bw0[j], bw1[j], bslot[j])
                            bword[j] = w
                            if w >= 0:
                                __builtin_prefetch(&flags[w])
                                if regions:
                                    __builtin_prefetch(&word_classes[w, 0])
                                if seg_off != NULL:
                                    __builtin_prefetch(&seg_off[w])
                if direct:
                    w = bword[q]
                    # the stage-1 tokens of a word a few ahead (its offset was asked for with the batch)
                    if seg_off != NULL and q + 4 < nb and bword[q + 4] >= 0:
                        __builtin_prefetch(&seg_sym[seg_off[bword[q + 4]]])
                else:
                    w = index._probe(base + bstart[q], bend[q] - bstart[q], bw0[q], bw1[q], bslot[q])
                q += 1
                if w < 0:
                    n_missing += 1
                    continue
                f = flags[w]
                if direct:
                    # every word goes straight to the output (_unit_word; a sample takes units off again)
                    _unit_word(&st, out_ids, out_bounds, <uint32_t>w, f, cut_spaces,
                               &word_classes[w, 0] if regions else NULL, seg_sym, seg_off)
                    continue
                if regions:
                    # units go to the region buffer, emitted (marked or not) when the region ends
                    if cut_spaces and (prev & 4) and (f & 2) and rdata.size() + unit.size() > 0:
                        if unit.size() > 0:
                            rdata.insert(rdata.end(), unit.begin(), unit.end())
                            rbounds.push_back(rdata.size())
                            unit.clear()
                        _flush_region(rdata, rbounds, _looks_encoded(r_n, r_ws, r_punct, r_alnum, r_digit), tmp,
                                      keep_below, out_ids, out_bounds, &n_seen, &n_kept,
                                      seg_sym, seg_off)
                        r_n = r_ws = r_punct = r_alnum = r_digit = 0
                    r_n += word_classes[w, 0]
                    r_ws += word_classes[w, 1]
                    r_punct += word_classes[w, 2]
                    r_alnum += word_classes[w, 3]
                    r_digit += word_classes[w, 4]
                    if f & 1:
                        if unit.size() > 0:
                            rdata.insert(rdata.end(), unit.begin(), unit.end())
                            rbounds.push_back(rdata.size())
                            unit.clear()
                        rdata.push_back(<uint32_t>w)
                        rbounds.push_back(rdata.size())
                    else:
                        unit.push_back(<uint32_t>w)
                    prev = f
                    continue
                if f & 1:
                    if unit.size() > 0:
                        _emit(unit.data(), unit.size(), keep_below, out_ids, out_bounds, &n_seen, &n_kept,
                                      seg_sym, seg_off)
                        unit.clear()
                    one = <uint32_t>w
                    _emit(&one, 1, keep_below, out_ids, out_bounds, &n_seen, &n_kept,
                                      seg_sym, seg_off)
                else:
                    if cut_spaces and (prev & 4) and (f & 2) and unit.size() > 0:
                        _emit(unit.data(), unit.size(), keep_below, out_ids, out_bounds, &n_seen, &n_kept,
                                      seg_sym, seg_off)
                        unit.clear()
                    unit.push_back(<uint32_t>w)
                prev = f
            if direct:
                _unit_span_end(&st, out_ids, out_bounds, regions)
                if want_ends:
                    span_ends[k] = out_ids.size()
            elif regions:
                if unit.size() > 0:
                    rdata.insert(rdata.end(), unit.begin(), unit.end())
                    rbounds.push_back(rdata.size())
                    unit.clear()
                if rbounds.size() > 1:
                    _flush_region(rdata, rbounds, _looks_encoded(r_n, r_ws, r_punct, r_alnum, r_digit), tmp,
                                  keep_below, out_ids, out_bounds, &n_seen, &n_kept,
                                      seg_sym, seg_off)
                r_n = r_ws = r_punct = r_alnum = r_digit = 0
            elif unit.size() > 0:
                _emit(unit.data(), unit.size(), keep_below, out_ids, out_bounds, &n_seen, &n_kept,
                                      seg_sym, seg_off)
    if direct:
        n_seen = st.n_seen
        n_kept = st.n_kept
    # the lists become the arrays' memory (no copy of the chunk's ids)
    cdef _IdList held_ids = _IdList()
    cdef _U16List held16
    cdef uint8_t[::1] ev
    if narrow:
        held16 = _U16List()
        held16.v.swap(out16)
        encoded = np.zeros(out_bounds.size() - 1, dtype=bool)
        ev = encoded.view(np.uint8)
        for t in range(<Py_ssize_t>min(enc.size(), out_bounds.size() - 1)):
            ev[t] = enc[t]
        return held16.array(), _int64_array(out_bounds), n_seen, n_kept, n_missing, encoded
    held_ids.v.swap(out_ids)
    return held_ids.array(), _int64_array(out_bounds), n_seen, n_kept, n_missing

