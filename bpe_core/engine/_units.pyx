# cython: language_level=3
"""Kernels for multi-pretoken units (SuperBPE stage 2, SupraTok): word lookup, unit counting,
expansion to token ids, and merging a token-id sequence by rank.

- ``WordIndex`` maps pretoken bytes to their row in a sorted word table (open addressing over the
  table's arena; no Python object per pretoken).
- ``UnitCounter`` counts unique sequences of uint32 ids (units) with int64 counts; a deterministic
  64-bit content hash decides membership in a sample (``keep_below``), so a sample does not depend on
  worker count or order.
- ``expand_units`` replaces every word id of a unit by the word's token ids (a CSR segmentation).
- ``RankMerger`` applies ranked merges to an id sequence: repeatedly the lowest rank present, all
  of its occurrences left to right without overlap, exactly as training rewrote its words.

Each kernel names its plain equivalent in its docstring.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy, memmove, memset
from libcpp.algorithm cimport sort
from libcpp.vector cimport vector

cimport cython

import numpy as np

from bpe_core.runtime.memmon import prefault
from bpe_core.pretok._pretok cimport (PATTERN_CL100K, PATTERN_GPT2, PATTERN_O200K, _next_cl100k, _next_gpt2,
                                      _next_o200k, lend_items, lend_u32)

cdef extern from *:
    void __builtin_prefetch(const void* addr) noexcept nogil

cdef extern from "<sys/mman.h>" nogil:
    int madvise(void* addr, size_t length, int advice)
    int MADV_HUGEPAGE

cdef extern from "<stdlib.h>" nogil:
    int posix_memalign(void** memptr, size_t alignment, size_t size)


cdef void* _table_alloc(size_t nbytes, int fill) noexcept nogil:
    """A hash table's memory, every byte ``fill``; 2 MiB aligned and asked for as huge pages when
    large (random probes then miss the TLB far less; a hint only), NULL when out of memory."""
    cdef void* p = NULL
    if nbytes >= (<size_t>1 << 21):
        if posix_memalign(&p, <size_t>1 << 21, nbytes) != 0:
            return NULL
        madvise(p, nbytes, MADV_HUGEPAGE)
    else:
        p = malloc(nbytes if nbytes > 0 else 1)
        if p == NULL:
            return NULL
    memset(p, fill, nbytes)
    return p

cdef enum:
    BATCH = 32          # pretokens found ahead of their lookups (chunk_unit_stream)
    LONG_PIECE = 6      # cut_pieces lists pieces of this many symbols or more as they come (_PieceTable)

#: Pieces of this many symbols or more are listed by ``cut_pieces`` as they come (not looked up, so
#: one that comes again is listed again); the shorter ones are distinct.
CUT_LONG_PIECE = LONG_PIECE

cdef uint64_t FNV_OFFSET = 1469598103934665603u
cdef uint64_t FNV_PRIME = 1099511628211u


cdef inline uint64_t _mix(uint64_t h) noexcept nogil:
    h ^= h >> 33
    h *= <uint64_t>0xff51afd7ed558ccdu
    h ^= h >> 33
    h *= <uint64_t>0xc4ceb9fe1a85ec53u
    h ^= h >> 33
    return h


cdef inline uint64_t _hash_bytes(const uint8_t* p, int64_t n) noexcept nogil:
    cdef uint64_t h = FNV_OFFSET
    cdef int64_t i
    for i in range(n):
        h = (h ^ p[i]) * FNV_PRIME
    return _mix(h ^ <uint64_t>n)


ctypedef fused sym_t:
    # stage 2's units: uint32 ids, or uint16 (``id_unit_stream(narrow=True)``); the same values hash,
    # sketch and cut the same either way
    uint16_t
    uint32_t


cdef inline uint64_t _hash_ids(const sym_t* p, int64_t n) noexcept nogil:
    cdef uint64_t h = FNV_OFFSET
    cdef int64_t i
    for i in range(n):
        h = (h ^ p[i]) * FNV_PRIME
        h ^= h >> 29
    return _mix(h ^ <uint64_t>n)


def hash_ids(const uint32_t[::1] ids):
    """The 64-bit content hash ``UnitCounter`` uses for sampling (stable across runs and platforms)."""
    return _hash_ids(&ids[0] if ids.shape[0] > 0 else NULL, ids.shape[0])


# ==== Word index ==============================================================================

cdef struct WordSlot:
    # The first 16 bytes of the word inline (zero-padded), so a probe rarely touches the arena.
    uint64_t w0
    uint64_t w1
    int64_t tag         # -1: empty; else word id << 8 | min(length, 255)


cdef inline void _load16(const uint8_t* p, int64_t n, uint64_t* w0, uint64_t* w1) noexcept nogil:
    cdef uint64_t a = 0, b = 0
    cdef int64_t m = n if n < 16 else 16
    if m >= 8:
        memcpy(&a, p, 8)
        memcpy(&b, p + 8, m - 8)
    else:
        memcpy(&a, p, m)
    w0[0] = a
    w1[0] = b


cdef inline uint64_t _hash16(uint64_t w0, uint64_t w1, int64_t n) noexcept nogil:
    return _mix(w0 * <uint64_t>0x9E3779B97F4A7C15u ^ (w1 + <uint64_t>n) * <uint64_t>0xC2B2AE3D27D4EB4Fu)


cdef class WordIndex:
    """Pretoken bytes -> row of a word table (``arena``, ``offsets``), or -1.

    >>> idx = WordIndex(np.frombuffer(b"ab c", np.uint8), np.array([0, 2, 3, 4]))  # "ab", " ", "c"
    >>> idx.word_ids(b" cab", np.array([1, 2, 4]), 0).tolist()   # pieces " ", "c", "ab"
    [1, 2, 0]
    >>> idx.word_ids(b" cab", np.array([2, 4]), 0).tolist()      # " c" is not a word
    [-1, 0]

    Plain equivalent: ``{arena[o[i]:o[i+1]]: i for i in range(n)}.get(piece, -1)`` per piece.
    """
    cdef object _arena_obj
    cdef object _offsets_obj
    cdef const uint8_t[::1] arena
    cdef const int64_t[::1] offsets
    cdef vector[WordSlot] slots
    cdef uint64_t mask

    def __init__(self, arena, offsets):
        self._arena_obj = np.ascontiguousarray(arena, dtype=np.uint8)
        self._offsets_obj = np.ascontiguousarray(offsets, dtype=np.int64)
        self.arena = self._arena_obj
        self.offsets = self._offsets_obj
        cdef int64_t n = self.offsets.shape[0] - 1, i, length
        cdef uint64_t cap = 16, slot, w0, w1
        cdef WordSlot empty
        empty.w0 = 0
        empty.w1 = 0
        empty.tag = -1
        while cap < <uint64_t>(2 * n + 2):
            cap <<= 1
        self.slots.assign(cap, empty)
        self.mask = cap - 1
        cdef const uint8_t* base = &self.arena[0] if self.arena.shape[0] > 0 else NULL
        with nogil:
            for i in range(n):
                length = self.offsets[i + 1] - self.offsets[i]
                _load16(base + self.offsets[i], length, &w0, &w1)
                slot = _hash16(w0, w1, length) & self.mask
                while self.slots[slot].tag != -1:
                    slot = (slot + 1) & self.mask
                self.slots[slot].w0 = w0
                self.slots[slot].w1 = w1
                self.slots[slot].tag = (i << 8) | (length if length < 255 else 255)

    cdef inline uint64_t _slot_of(self, const uint8_t* p, int64_t n, const uint8_t* limit, uint64_t* w0,
                                  uint64_t* w1) noexcept nogil:
        """The first 16 bytes of ``p[:n]`` (zero-padded) and the slot where its probe starts; reads up to
        16 bytes at once when ``p + 16 <= limit`` (no byte-by-byte copy), as ``_load16`` gives them."""
        cdef uint64_t a, b
        if p + 16 <= limit:
            memcpy(&a, p, 8)
            memcpy(&b, p + 8, 8)
            if n < 8:
                a &= ((<uint64_t>1) << (8 * n)) - 1
                b = 0
            elif n < 16:
                b &= ((<uint64_t>1) << (8 * (n - 8))) - 1
            w0[0] = a
            w1[0] = b
        else:
            _load16(p, n, w0, w1)
        return _hash16(w0[0], w1[0], n) & self.mask

    cdef inline int64_t _probe(self, const uint8_t* p, int64_t n, uint64_t w0, uint64_t w1,
                               uint64_t slot) noexcept nogil:
        """``_lookup`` from a slot and head ``_slot_of`` gave."""
        cdef int64_t tag, w, start
        cdef int64_t short_len = n if n < 255 else 255
        while True:
            tag = self.slots[slot].tag
            if tag == -1:
                return -1
            if (tag & 0xFF) == short_len and self.slots[slot].w0 == w0 and self.slots[slot].w1 == w1:
                w = tag >> 8
                if n <= 16:
                    return w
                start = self.offsets[w]
                if self.offsets[w + 1] - start == n and memcmp(&self.arena[start], p, n) == 0:
                    return w
            slot = (slot + 1) & self.mask

    cdef inline int64_t _lookup(self, const uint8_t* p, int64_t n) noexcept nogil:
        cdef uint64_t w0, w1, slot
        _load16(p, n, &w0, &w1)
        slot = _hash16(w0, w1, n) & self.mask
        return self._probe(p, n, w0, w1, slot)

    def word_ids(self, const uint8_t[::1] buf, const int64_t[::1] ends, int64_t start):
        """Word ids of the pieces ``buf[start:ends[0]], buf[ends[0]:ends[1]], ...`` (int64, -1 if absent)."""
        cdef Py_ssize_t k, n = ends.shape[0]
        out = np.empty(n, dtype=np.int64)
        cdef int64_t[::1] ov = out
        cdef int64_t prev = start
        cdef const uint8_t* base = &buf[0] if buf.shape[0] > 0 else NULL
        with nogil:
            for k in range(n):
                ov[k] = self._lookup(base + prev, ends[k] - prev)
                prev = ends[k]
        return out


cdef inline Py_ssize_t _next_end(int pattern_id, const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    if pattern_id == PATTERN_GPT2:
        return _next_gpt2(s, i, n)
    if pattern_id == PATTERN_CL100K:
        return _next_cl100k(s, i, n)
    return _next_o200k(s, i, n)


#: Appended to the word ids of a unit whose region looks encoded (``chunk_unit_stream`` with
#: ``word_classes``): ``superbpe.stage2_table`` strips the mark and gives such units no weight. No word
#: id reaches it.
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
                      const int64_t[::1] seg_offsets=None):
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
    cdef bint direct = keep_below == 0xFFFFFFFFFFFFFFFFu
    cdef UnitState st                   # (direct) the open unit and region
    memset(&st, 0, sizeof(UnitState))
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
    cdef const uint8_t* limit = base + buf.shape[0]
    # a token or a word id per byte at most (marks aside): address space only, pages are touched as
    # written, and the list never moves while it grows
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
                w = index._probe(base + bstart[q], bend[q] - bstart[q], bw0[q], bw1[q], bslot[q])
                q += 1
                if w < 0:
                    n_missing += 1
                    continue
                f = flags[w]
                if direct:
                    # no sample: every word goes straight to the output (_unit_word)
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
    held_ids.v.swap(out_ids)
    return held_ids.array(), _int64_array(out_bounds), n_seen, n_kept, n_missing


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


cdef inline size_t _out_size(UnitState* st, vector[uint32_t]& ids) noexcept nogil:
    """How many ids the output holds (``st.out16`` when narrow, else ``ids``)."""
    return st.out16.size() if st.out16 != NULL else ids.size()


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
            if _looks_encoded(st.r_n, st.r_ws, st.r_punct, st.r_alnum, st.r_digit):
                _encoded_region(st, out_ids, out_bounds)
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
        _put_word(st, out_ids, w, seg_sym, seg_off)
        st.uw = 1
        _close_unit(st, out_ids, out_bounds)
    else:
        _put_word(st, out_ids, w, seg_sym, seg_off)
        st.uw += 1
    st.prev = f


cdef inline void _unit_span_end(UnitState* st, vector[uint32_t]& out_ids, vector[int64_t]& out_bounds,
                                bint regions) noexcept nogil:
    """The end of a span: its last unit and region end (marked when it looks encoded)."""
    _close_unit(st, out_ids, out_bounds)
    if regions:
        if out_bounds.size() - 1 > st.rfirst and _looks_encoded(st.r_n, st.r_ws, st.r_punct, st.r_alnum,
                                                                 st.r_digit):
            _encoded_region(st, out_ids, out_bounds)
        st.rfirst = out_bounds.size() - 1
        st.r_n = st.r_ws = st.r_punct = st.r_alnum = st.r_digit = 0
    st.prev = 0


def id_unit_stream(ids, const int64_t[::1] breaks, const uint8_t[::1] flags,
                   bint cut_spaces=False, const int32_t[:, ::1] word_classes=None,
                   const uint32_t[::1] seg_symbols=None, const int64_t[::1] seg_offsets=None,
                   int64_t reserve=0, bint marks=True, bint narrow=False):
    """The units of text given as word ids (rows of the word table) instead of bytes: span ``k`` is
    ``ids[breaks[k]:breaks[k+1]]`` (the pretokens of the text between two special tokens, in order).
    Returns ``(ids, bounds, n_seen, n_kept)``: what ``chunk_unit_stream`` lists, without a sample,
    for the same spans (``flags``, ``cut_spaces``, ``word_classes`` and the segmentation as there).

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
    (the same values; ``ValueError`` when an id does not fit).

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
    cdef const uint32_t[::1] view
    cdef int64_t n_ids = 0
    arrays = ids if isinstance(ids, (list, tuple)) else [ids]
    for a in arrays:
        view = a
        sp.push_back(&view[0] if view.shape[0] > 0 else &_NO_SEG)
        sstart.push_back(n_ids)
        n_ids += view.shape[0]
    sstart.push_back(n_ids)
    sp.push_back(&_NO_SEG)
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
    memset(&st, 0, sizeof(UnitState))
    if not marks:
        st.enc = &enc
    if narrow:
        st.out16 = &out16
        out16.reserve(max(reserve, n_ids) + 16)
    else:
        out_ids.reserve(max(reserve, n_ids) + 16)
    out_bounds.push_back(0)
    cdef size_t cur = 0
    cdef int64_t base = 0, end = sstart[1]
    cdef const uint32_t* p = sp[0]
    with nogil:
        for k in range(breaks.shape[0] - 1):
            for i in range(breaks[k], breaks[k + 1]):
                while i >= end:                  # the next segment
                    cur += 1
                    base = end
                    end = sstart[cur + 1]
                    p = sp[cur]
                if i + 16 < end and p[i + 16 - base] < n_words:     # a word ahead (hints only)
                    if regions:
                        __builtin_prefetch(&word_classes[p[i + 16 - base], 0])
                    if seg_off != NULL:
                        __builtin_prefetch(&seg_off[p[i + 16 - base]])
                # the stage-1 tokens of a word nearer ahead: its offset was asked for 12 words ago
                # (the tokens were the loop's main miss: 7 MB of them at 32k on en_train)
                if seg_off != NULL and i + 4 < end and p[i + 4 - base] < n_words:
                    __builtin_prefetch(&seg_sym[seg_off[p[i + 4 - base]]])
                w = p[i - base]
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
    """End the open unit (the ids after the last bound) if it holds a word (``st.uw``, reset)."""
    if st.uw > 0:
        st.uw = 0
        bounds.push_back(_out_size(st, ids))
        st.n_seen += 1
        st.n_kept += 1


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

    def to_arrays(self):
        """``(data uint32, starts int64, counts int64)``, units in first-seen order."""
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
                 const int64_t[::1] seg_offsets):
    """Replace each word id by its segmentation: returns ``(symbols uint32, offsets int64)``;
    ``ENCODED_MARK`` stays itself.

    >>> s, o = expand_units(np.array([0, 1], np.uint32), np.array([0, 2]),
    ...                     np.array([7, 8, 9], np.uint32), np.array([0, 2, 3]))
    >>> s.tolist(), o.tolist()
    ([7, 8, 9], [0, 3])

    Plain equivalent: ``[sum((seg[w] for w in unit), []) for unit in units]``.
    """
    cdef Py_ssize_t n_units = starts.shape[0] - 1, u, k
    cdef int64_t total = 0, pos = 0, w, j
    for k in range(data.shape[0]):
        w = data[k]
        if w == _ENCODED_MARK:
            total += 1
        elif w + 1 >= seg_offsets.shape[0]:
            raise ValueError(f"word id {w} is not in the segmentation")
        else:
            total += seg_offsets[w + 1] - seg_offsets[w]
    symbols = np.empty(total, dtype=np.uint32)
    offsets = np.empty(n_units + 1, dtype=np.int64)
    cdef uint32_t[::1] sv = symbols
    cdef int64_t[::1] ov = offsets
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
    return pair_sketch_parts(_halves(threads, symbols, offsets, weights), bits, sample_bits)


def _halves(int threads, symbols, offsets, *per_seq):
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


def pair_sketch_parts(list parts, int bits, int sample_bits=0):
    """:func:`pair_sketch` over the sequences of one or two parts ``(symbols, offsets, weights)``
    (each part's offsets are positions in its own symbols), one thread per part: the result of
    ``pair_sketch`` on the parts joined (tested)."""
    cdef uint64_t cap = 1 << 10
    cdef int64_t n_sym = sum(int(p[0].shape[0]) for p in parts)
    cdef int n_parts = len(parts)
    if bits < 3 or bits > 30:        # 3: the keep bitmap (cut_pieces) has whole bytes
        raise ValueError(f"pair_sketch: bits must be in 3..30, not {bits}")
    if sample_bits < 0 or sample_bits > 16:
        raise ValueError(f"pair_sketch: sample_bits must be in 0..16, not {sample_bits}")
    if n_parts < 1 or n_parts > 2:
        raise ValueError("pair_sketch_parts: one or two parts")
    while cap < <uint64_t>((n_sym >> sample_bits) // (4 * n_parts)) and cap < (<uint64_t>1 << 31):
        cap <<= 1       # as pair_levels: room for a sampled pair per 8 sampled windows
    cdef _SketchPart left = _SketchPart(bits, cap), right
    if n_parts == 1:
        sym, off, w = parts[0]
        left.count(sym, off, w, 0, len(off) - 1, sample_bits)
        return left.sketch_obj, left.sample.counts_with(None), int(left.excess)
    from concurrent.futures import ThreadPoolExecutor
    right = _SketchPart(bits, cap)
    sketches = (left, right)
    with ThreadPoolExecutor(2, thread_name_prefix="bpe_core-sketch") as ex:
        jobs = [ex.submit(t.count, sym, off, w, 0, len(off) - 1, sample_bits)
                for t, (sym, off, w) in zip(sketches, parts)]
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
            const uint8_t[::1] keep=None, _PieceTable upper=None):
        """Cut sequences ``lo:hi`` and count their pieces (by ``levels``, or by the bitmap ``keep``);
        with ``upper``, the pieces whose hash has its top bit set are counted there instead (so two
        threads can then join their tables half by half: ``cut_pieces``)."""
        cdef int64_t u, k, a, b, start, n
        cdef uint64_t h, smask = 0, slot
        cdef bint by_bits = keep is not None, split = upper is not None
        cdef const uint8_t* kb = NULL
        cdef int side, r
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
        if self.oom or (split and upper.oom):
            raise MemoryError("cut_pieces: no memory for the piece table")
        with nogil:
            for u in range(lo, hi):
                a = offsets[u]
                b = offsets[u + 1]
                start = a
                for k in range(a, b):
                    if k + 1 < b:
                        if by_bits:             # a 512 KiB bitmap: it stays in the CPU's cache
                            slot = _sketch_slot(((<uint64_t>symbols[k] << 32) | symbols[k + 1]) + 1, smask)
                            if (kb[slot >> 3] >> (slot & 7)) & 1:
                                continue
                        elif levels[k] >= min_level:
                            continue
                    n = k + 1 - start
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
                    elif n > 1:
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
                    start = k + 1
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


def cut_pieces(const sym_t[::1] symbols, const int64_t[::1] offsets, const uint32_t[::1] levels,
               const int64_t[::1] weights, const int64_t[::1] counts, uint32_t min_level, int threads=1,
               const uint8_t[::1] keep=None):
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
    parts = _halves(threads, symbols, offsets, weights, counts)
    return cut_pieces_parts(parts, min_level, keep=keep, levels=[levels] * len(parts) if keep is None else None)


def cut_pieces_parts(list parts, uint32_t min_level, const uint8_t[::1] keep=None, levels=None):
    """:func:`cut_pieces` over the sequences of one or two parts ``(symbols, offsets, weights,
    counts)`` (each part's offsets are positions in its own symbols; ``levels``: one array per part,
    when there is no ``keep``), one thread per part: the pieces of ``cut_pieces`` on the parts joined,
    with the same weights and counts (tested)."""
    cdef int64_t n_sym = sum(int(p[0].shape[0]) for p in parts)
    cdef int n_parts = len(parts)
    if n_parts < 1 or n_parts > 2:
        raise ValueError("cut_pieces_parts: one or two parts")
    if n_sym >= <int64_t>0xFFFFFFFF:
        raise ValueError("too many symbols for uint32 piece ids")
    if keep is None and (levels is None or len(levels) != n_parts or
                         any(lv is None or lv.shape[0] != p[0].shape[0] for lv, p in zip(levels, parts))):
        raise ValueError("cut_pieces: one level per symbol, or a keep bitmap, is needed")
    if keep is not None and (keep.shape[0] == 0 or keep.shape[0] & (keep.shape[0] - 1)):
        raise ValueError("cut_pieces: a keep bitmap's size is a power of two")
    lv = list(levels) if keep is None else [None] * n_parts
    cdef _PieceTable table
    if n_parts == 1:
        sym, off, w, c = parts[0]
        table = _PieceTable(n_sym)
        table.add(sym, off, lv[0], w, c, min_level, 0, len(off) - 1, keep)
        return table.to_arrays()
    from concurrent.futures import ThreadPoolExecutor
    # the left tables take the right ones' pieces in (absorb): room for that from the start (their
    # slot tables then need not grow and rehash midway)
    cdef _PieceTable left = _PieceTable(n_sym // 2), left_up = _PieceTable(n_sym // 2)
    cdef _PieceTable right = _PieceTable(n_sym // 4), right_up = _PieceTable(n_sym // 4)
    with ThreadPoolExecutor(2, thread_name_prefix="bpe_core-pieces") as ex:
        jobs = [ex.submit(t.add, sym, off, lv[i], w, c, min_level, 0, len(off) - 1, keep, up)
                for i, (t, up, (sym, off, w, c)) in enumerate(zip((left, right), (left_up, right_up), parts))]
        for j in jobs:
            j.result()
        jobs = [ex.submit(left.absorb, right), ex.submit(left_up.absorb, right_up)]
        for j in jobs:
            j.result()
        del right, right_up
        d1 = left.n_symbols()          # the second table's pieces after the first's, on both threads
        jobs = [ex.submit(left.take, left_up, 0, d1), ex.submit(left.take, left_up, 1, d1)]
        for j in jobs:
            j.result()
    return left.to_arrays(left_up, taken=True)


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
