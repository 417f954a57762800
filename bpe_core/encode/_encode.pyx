# cython: language_level=3
"""The encoder core: special tokens, pre-tokenization and merging of a whole text in one native call.

Semantics (equivalent to ``reference.encode``): special tokens are found first, left to right,
longest match first; the text between them is pre-tokenized (the native scanners of
``_pretok.pxd``, byte-identical to ``regex``); each pretoken is merged by rank
(``reference.encode_pretoken``): a pretoken starts as its bytes, one token each; repeatedly, the
pair with the lowest merge rank present is merged at all of its occurrences, greedily left to right
without overlap (``aaa`` with ``(a, a)`` gives ``[aa, a]``); stop when no adjacent pair is a merge.
Token ids are canonical by bytes (``reference.token_ids``: the smallest id holding the bytes), so a
pair of ids names a pair of byte strings and ``RankTable`` can key on ids.

Why "all occurrences, then the next rank", and ranks only ever rising: this is the reference's
replay (``reference.encode_pretoken``: every merge in rank order, once, to the whole pretoken, as
training rewrote its words). It differs from "lowest rank present, repeat" (tiktoken, GPT-2's
``encoder.py``) only when a merge creates a pair whose rank is *lower* than the merge being
applied, which happens when two merges build the same bytes (``(a, bc)`` and ``(ab, c)``): the
replay has passed that rank, so such a pair merges only at a later rank of the same pair (the
same pair merged again, ``RankTable.rank_after``), or never. Vocabularies without two paths to a
token (GPT-2's, cl100k) give the same ids either way.

Two merge paths, the same result (tests run both on the same input):

- ``_merge_scan`` (pieces up to ``SHORT_PIECE`` bytes): find the lowest rank by a linear scan,
  rewrite the piece in one pass, look up only the pairs that touch a merged token. O(n) a merge.
- ``_merge_heap`` (longer pieces): tokens in a doubly linked list over byte positions; a min-heap
  of ``(rank << 32) | position`` entries. An entry is valid while ``pair_ranks[position]`` still
  equals its rank (a dead position has ``NO_RANK``); stale entries are skipped on pop (invalidate,
  don't delete, as tiktoken's ``_byte_pair_merge_large``). Within one rank, entries pop in position
  order, which is the left-to-right rewrite. O(n log n): ``b"a" * 100_000`` takes milliseconds.

Where the time goes, and what the layout does about it (``docs/encoding.md`` has the figures): a
corpus is mostly a few hundred thousand distinct pretokens, so nearly every pretoken is a cache hit
and the cost is memory latency, not merging. The cache is open addressing over 32-byte slots (two
per cache line) that hold the pretoken's first 8 bytes, its length, and up to 4 ids inline; only a
pretoken longer than 8 bytes or with more than 4 ids has a record in an arena (its ids, then its
bytes after the first 8). So a hit on a short pretoken reads one slot and nothing else. Pretokens
are looked up in batches of ``BATCH``: the hashes of a batch are computed and their slots
prefetched before the first probe, so the cache misses of a batch overlap. Pre-tokenization writes
the ends of up to ``ENDS_CAP`` pretokens into a scratch buffer that stays in L1, and
``encode_text`` does a whole text (special tokens, scanning, merging) without the GIL and without
a Python object per document or per pretoken.

The cache is cleared whole when it holds ``max_entries`` pretokens or its arena outgrows
``ARENA_MAX``, so memory stays bounded (at most ~16 MiB of slots plus the arena). An ``Encoder`` is
not thread-safe (it owns the cache and scratch buffers); ``Tokenizer`` keeps one per thread.
"""
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.exc cimport PyErr_Clear
from cpython.ref cimport PyObject
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memchr, memcmp, memcpy, memmove, memset
from libcpp.algorithm cimport pop_heap, push_heap
from libcpp.algorithm cimport sort as cpp_sort
from libcpp.utility cimport pair as cpp_pair
from libcpp.vector cimport vector

cimport cython

import numpy as np

from bpe_core.pretok._pretok cimport _split_ends
from bpe_core.engine._typedefs cimport pack_pair, pair_key_t, token_id_t
from bpe_core.engine._units cimport RankEntry, RankMerger

cdef extern from *:
    """
    /* A list of n slots left unset (PyList_New callocs them): the caller sets every slot before
       the list is seen by anyone, the cyclic collector included (it is untracked meanwhile).
       From 4 MiB of slots (half a million ids) on Linux, the 2 MiB pages inside them are advised
       to be huge (as numpy does for its large arrays, and grow_buffer for ours): a fresh list of
       the 1.2M ids of 5 MB of text faulted in 2,300 4 KiB pages, each call until glibc's
       allocator kept the memory, and the list is freed and made again on every call. */
    #if defined(__linux__)
    #include <sys/mman.h>
    #endif
    static void bpe_advise_huge(void* p, size_t size) {
    #if defined(__linux__) && defined(MADV_HUGEPAGE)
        const uintptr_t page = (uintptr_t)2 << 20;
        uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + size) & ~(page - 1);
        if (size >= ((size_t)4 << 20) && b > a)
            madvise((void*)a, b - a, MADV_HUGEPAGE);
    #else
        (void)p; (void)size;
    #endif
    }
    static PyObject* bpe_list_unset(Py_ssize_t n) {
        PyObject* op = PyList_New(0);
        PyObject** items;
        if (op == NULL)
            return op;
        PyObject_GC_UnTrack(op);
        if (n == 0)
            return op;
        items = (PyObject**)PyMem_Malloc((size_t)n * sizeof(PyObject*));
        if (items == NULL) {
            Py_DECREF(op);
            return PyErr_NoMemory();
        }
        bpe_advise_huge(items, (size_t)n * sizeof(PyObject*));
        ((PyListObject*)op)->ob_item = items;
        ((PyListObject*)op)->allocated = n;
        Py_SET_SIZE(op, n);
        return op;
    }
    """
    PyObject* list_unset "bpe_list_unset"(Py_ssize_t n)


cdef extern from *:
    """
    /* The UTF-8 of a str when it costs nothing: an ASCII str is its own UTF-8; another str has it
       only if CPython made and kept it before (PyUnicode_AsUTF8 and friends). NULL otherwise. */
    static const char* bpe_utf8_if_free(PyObject* s, Py_ssize_t* n) {
    #if PY_VERSION_HEX < 0x030C0000
        if (PyUnicode_READY(s) < 0) {
            PyErr_Clear();
            return NULL;
        }
    #endif
        if (PyUnicode_IS_ASCII(s)) {
            *n = PyUnicode_GET_LENGTH(s);
            return (const char*)PyUnicode_DATA(s);
        }
        if (PyUnicode_IS_COMPACT(s) && ((PyCompactUnicodeObject*)s)->utf8 != NULL) {
            *n = ((PyCompactUnicodeObject*)s)->utf8_length;
            return ((PyCompactUnicodeObject*)s)->utf8;
        }
        return NULL;
    }
    """
    const char* utf8_if_free "bpe_utf8_if_free"(object s, Py_ssize_t* n)


cdef extern from *:
    """
    /* The UTF-8 of a str's code points (PEP 393 kind 1, 2 or 4), eight / four / two code points
       at a time while they are ASCII, in one pass into a bytes object of the worst-case size (the
       pages past what is written are never touched), shrunk at the end (in place: mremap for a
       large one). CPython's own encoder takes one code point at a time: on 5 MB of English held-out
       text (a UCS-2 str) it took about a fifth of ``encode_to_numpy``'s time. (Two passes, the
       exact size first, were twice as slow as CPython: they read the 10 MB str from memory twice.)
       A surrogate (U+D800..U+DFFF) stops it: the caller leaves such a str to CPython's
       ``surrogateescape`` handler, whose rules (escaped bytes, errors) stay its own. */
    static inline char* bpe_utf8_put(char* o, uint32_t c) {
        if (c < 0x80) {
            *o++ = (char)c;
        } else if (c < 0x800) {
            *o++ = (char)(0xC0 | (c >> 6));
            *o++ = (char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            *o++ = (char)(0xE0 | (c >> 12));
            *o++ = (char)(0x80 | ((c >> 6) & 0x3F));
            *o++ = (char)(0x80 | (c & 0x3F));
        } else {
            *o++ = (char)(0xF0 | (c >> 18));
            *o++ = (char)(0x80 | ((c >> 12) & 0x3F));
            *o++ = (char)(0x80 | ((c >> 6) & 0x3F));
            *o++ = (char)(0x80 | (c & 0x3F));
        }
        return o;
    }
    #define BPE_UTF8_SLOW(c)  do { uint32_t c_ = (c); \
            if ((c_ & 0xFFFFF800u) == 0xD800u) return NULL; o = bpe_utf8_put(o, c_); } while (0)
    /* Writes the UTF-8 of the n code points at data to o; the end, or NULL at a surrogate. */
    static char* bpe_utf8_write(const void* data, int kind, Py_ssize_t n, char* o) {
        Py_ssize_t i = 0, j;
        uint64_t w;
        if (kind == 1) {
            const uint8_t* s = (const uint8_t*)data;
            for (; i + 8 <= n; i += 8) {
                memcpy(&w, s + i, 8);
                if (!(w & 0x8080808080808080ULL)) {
                    memcpy(o, &w, 8);
                    o += 8;
                } else {
                    for (j = 0; j < 8; j++)
                        o = bpe_utf8_put(o, s[i + j]);
                }
            }
            for (; i < n; i++)
                o = bpe_utf8_put(o, s[i]);
        } else if (kind == 2) {
            const uint16_t* s = (const uint16_t*)data;
            for (; i + 4 <= n; i += 4) {
                memcpy(&w, s + i, 8);
                if (!(w & 0xFF80FF80FF80FF80ULL)) {
                    o[0] = (char)s[i];
                    o[1] = (char)s[i + 1];
                    o[2] = (char)s[i + 2];
                    o[3] = (char)s[i + 3];
                    o += 4;
                } else {
                    for (j = 0; j < 4; j++)
                        BPE_UTF8_SLOW(s[i + j]);
                }
            }
            for (; i < n; i++)
                BPE_UTF8_SLOW(s[i]);
        } else {
            const uint32_t* s = (const uint32_t*)data;
            for (; i + 2 <= n; i += 2) {
                memcpy(&w, s + i, 8);
                if (!(w & 0xFFFFFF80FFFFFF80ULL)) {
                    o[0] = (char)s[i];
                    o[1] = (char)s[i + 1];
                    o += 2;
                } else {
                    BPE_UTF8_SLOW(s[i]);
                    BPE_UTF8_SLOW(s[i + 1]);
                }
            }
            for (; i < n; i++)
                BPE_UTF8_SLOW(s[i]);
        }
        return o;
    }
    /* A new bytes object holding the UTF-8 of str s (ready), or NULL without an error set when s
       holds a surrogate (or memory ran out: the caller's fallback raises then). */
    static PyObject* bpe_utf8_bytes(PyObject* s) {
        int kind = PyUnicode_KIND(s);
        Py_ssize_t n = PyUnicode_GET_LENGTH(s);
        PyObject* out;
        char* end;
        if (n > PY_SSIZE_T_MAX / 4)
            return NULL;
        out = PyBytes_FromStringAndSize(NULL, n * (kind == 1 ? 2 : kind == 2 ? 3 : 4));
        if (out == NULL) {
            PyErr_Clear();
            return NULL;
        }
        end = bpe_utf8_write(PyUnicode_DATA(s), kind, n, PyBytes_AS_STRING(out));
        if (end == NULL || _PyBytes_Resize(&out, end - PyBytes_AS_STRING(out)) < 0) {
            Py_XDECREF(out);
            PyErr_Clear();
            return NULL;
        }
        return out;
    }
    """
    PyObject* utf8_bytes "bpe_utf8_bytes"(object s)


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size)
    PyObject* list_new "PyList_New"(Py_ssize_t n)
    void list_set "PyList_SET_ITEM"(PyObject* l, Py_ssize_t i, PyObject* o)
    PyObject* long_from_u32 "PyLong_FromUnsignedLong"(unsigned long v)
    void incref "Py_INCREF"(PyObject* o)
    void decref "Py_DECREF"(PyObject* o)
    void gc_track "PyObject_GC_Track"(void* o)
    void gc_untrack "PyObject_GC_UnTrack"(void* o)


cdef extern from "_unicode_tables.h" nogil:
    uint16_t bpe_ut_flags(uint32_t cp)
    enum:
        BPE_UT_N
        BPE_UT_S


cdef extern from *:
    """
    #include <string.h>
    static const uint32_t BPE_NO_RANK = 0xFFFFFFFFu;
    static const uint32_t BPE_LATER_RANKS = 0x80000000u;  /* CrossSlot.rank: merged again later */
    static const uint64_t BPE_EMPTY_KEY = 0xFFFFFFFFFFFFFFFFull;
    static const uint64_t BPE_MUL1 = 0x9E3779B97F4A7C15ull;
    static const uint64_t BPE_MUL2 = 0xBF58476D1CE4E5B9ull;
    static const uint64_t BPE_MUL3 = 0x94D049BB133111EBull;
    /* 8 bytes as a little-endian integer: byte k lands in bits 8k..8k+7 on every platform. */
    static inline uint64_t bpe_enc_load_le64(const uint8_t* p) {
        uint64_t w;
        memcpy(&w, p, 8);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap64(w);
    #endif
        return w;
    }
    /* the index of the lowest set bit of x (x != 0) */
    #if defined(_MSC_VER)
    #include <intrin.h>
    static inline int bpe_enc_ctz64(uint64_t x) { unsigned long i; _BitScanForward64(&i, x); return (int)i; }
    #else
    static inline int bpe_enc_ctz64(uint64_t x) { return __builtin_ctzll(x); }
    #endif
    /* the low 8k bits set, k = 0 .. 8 (a key's head word masked to its first k bytes) */
    static const uint64_t bpe_enc_head_masks[9] = {
        0ull, 0xFFull, 0xFFFFull, 0xFFFFFFull, 0xFFFFFFFFull, 0xFFFFFFFFFFull, 0xFFFFFFFFFFFFull,
        0xFFFFFFFFFFFFFFull, 0xFFFFFFFFFFFFFFFFull};
    #if defined(_MSC_VER)
    #define BPE_ENC_NOINLINE __declspec(noinline)
    #else
    #define BPE_ENC_NOINLINE __attribute__((noinline))
    #endif
    /* stored[0:k] == p[0:k] (k >= 1), 8 bytes at a time. stored has 8 readable bytes past k (the
       arena's slack); p is read only below limit. Out of line: the probe loop stays small. */
    static BPE_ENC_NOINLINE int bpe_enc_tail_equal(const uint8_t* stored, const uint8_t* p, Py_ssize_t k,
                                                   const uint8_t* limit) {
        uint64_t a, b = 0;
        Py_ssize_t i;
        while (k >= 8) {
            if (bpe_enc_load_le64(stored) != bpe_enc_load_le64(p))
                return 0;
            stored += 8; p += 8; k -= 8;
        }
        if (k == 0)
            return 1;
        a = bpe_enc_load_le64(stored) & bpe_enc_head_masks[k];
        if (p + 8 <= limit)
            b = bpe_enc_load_le64(p) & bpe_enc_head_masks[k];
        else
            for (i = 0; i < k; i++)
                b |= (uint64_t)p[i] << (8 * i);
        return a == b;
    }
    /* An output buffer grown to cap bytes (used: bytes to keep); NULL when out of memory (old is
       then still valid). With huge, from 2 MiB up on Linux, the buffer is 2 MiB aligned and
       advised to use transparent huge pages (as numpy does for its large arrays): a new buffer then faults in
       a few 2 MiB pages instead of a 4 KiB page each 1,024 ids (with the reservation of
       BatchJob.run, a new encoder's first 5 MB of code: 19 ms instead of 24; reused: 17). Only
       for a buffer that will be filled (a batch worker's share): a huge page is committed whole,
       and the other paths (encode_corpus's bounded memory among them) reserve more than they
       write. */
    #if defined(__linux__)
    #include <sys/mman.h>
    #endif
    static void* bpe_enc_grow_buffer(void* old, size_t used, size_t cap, int huge) {
    #if defined(__linux__) && defined(MADV_HUGEPAGE)
        const size_t page = (size_t)2 << 20;
        if (huge && cap >= page) {
            void* p = NULL;
            if (posix_memalign(&p, page, cap) != 0)
                return NULL;
            madvise(p, cap & ~(page - 1), MADV_HUGEPAGE);
            if (used)
                memcpy(p, old, used);
            free(old);
            return p;
        }
    #endif
        return realloc(old, cap);
    }
    #if defined(_MSC_VER)
    #include <xmmintrin.h>
    #define bpe_enc_prefetch(p) _mm_prefetch((const char*)(p), _MM_HINT_T0)
    #else
    #define bpe_enc_prefetch(p) __builtin_prefetch((const void*)(p))
    #endif
    """
    const uint32_t NO_RANK "BPE_NO_RANK"
    const uint32_t LATER_RANKS "BPE_LATER_RANKS"
    const uint64_t EMPTY_KEY "BPE_EMPTY_KEY"
    const uint64_t MUL1 "BPE_MUL1"
    const uint64_t MUL2 "BPE_MUL2"
    const uint64_t MUL3 "BPE_MUL3"
    uint64_t load_le64 "bpe_enc_load_le64"(const uint8_t* p) noexcept nogil
    const uint64_t* HEAD_MASKS "bpe_enc_head_masks"
    bint tail_equal "bpe_enc_tail_equal"(const uint8_t* stored, const uint8_t* p, Py_ssize_t k,
                                         const uint8_t* limit) noexcept nogil
    void prefetch "bpe_enc_prefetch"(const void* p) noexcept nogil
    int ctz64 "bpe_enc_ctz64"(uint64_t x) noexcept nogil
    void* grow_buffer "bpe_enc_grow_buffer"(void* old, size_t used, size_t cap, int huge) noexcept nogil


cdef enum:
    SHORT_PIECE = 128          # longest piece merged by the linear scan; longer ones use the heap
    INLINE_IDS = 4             # ids held in the cache slot itself
    LIST_AHEAD = 16            # TokenTable._list prefetches the int of the id this many places on
    HAND_OVER_IDS = 1 << 16    # outputs this long are handed over, not copied (``_take_out``)
    BATCH = 16                 # pretokens hashed and prefetched ahead of their probes
    ENDS_CAP = 4096            # pretoken ends scanned ahead (32 KiB of int64: stays in L1/L2)
    HOLD_BACK = 2              # pretokens held back at an open end (see _encode_span)
    MIN_SLOTS = 4096
    ARENA_MAX = 16 << 20       # the cache is cleared when its arena would outgrow this
    RESERVE_MAX = 1 << 24      # ids a batch worker reserves at most before its first document
    ARENA_SLACK = 8            # readable bytes past arena_cap (a key tail is compared 8 bytes at once)


# ==== Hashing ================================================================================


cdef inline uint64_t _mix(uint64_t h) noexcept nogil:
    h ^= h >> 31
    h *= MUL2
    h ^= h >> 29
    return h


cdef inline uint64_t _load_head(const uint8_t* p, Py_ssize_t n, const uint8_t* limit) noexcept nogil:
    """The first ``min(n, 8)`` bytes at p, zero-padded, little-endian; never reads at or past limit."""
    cdef uint64_t w = 0
    cdef Py_ssize_t k, m = n if n < 8 else 8
    if p + 8 <= limit:
        return load_le64(p) & HEAD_MASKS[m]
    for k in range(m):
        w |= (<uint64_t>p[k]) << (8 * k)
    return w


cdef inline uint64_t _key_hash(const uint8_t* p, Py_ssize_t n, uint64_t w0, const uint8_t* limit) noexcept nogil:
    """Hash of the pretoken p[0:n] whose head word is w0 (multiply-xorshift, 8 bytes a step).

    Its top bits are what depends on every key bit (a product's high bits): a cache slot is
    ``h >> shift`` (Fibonacci hashing), so a short key costs two multiplies and no final mix.
    """
    cdef uint64_t h = (w0 ^ (<uint64_t>n * MUL3)) * MUL1
    cdef Py_ssize_t k = 8
    while k < n:
        h = _mix(h ^ _load_head(p + k, n - k, limit)) * MUL1
        k += 8
    return h


cdef inline Py_ssize_t _utf8_stable_end(const uint8_t* buf, Py_ssize_t s, Py_ssize_t e) noexcept nogil:
    """The largest ``c <= e`` such that decoding ``buf[s:c]`` cannot change when bytes follow.

    Equivalent to ``tokenizer._utf8_stable_end``: only an unfinished but so far valid multi-byte
    sequence at the very end is left out.
    """
    cdef Py_ssize_t k, i
    cdef uint8_t x, second, lo, hi
    cdef int need
    for k in range(1, 4):
        i = e - k
        if i < s:
            return e
        x = buf[i]
        if x < 0x80:
            return e
        if x < 0xC0:
            continue                    # continuation byte: look further back
        if x < 0xC2 or x > 0xF4:
            return e                    # never starts a valid sequence
        need = 2 if x < 0xE0 else (3 if x < 0xF0 else 4)
        if k >= need:
            return e                    # complete (or invalid: then final anyway)
        if k >= 2:
            second = buf[i + 1]
            lo, hi = 0x80, 0xBF
            if x == 0xE0:
                lo = 0xA0
            elif x == 0xED:
                hi = 0x9F
            elif x == 0xF0:
                lo = 0x90
            elif x == 0xF4:
                hi = 0x8F
            if second < lo or second > hi:
                return e
        return i
    return e


cdef inline CacheSlot* _find_slot(CacheSlot* slots, uint64_t mask, int shift, const uint8_t* arena,
                                  const uint8_t* p, Py_ssize_t n, uint64_t w0, uint64_t h,
                                  const uint8_t* limit) noexcept nogil:
    """The slot of a pretoken cache (``slots``, ``mask``, ``shift``, ``arena``) holding ``p[0:n]`` (``n >= 1``,
    head word w0, hash h; ``limit``: the end of the readable bytes at p), or NULL.

    A hit on a short key is one compare of the head word and one of the length; a longer key
    compares its tail 8 bytes at a time, out of line (``tail_equal``: the arena keeps 8 readable
    bytes past its end, ``ARENA_SLACK``). An empty slot (w0 0, meta 0) never matches the
    length of a key of ``n >= 1`` bytes, so the miss test comes after the match test.
    """
    cdef uint64_t slot = h >> shift
    cdef uint32_t want = <uint32_t>n << 12
    cdef uint32_t meta, n_ids
    cdef CacheSlot* sl
    while True:
        sl = &slots[slot]
        meta = sl.meta
        if sl.w0 == w0 and (meta & 0xFFF000u) == want:
            if n <= 8:
                return sl
            n_ids = meta & 0xFFF
            if tail_equal(arena + sl.off + (n_ids * sizeof(token_id_t) if n_ids > INLINE_IDS else 0),
                          p + 8, n - 8, limit):
                return sl
        elif meta == 0:
            return NULL
        slot = (slot + 1) & mask


# ==== Rank table =============================================================================


cdef enum:
    NARROW_ID = 0x1FFFFF       # ids below this fit the narrow rank slot (21 bits; all ones: free)
    NARROW_RANK = 0x3FFFFF     # ranks below this fit it (22 bits)


cdef inline uint64_t _narrow_key(pair_key_t key) noexcept nogil:
    """A pair's narrow slot without its rank: ``(left << 43) | (right << 22)``."""
    return ((key >> 32) << 43) | ((key & 0x1FFFFF) << 22)



cdef class RankTable:
    """Pair of token ids -> (merge rank, id of the merged token), in an open-addressing table.

    Args:
        lefts, rights: uint32, one entry per merge (index = rank): the canonical ids of the merge's
            two parts; ``0xFFFFFFFF`` in ``lefts`` marks a merge that can never apply (a part is not
            in the vocabulary) and is skipped.
        merged_ids: uint32, the canonical id of each merge's result.
        byte_ids: uint32[256], the id of each single-byte token.

    The slots are one 64-bit word each, ``(left << 43) | (right << 22) | rank`` (``narrow``),
    when every id is below 2^21 - 1 and every rank below 2^22 - 1 (all real vocabularies): half
    the bytes of the 16-byte ``RankSlot`` layout kept for larger ones, so more of the table stays
    in cache (a miss of the merge loop is two dependent lookups a merge).

    When a pair occurs twice in the merges, its first (lowest) rank is what ``rank_of`` gives;
    the later ones are kept aside for ``rank_after`` (a pair made again after its first rank has
    passed, as ``reference.encode`` replays the merges). The four arrays are all a ``RankTable`` needs, so worker processes
    receive them (``Tokenizer._encoder_spec``) instead of the vocabulary.

    >>> import numpy as np
    >>> t = RankTable(np.array([97], np.uint32), np.array([97], np.uint32),
    ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
    >>> t.lookup(97, 97), t.lookup(97, 98)
    ((0, 256), None)
    """

    def __init__(self, const uint32_t[::1] lefts, const uint32_t[::1] rights,
                 const uint32_t[::1] merged_ids, const uint32_t[::1] byte_ids):
        cdef Py_ssize_t n = lefts.shape[0], r, i
        cdef uint64_t cap = 16, slot
        cdef pair_key_t key
        cdef vector[cpp_pair[pair_key_t, uint32_t]] later
        cdef RankSlot empty
        if rights.shape[0] != n or merged_ids.shape[0] != n:
            raise ValueError("lefts, rights and merged_ids must have the same length")
        if byte_ids.shape[0] != 256:
            raise ValueError("byte_ids must have 256 entries")
        if n >= <Py_ssize_t>NO_RANK:
            raise ValueError("too many merges")
        self.shift = 60
        while cap < <uint64_t>(2 * n):
            cap <<= 1
            self.shift -= 1
        self.slot_mask = cap - 1
        empty.key = EMPTY_KEY
        empty.rank = NO_RANK
        empty.merged = 0
        self.slots.assign(cap, empty)
        self.merged_ids.assign(n, 0)
        for i in range(256):
            self.byte_ids[i] = byte_ids[i]
        self.n_merges = n
        self.n_pairs = 0
        with nogil:
            for r in range(n):
                self.merged_ids[r] = merged_ids[r]
                if lefts[r] == NO_RANK or rights[r] == NO_RANK:
                    continue
                key = pack_pair(lefts[r], rights[r])
                slot = (key * MUL1) >> self.shift
                while self.slots[slot].key != EMPTY_KEY and self.slots[slot].key != key:
                    slot = (slot + 1) & self.slot_mask
                if self.slots[slot].key == EMPTY_KEY:   # first rank of a pair wins
                    self.slots[slot].key = key
                    self.slots[slot].rank = <uint32_t>r
                    self.slots[slot].merged = merged_ids[r]
                    self.n_pairs += 1
                else:                                   # the same pair again: kept aside
                    later.push_back(cpp_pair[pair_key_t, uint32_t](key, <uint32_t>r))
            if not later.empty():
                cpp_sort(later.begin(), later.end())
                for i in range(<Py_ssize_t>later.size()):
                    self.later_keys.push_back(later[i].first)
                    self.later_ranks.push_back(later[i].second)
            # The narrow layout (8 bytes a slot, the same positions) when every id and rank fits;
            # the wide slots are then dropped.
            # A query pair is made of byte ids and merged ids only: those must fit too (a larger
            # id would alias a stored pair once truncated).
            self.narrow = n < <Py_ssize_t>NARROW_RANK
            for i in range(256):
                if byte_ids[i] >= NARROW_ID:
                    self.narrow = False
            for r in range(n):
                if merged_ids[r] >= NARROW_ID:
                    self.narrow = False
            for slot in range(cap):
                key = self.slots[slot].key
                if key != EMPTY_KEY and ((key >> 32) >= NARROW_ID or (key & 0xFFFFFFFFu) >= NARROW_ID):
                    self.narrow = False
            if self.narrow:
                self.words.assign(cap, EMPTY_KEY)
                for slot in range(cap):
                    key = self.slots[slot].key
                    if key != EMPTY_KEY:
                        self.words[slot] = _narrow_key(key) | self.slots[slot].rank
                self.slots = vector[RankSlot]()
            # every pair of two bytes, looked up directly (a merge loop's first lookups; 256 KiB)
            self.byte_ranks.resize(65536)
            for i in range(65536):
                self.byte_ranks[i] = self.rank_of(self.byte_ids[i >> 8], self.byte_ids[i & 0xFF])

    cdef uint32_t rank_of(self, token_id_t left, token_id_t right) noexcept nogil:
        cdef pair_key_t key = pack_pair(left, right)
        return self.rank_at(self.home_of(key), key)

    cdef uint64_t home_of(self, pair_key_t key) noexcept nogil:
        """The home slot of ``key`` (where its probe starts): ``prefetch_home`` it, then ``rank_at``."""
        return (key * MUL1) >> self.shift

    cdef void prefetch_home(self, uint64_t slot) noexcept nogil:
        if self.narrow:
            prefetch(self.words.data() + slot)
        else:
            prefetch(self.slots.data() + slot)

    cdef uint32_t rank_at(self, uint64_t slot, pair_key_t key) noexcept nogil:
        """The first rank of ``key`` probing from its home slot (``home_of``), or NO_RANK."""
        cdef const RankSlot* base
        cdef const uint64_t* words
        cdef uint64_t want, w
        if self.narrow:
            words = self.words.data()
            want = _narrow_key(key)
            while True:
                w = words[slot]
                if (w & ~(<uint64_t>NARROW_RANK)) == want:
                    return <uint32_t>(w & NARROW_RANK)
                if w == EMPTY_KEY:
                    return NO_RANK
                slot = (slot + 1) & self.slot_mask
        base = self.slots.data()
        while True:
            if base[slot].key == key:
                return base[slot].rank
            if base[slot].key == EMPTY_KEY:
                return NO_RANK
            slot = (slot + 1) & self.slot_mask

    cdef uint32_t rank_after(self, token_id_t left, token_id_t right, uint32_t after) noexcept nogil:
        """The first rank > ``after`` that merges the pair, or NO_RANK: the rank at which the
        reference's replay merges a pair made while rank ``after`` was applied."""
        cdef uint32_t r = self.rank_of(left, right)
        cdef pair_key_t key
        cdef Py_ssize_t lo = 0, hi = <Py_ssize_t>self.later_keys.size(), mid
        if r == NO_RANK or r > after:
            return r
        if hi == 0:
            return NO_RANK
        key = pack_pair(left, right)
        while lo < hi:                              # the first (key, rank) >= (key, after + 1)
            mid = (lo + hi) >> 1
            if self.later_keys[mid] < key or (self.later_keys[mid] == key and self.later_ranks[mid] <= after):
                lo = mid + 1
            else:
                hi = mid
        if lo < <Py_ssize_t>self.later_keys.size() and self.later_keys[lo] == key:
            return self.later_ranks[lo]
        return NO_RANK

    def lookup_after(self, token_id_t left, token_id_t right, uint32_t after):
        """``(rank, merged_id)`` of the pair's first rank after ``after``, or None."""
        cdef uint32_t r = self.rank_after(left, right, after)
        if r == NO_RANK:
            return None
        return int(r), int(self.merged_ids[r])

    def lookup(self, token_id_t left, token_id_t right):
        """``(rank, merged_id)`` of the pair, or None when it is not a merge."""
        cdef uint32_t r = self.rank_of(left, right)
        if r == NO_RANK:
            return None
        return int(r), int(self.merged_ids[r])


# ==== Special tokens =========================================================================


cdef class SpecialTable:
    """Special tokens to split out before pre-tokenization: leftmost match, longest first.

    Args:
        tokens: the special tokens as non-empty, distinct ``bytes``.
        ids: the id of each.

    Equivalent to ``patterns.specials_regex(tokens).finditer`` (alternatives sorted longest first):
    scanning left to right, the first position where any token matches wins, and there the
    longest token that matches.

    >>> t = SpecialTable([b"<s>", b"<s><s>"], [1, 2])
    >>> t.find_all(b"a<s><s><s>")
    [(1, 7, 2), (7, 10, 1)]
    """

    def __init__(self, tokens, ids):
        tokens = [bytes(t) for t in tokens]
        ids = [int(i) for i in ids]
        if len(tokens) != len(ids):
            raise ValueError("tokens and ids must have the same length")
        if any(not t for t in tokens) or len(set(tokens)) != len(tokens):
            raise ValueError("special tokens must be non-empty and distinct")
        order = sorted(range(len(tokens)), key=lambda k: (-len(tokens[k]), tokens[k]))
        cdef Py_ssize_t k, off = 0
        for k in order:
            self.offsets.push_back(off)
            self.lengths.push_back(len(tokens[k]))
            self.ids.push_back(<token_id_t>ids[k])
            for b in tokens[k]:
                self.data.push_back(<uint8_t>b)
            off += len(tokens[k])
        memset(self.c.first, 0, sizeof(self.c.first))
        firsts = {t[0] for t in tokens}
        for b in firsts:
            self.c.first[b] = 1
        self.c.only_first = next(iter(firsts)) if len(firsts) == 1 else -1
        self.c.n = len(tokens)
        self.c.data = self.data.data()
        self.c.offsets = self.offsets.data()
        self.c.lengths = self.lengths.data()
        self.c.ids = self.ids.data()

    def find_all(self, const uint8_t[::1] buf):
        """Every match ``(start, end, id)`` in ``buf``, left to right (for tests)."""
        cdef Py_ssize_t pos = 0, n = buf.shape[0], ms, me
        cdef token_id_t mid
        out = []
        while n and _find_special(&self.c, &buf[0], pos, n, n, &ms, &me, &mid):
            out.append((ms, me, int(mid)))
            pos = me
        return out


cdef bint _find_special(const Specials* sp, const uint8_t* s, Py_ssize_t pos, Py_ssize_t window,
                        Py_ssize_t end, Py_ssize_t* ms, Py_ssize_t* me, token_id_t* mid) noexcept nogil:
    """The leftmost special token starting in ``[pos, window)`` and ending by ``end``, longest first.

    Sets ``*ms, *me, *mid`` and returns True, or returns False when there is none.
    """
    cdef Py_ssize_t i = pos, k, length
    cdef const uint8_t* hit
    if sp.n == 0:
        return False
    while i < window:
        if sp.only_first >= 0:
            hit = <const uint8_t*>memchr(s + i, sp.only_first, window - i)
            if hit == NULL:
                return False
            i = hit - s
        else:
            while i < window and not sp.first[s[i]]:
                i += 1
            if i >= window:
                return False
        for k in range(sp.n):
            length = sp.lengths[k]
            if i + length <= end and memcmp(s + i, sp.data + sp.offsets[k], length) == 0:
                ms[0] = i
                me[0] = i + length
                mid[0] = sp.ids[k]
                return True
        i += 1
    return False


# ==== Encoder ================================================================================


cdef inline void _out_taken(Encoder enc) noexcept:
    """The ids were taken out of ``enc``'s buffer: empty it, and free it when huge (not kept alive
    between calls)."""
    enc.out_n = 0
    if enc.out_cap > (1 << 24):
        free(enc.out_buf)
        enc.out_buf = NULL
        enc.out_cap = 0


cdef class Encoder:
    """Encodes text: special tokens, pre-tokenization, merging by rank, with a pretoken -> ids cache.

    One per thread (it owns the cache and scratch buffers).

    Args:
        table: the ``RankTable``.
        max_entries: the cache holds at most this many pretokens, then is cleared whole.
        max_cached_len: pretokens longer than this (bytes, at most 4095) are not cached.
        singles: the pieces proven to encode as one token (``build_singles`` over the same table),
            looked up when a piece is not in the cache, before merging it; None: merge every miss.

    Equivalent to ``reference.encode_pretoken`` followed by ``reference.token_ids`` per pretoken,
    and to ``reference.encode`` for ``encode_text``.

    >>> import numpy as np
    >>> t = RankTable(np.array([97], np.uint32), np.array([97], np.uint32),
    ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
    >>> enc = Encoder(t)
    >>> enc.encode_piece(b"aaa")
    [256, 97]
    >>> enc.encode_pieces(b"aaaaa", np.array([3, 5], np.int64)).tolist()   # b"aaa", b"aa"
    [256, 97, 256]
    >>> ids, stop, done = enc.encode_text(b"aaa aa<s>", 0, 9, 0, SpecialTable([b"<s>"], [257]))
    >>> ids.tolist(), stop, done                        # "aaa", " aa" (b" " + aa), "<s>"
    ([256, 97, 32, 256, 257], 9, True)
    """

    def __cinit__(self):
        self.slots_mem = NULL
        self.slots = NULL
        self.arena = NULL
        self.out_buf = NULL
        self.ends_buf = NULL

    def __init__(self, RankTable table not None, Py_ssize_t max_entries=1 << 18,
                 Py_ssize_t max_cached_len=256, Encoder singles=None):
        if max_entries < 1 or max_cached_len < 0:
            raise ValueError("max_entries must be positive and max_cached_len non-negative")
        if max_cached_len > 4095:
            raise ValueError("max_cached_len is at most 4095")
        if singles is not None and singles.table is not table:
            raise ValueError("singles must be built over the same rank table")
        self.table = table
        self.shared = None
        self.singles = singles
        self.single_hits = 0
        self.max_entries = max_entries
        self.max_cached_len = max_cached_len
        self.n_entries = 0
        self.misses = 0
        self.arena_size = 0
        self.arena_cap = 0
        self.out_n = 0
        self.out_cap = 0
        self.ends_buf = <int64_t*>PyMem_Malloc(ENDS_CAP * sizeof(int64_t))
        if self.ends_buf == NULL:
            raise MemoryError()
        # The slot table starts small (128 KiB stays in L2) and doubles at 2/3 load.
        if self._slots_alloc(MIN_SLOTS) < 0:
            raise MemoryError()

    def __dealloc__(self):
        free(self.slots_mem)
        free(self.arena)
        free(self.out_buf)
        PyMem_Free(self.ends_buf)

    # ---- merging one pretoken ----------------------------------------------------------------

    cdef Py_ssize_t _merge_scan(self, const uint8_t* piece, Py_ssize_t n, token_id_t* out) noexcept nogil:
        """Merge ``piece[0:n]`` (n <= SHORT_PIECE) by repeated min-rank scans; ids to ``out``.

        One merge a step, as the heap path: the leftmost pair of the lowest rank ``r`` is merged,
        the tail moves down one place and the two pairs that touch the new token are looked up (a
        pair made with a rank below ``r`` has been passed by the replay: ``rank_after``). This is
        the reference's "every occurrence of ``r``, left to right, then the next rank": a pair that
        a merge makes never has rank ``r`` (its token is longer than either part of ``r``'s pair,
        and ids are canonical by bytes), so the next occurrence of ``r`` is the next one the
        reference merges. A step costs a scan of the ranks and a short move, not a rewrite of the
        piece. The first ranks, of pairs of two bytes, are read from ``RankTable.byte_ranks``
        (indexed by the two bytes: no hash, no probe).
        """
        cdef token_id_t tok[SHORT_PIECE]
        cdef uint32_t rk[SHORT_PIECE]
        cdef Py_ssize_t m = n, i, j
        cdef uint32_t r, nr
        for i in range(m):
            tok[i] = self.table.byte_ids[piece[i]]
        if m <= 1:
            memcpy(out, tok, m * sizeof(token_id_t))
            return m
        for i in range(m - 1):
            rk[i] = self.table.byte_ranks[(<uint32_t>piece[i] << 8) | piece[i + 1]]
        rk[m - 1] = NO_RANK
        while m > 1:
            r = NO_RANK                         # 1. the leftmost lowest rank
            i = 0
            for j in range(m - 1):
                if rk[j] < r:
                    r = rk[j]
                    i = j
            if r == NO_RANK:
                break
            tok[i] = self.table.merged_ids[r]   # 2. merge it; the tail moves down one place
            for j in range(i + 1, m - 1):
                tok[j] = tok[j + 1]
                rk[j] = rk[j + 1]
            m -= 1
            rk[m - 1] = NO_RANK
            if i + 1 < m:                       # 3. the pairs around the new token
                nr = self.table.rank_of(tok[i], tok[i + 1])
                if nr < r:                      # made after its rank: the replay has passed it
                    nr = self.table.rank_after(tok[i], tok[i + 1], r)
                rk[i] = nr
            if i > 0:
                nr = self.table.rank_of(tok[i - 1], tok[i])
                if nr < r:
                    nr = self.table.rank_after(tok[i - 1], tok[i], r)
                rk[i - 1] = nr
        memcpy(out, tok, m * sizeof(token_id_t))
        return m

    cdef Py_ssize_t _merge_heap(self, const uint8_t* piece, Py_ssize_t n, token_id_t* out) except -1 nogil:
        """Merge ``piece[0:n]`` with a linked list and a lazy min-heap; ids to ``out`` (room for n)."""
        cdef Py_ssize_t i, p, q, nq, pp, m = 0
        cdef uint32_t r, cur = 0, nr
        cdef uint64_t top
        self.toks.resize(n)
        self.pair_ranks.resize(n)
        self.nexts.resize(n)
        self.prevs.resize(n)
        self.heap.clear()
        cdef token_id_t* tok = self.toks.data()
        cdef uint32_t* prk = self.pair_ranks.data()
        cdef int64_t* nxt = self.nexts.data()
        cdef int64_t* prv = self.prevs.data()
        for i in range(n):
            tok[i] = self.table.byte_ids[piece[i]]
            nxt[i] = i + 1
            prv[i] = i - 1
        prk[n - 1] = NO_RANK
        # Heap entries are complemented keys, so std's max-heap pops the lowest (rank, position).
        for i in range(n - 1):
            prk[i] = self.table.rank_of(tok[i], tok[i + 1])
            if prk[i] != NO_RANK:
                self.heap.push_back(~((<uint64_t>prk[i] << 32) | <uint64_t>i))
                push_heap(self.heap.begin(), self.heap.end())
        while not self.heap.empty():
            top = ~self.heap.front()
            r = <uint32_t>(top >> 32)
            p = <Py_ssize_t>(top & 0xFFFFFFFFu)
            cur = r
            pop_heap(self.heap.begin(), self.heap.end())
            self.heap.pop_back()
            if prk[p] != r:
                continue    # stale: p is dead or its pair changed
            q = nxt[p]
            nq = nxt[q]
            tok[p] = self.table.merged_ids[r]
            nxt[p] = nq
            if nq < n:
                prv[nq] = p
            prk[q] = NO_RANK
            # The pairs (p, nq) and (prv[p], p) are new.
            # (a pair made after its rank has passed waits for its next rank: rank_after)
            nr = self.table.rank_of(tok[p], tok[nq]) if nq < n else NO_RANK
            if nr < cur:
                nr = self.table.rank_after(tok[p], tok[nq], cur)
            prk[p] = nr
            self._push(nr, p)
            pp = prv[p]
            if pp >= 0:
                nr = self.table.rank_of(tok[pp], tok[p])
                if nr < cur:
                    nr = self.table.rank_after(tok[pp], tok[p], cur)
                prk[pp] = nr
                self._push(nr, pp)
        p = 0
        while p < n:
            out[m] = tok[p]
            m += 1
            p = nxt[p]
        return m

    cdef int _push(self, uint32_t rank, Py_ssize_t pos) except -1 nogil:
        if rank == NO_RANK:
            return 0
        self.heap.push_back(~((<uint64_t>rank << 32) | <uint64_t>pos))
        push_heap(self.heap.begin(), self.heap.end())
        return 0

    cdef Py_ssize_t _merge(self, const uint8_t* piece, Py_ssize_t n, token_id_t* out) except -1 nogil:
        if n <= SHORT_PIECE:
            return self._merge_scan(piece, n, out)
        return self._merge_heap(piece, n, out)

    # ---- the pretoken cache ------------------------------------------------------------------

    cdef int _slots_alloc(self, Py_ssize_t n_slots) noexcept nogil:
        """Fresh zeroed slots, aligned to 64 bytes so a slot never straddles two cache lines."""
        cdef void* mem = calloc(n_slots * sizeof(CacheSlot) + 64, 1)
        if mem == NULL:
            return -1
        free(self.slots_mem)
        self.slots_mem = mem
        self.slots = <CacheSlot*>((<uintptr_t>mem + 63) & ~(<uintptr_t>63))
        self.n_slots = n_slots
        self.cache_mask = <uint64_t>(n_slots - 1)
        self.cache_shift = 64
        while n_slots > 1:
            n_slots >>= 1
            self.cache_shift -= 1
        return 0

    cdef const uint8_t* _slot_tail(self, const CacheSlot* sl) noexcept nogil:
        """The key bytes after the first 8 of a slot whose key is longer than 8 bytes."""
        cdef uint32_t n_ids = sl.meta & 0xFFF
        return self.arena + sl.off + (n_ids * sizeof(token_id_t) if n_ids > INLINE_IDS else 0)

    cdef CacheSlot* _cache_find(self, const uint8_t* p, Py_ssize_t n, uint64_t w0,
                                       uint64_t h) noexcept nogil:
        """The slot holding pretoken ``p[0:n]`` (head word w0, hash h), or NULL."""
        return _find_slot(self.slots, self.cache_mask, self.cache_shift, self.arena, p, n, w0, h, p + n)

    cdef int _cache_insert(self, const uint8_t* p, Py_ssize_t n, uint64_t w0, uint64_t h,
                           const token_id_t* ids, Py_ssize_t n_ids) noexcept nogil:
        """Remember ``p[0:n] -> ids``; clears the cache first when it is full. 0, or -1 (no memory:
        the entry is simply not cached)."""
        cdef Py_ssize_t record = 0, cap
        cdef uint64_t slot
        cdef CacheSlot* sl
        cdef uint8_t* grown
        if n_ids > INLINE_IDS:
            record += n_ids * sizeof(token_id_t)
        if n > 8:
            record += n - 8
        record = (record + 3) & ~(<Py_ssize_t>3)         # records start 4-byte aligned
        if self.n_entries >= self.max_entries or self.arena_size + record > ARENA_MAX:
            self._cache_clear()
        elif 3 * (self.n_entries + 1) > 2 * self.n_slots:
            if self._cache_grow() < 0:
                return -1
        if record and self.arena_size + record > self.arena_cap:
            cap = max(2 * self.arena_cap, self.arena_size + record, <Py_ssize_t>(64 << 10))
            grown = <uint8_t*>realloc(self.arena, cap + ARENA_SLACK)
            if grown == NULL:
                return -1
            self.arena = grown
            self.arena_cap = cap
        slot = h >> self.cache_shift
        while self.slots[slot].meta != 0:
            slot = (slot + 1) & self.cache_mask
        sl = &self.slots[slot]
        sl.w0 = w0
        sl.meta = (<uint32_t>n << 12) | <uint32_t>n_ids
        sl.off = <uint32_t>self.arena_size
        memset(sl.ids, 0, sizeof(sl.ids))
        if n_ids > INLINE_IDS:
            memcpy(self.arena + self.arena_size, ids, n_ids * sizeof(token_id_t))
            if n > 8:
                memcpy(self.arena + self.arena_size + n_ids * sizeof(token_id_t), p + 8, n - 8)
        else:
            memcpy(sl.ids, ids, n_ids * sizeof(token_id_t))
            if n > 8:
                memcpy(self.arena + self.arena_size, p + 8, n - 8)
        self.arena_size += record
        self.n_entries += 1
        return 0

    cdef int _cache_grow(self) noexcept nogil:
        """Double the slots and re-insert every entry (hashes are recomputed from the keys)."""
        cdef void* old_mem = self.slots_mem
        cdef CacheSlot* old = self.slots
        cdef Py_ssize_t old_n = self.n_slots, k, n, j
        cdef uint8_t key[4096]
        cdef uint64_t h, slot
        self.slots_mem = NULL
        if self._slots_alloc(2 * old_n) < 0:
            self.slots_mem = old_mem
            self.slots = <CacheSlot*>((<uintptr_t>old_mem + 63) & ~(<uintptr_t>63))
            self.n_slots = old_n
            self.cache_mask = <uint64_t>(old_n - 1)
            return -1
        for k in range(old_n):
            if old[k].meta == 0:
                continue
            n = old[k].meta >> 12
            if n <= 8:
                h = _key_hash(key, n, old[k].w0, key)   # w0 is the whole key
            else:
                for j in range(8):
                    key[j] = <uint8_t>(old[k].w0 >> (8 * j))
                memcpy(key + 8, self._slot_tail(&old[k]), n - 8)
                h = _key_hash(key, n, old[k].w0, key + n)
            slot = h >> self.cache_shift
            while self.slots[slot].meta != 0:
                slot = (slot + 1) & self.cache_mask
            self.slots[slot] = old[k]
        free(old_mem)
        return 0

    cdef void _cache_clear(self) noexcept nogil:
        memset(self.slots, 0, self.n_slots * sizeof(CacheSlot))
        self.arena_size = 0
        self.n_entries = 0

    # ---- encoding runs of pretokens ----------------------------------------------------------

    cdef int _reserve_out(self, Py_ssize_t extra, bint huge=False) except -1 nogil:
        """Room for ``extra`` more ids, plus INLINE_IDS of slack (cache hits copy a whole slot);
        ``huge``: the room will be filled, use huge pages (``grow_buffer``)."""
        cdef Py_ssize_t need = self.out_n + extra + INLINE_IDS, cap
        cdef token_id_t* grown
        if need <= self.out_cap:
            return 0
        cap = max(2 * self.out_cap, need, <Py_ssize_t>4096)
        grown = <token_id_t*>grow_buffer(self.out_buf, self.out_n * sizeof(token_id_t), cap * sizeof(token_id_t),
                                         huge)
        if grown == NULL:
            with gil:
                raise MemoryError()
        self.out_buf = grown
        self.out_cap = cap
        return 0

    cdef int _emit_pieces(self, const uint8_t* s, Py_ssize_t a, const int64_t* ends, Py_ssize_t count,
                          const uint8_t* limit, int64_t* starts) except -1 nogil:
        """Append the ids of the pretokens ``s[a:ends[0]]``, ``s[ends[0]:ends[1]]``, ... to ``out``.

        ``limit`` is the end of the readable buffer (8-byte loads never cross it). Each batch of
        ``BATCH`` pretokens is hashed and its slots prefetched before the first probe. A piece is
        looked up in ``shared`` (during a batch job) and in this encoder's cache, then
        (``_cache_miss``) in ``singles``; only a piece found nowhere is merged. ``starts``
        (NULL, or room for ``count``): where each pretoken's ids start in ``out``.

        A piece of one byte takes the same path (its id is cached as any other piece's): a
        branch on the length of each piece is mispredicted on real text (a quarter of the pieces
        of code are one byte, at random), and the uniform path was ~30% faster per CPU-second
        than the special case, though it hashes and probes those pieces too.
        """
        cdef uint64_t hs[BATCH]
        cdef uint64_t w0s[BATCH]
        cdef Py_ssize_t base, m, j, q, e, n, p0
        cdef Py_ssize_t max_len = self.max_cached_len
        cdef Py_ssize_t n_out = self.out_n      # kept in a register, stored back at the end
        cdef CacheSlot* sl
        cdef token_id_t* out
        cdef uint32_t n_ids
        cdef bint has_shared = self.shared is not None
        # the cache probed first: the shared one during a batch job (most pieces are there; ours
        # is asked next, in _cache_miss), else ours (then refreshed after each miss: it may grow)
        cdef CacheSlot* fslots = self.shared.slots if has_shared else self.slots
        cdef uint64_t fmask = self.shared.cache_mask if has_shared else self.cache_mask
        cdef int fshift = self.shared.cache_shift if has_shared else self.cache_shift
        cdef const uint8_t* farena = self.shared.arena if has_shared else self.arena
        if count <= 0:
            return 0
        self._reserve_out(ends[count - 1] - a)
        out = self.out_buf
        p0 = a
        base = 0
        while base < count:
            m = count - base if count - base < BATCH else BATCH
            q = p0
            for j in range(m):                      # 1. hash, prefetch
                e = ends[base + j]
                n = e - q
                if n >= 1 and n <= max_len:
                    w0s[j] = _load_head(s + q, n, limit)
                    hs[j] = _key_hash(s + q, n, w0s[j], limit)
                    prefetch(&fslots[hs[j] >> fshift])
                q = e
            q = p0
            for j in range(m):                      # 2. probe, emit
                e = ends[base + j]
                n = e - q
                if starts != NULL:
                    starts[base + j] = n_out
                if n > max_len:
                    n_out += self._merge(s + q, n, out + n_out)
                elif n >= 1:
                    sl = _find_slot(fslots, fmask, fshift, farena, s + q, n, w0s[j], hs[j], limit)
                    if sl != NULL:
                        n_ids = sl.meta & 0xFFF
                        if n_ids <= INLINE_IDS:
                            memcpy(out + n_out, sl.ids, INLINE_IDS * sizeof(token_id_t))
                        else:
                            memcpy(out + n_out, farena + sl.off, n_ids * sizeof(token_id_t))
                        n_out += n_ids
                    else:
                        n_out += self._cache_miss(s + q, n, w0s[j], hs[j], out + n_out)
                        if not has_shared:
                            fslots = self.slots
                            fmask = self.cache_mask
                            fshift = self.cache_shift
                            farena = self.arena
                q = e
            p0 = q
            base += m
        self.out_n = n_out
        return 0

    cdef Py_ssize_t _cache_miss(self, const uint8_t* p, Py_ssize_t n, uint64_t w0, uint64_t h,
                                token_id_t* out) except -1 nogil:
        """The ids of a piece not in the cache probed first (``_emit_pieces``), to ``out`` (room for
        ``n + INLINE_IDS``); returns their number. During a batch job that was the shared cache and
        ours is asked next; then the proven single tokens, else the piece is merged; what was not
        in ours is added to it."""
        cdef CacheSlot* sl
        cdef uint32_t n_ids
        cdef Py_ssize_t got
        if self.shared is not None:
            sl = self._cache_find(p, n, w0, h)
            if sl != NULL:
                n_ids = sl.meta & 0xFFF
                if n_ids <= INLINE_IDS:
                    memcpy(out, sl.ids, INLINE_IDS * sizeof(token_id_t))
                else:
                    memcpy(out, self.arena + sl.off, n_ids * sizeof(token_id_t))
                return n_ids
        sl = NULL
        if self.singles is not None:
            sl = self.singles._cache_find(p, n, w0, h)
        if sl != NULL:
            self.single_hits += 1
            out[0] = sl.ids[0]
            got = 1
        else:
            self.misses += 1
            got = self._merge(p, n, out)
        self._cache_insert(p, n, w0, h, out, got)
        return got

    cdef Py_ssize_t _encode_span(self, int pattern_id, const uint8_t* s, Py_ssize_t a, Py_ssize_t b,
                                 bint closed, const uint8_t* limit) except -1 nogil:
        """Pre-tokenize and encode the text ``s[a:b]`` (no special token in it); returns where it stopped.

        ``closed``: the text ends at ``b`` (a special token or the end of the input follows), so
        every pretoken is final and the result is ``b``. Otherwise the text may continue after
        ``b``: an unfinished UTF-8 character at the end and the last ``HOLD_BACK`` pretokens are
        left out (for the named patterns a pretoken is decided by the text up to one character past
        its end, so only the last one can change; two is the margin), and the result is where the
        held-back text starts. Equivalent to ``Tokenizer._text_ends`` + ``encode_pieces``.
        """
        cdef int64_t* ends = self.ends_buf
        cdef Py_ssize_t p, got, total, use, k, carry = 0, piece_start = a
        if not closed:
            b = _utf8_stable_end(s, a, b)
            if b <= a:
                return a
        p = a
        while p < b:
            got = _split_ends(pattern_id, s, &p, b, ends + carry, ENDS_CAP - carry)
            total = carry + got
            use = total
            if not closed:
                use = total - HOLD_BACK if total > HOLD_BACK else 0
            if use > 0:
                self._emit_pieces(s, piece_start, ends, use, limit, NULL)
                piece_start = ends[use - 1]
            carry = total - use
            for k in range(carry):
                ends[k] = ends[use + k]
        return b if closed else piece_start

    cdef int _encode_text(self, int pattern_id, const Specials* sp, const uint8_t* s, Py_ssize_t n_buf,
                          Py_ssize_t pos, Py_ssize_t end, Py_ssize_t max_bytes, bint open_end,
                          Py_ssize_t* stop, bint* done) except -1 nogil:
        """The loop of ``encode_text``: special tokens, then the text before each, window by window."""
        cdef const uint8_t* limit = s + n_buf
        cdef Py_ssize_t start = pos, window, text_end, ms = 0, me = 0, q
        cdef token_id_t mid = 0
        cdef bint found, closed
        while pos < end:
            window = end if (max_bytes <= 0 or end - pos <= max_bytes) else pos + max_bytes
            found = sp != NULL and _find_special(sp, s, pos, window, end, &ms, &me, &mid)
            if found:
                text_end = ms
                closed = True
            else:
                text_end = window
                closed = window == end and not open_end
            if text_end > pos:
                q = self._encode_span(pattern_id, s, pos, text_end, closed, limit)
                if not closed:
                    # The text goes on after the window (or, at an open end, after `end`): what is
                    # held back waits for the next call, with a wider window or more input.
                    stop[0] = q
                    done[0] = window == end
                    return 0
                pos = text_end
            if found:
                self._reserve_out(1)
                self.out_buf[self.out_n] = mid
                self.out_n += 1
                pos = me
            if max_bytes > 0 and pos - start >= max_bytes:
                break
        stop[0] = pos
        done[0] = pos >= end
        return 0

    cdef object _take_out(self):
        """The ids written so far as a new uint32 ndarray; keeps the buffer unless it is huge. From
        ``HAND_OVER_IDS`` ids on, the buffer itself becomes the array (no copy; the next call
        starts a new one)."""
        if self.out_n >= HAND_OVER_IDS:
            return _hand_over(self, self.out_n)
        result = np.empty(self.out_n, dtype=np.uint32)
        cdef uint32_t[::1] view = result
        if self.out_n:
            memcpy(&view[0], self.out_buf, self.out_n * sizeof(token_id_t))
        _out_taken(self)
        return result

    cdef object _take_counted(self, const int64_t[::1] lengths, bint narrow, int64_t* n_bytes):
        """``_take_out`` fused with the corpus encoder's conservation sum and its narrowing: one
        pass over the ids writes them as uint16 (``narrow``) or uint32 into the new array and sums
        ``lengths[id]`` of each. ``n_bytes[0]`` is the sum, or -1 when an id is outside ``lengths``
        (the caller's check then fails; the ids are still all copied, narrowed modulo 2**16). Narrowing needs ``len(lengths) <= 65536``, so every id it
        keeps fits."""
        cdef Py_ssize_t k, n = self.out_n, m = lengths.shape[0]
        cdef int64_t total = 0
        cdef uint32_t x
        cdef bint bad = False
        cdef const token_id_t* src = self.out_buf
        cdef const int64_t* lens = &lengths[0] if m else NULL
        cdef uint16_t* d16 = NULL
        cdef uint32_t* d32 = NULL
        cdef uint16_t[::1] v16
        cdef uint32_t[::1] v32
        result = np.empty(n, dtype=np.uint16 if narrow else np.uint32)
        if n:
            if narrow:
                v16 = result
                d16 = &v16[0]
            else:
                v32 = result
                d32 = &v32[0]
            with nogil:
                for k in range(n):
                    x = src[k]
                    if x < <uint64_t>m:
                        total += lens[x]
                    else:
                        bad = True
                    if narrow:
                        d16[k] = <uint16_t>x
                    else:
                        d32[k] = x
        n_bytes[0] = -1 if bad else total
        _out_taken(self)
        return result

    # ---- Python entry points -----------------------------------------------------------------

    def encode_text(self, const uint8_t[::1] buf not None, Py_ssize_t start, Py_ssize_t end,
                    int pattern_id, SpecialTable specials=None, Py_ssize_t max_bytes=0,
                    bint open_end=False):
        """Encode ``buf[start:end]``: special tokens, pre-tokenization (a named pattern), merging.

        Args:
            buf: the bytes (any read-only C-contiguous buffer: ``bytes``, an mmap, a uint8 array).
            start, end: the range to encode; ``0 <= start <= end <= len(buf)``.
            pattern_id: ``_pretok.PATTERN_IDS[name]`` of a named pattern.
            specials: the special tokens to split out (None: none, as ``encode_ordinary``).
            max_bytes: stop after about this many input bytes (0: no limit), at a special token or
                at a provably final pretoken boundary, so calls can resume at ``stop``. A window
                without a special token is scanned at most ``max_bytes`` at a time.
            open_end: the text may continue after ``end`` (streaming): the last text span keeps
                back its open tail, as ``Tokenizer.encode_iterable`` needs.

        Returns:
            ``(ids, stop, done)``: the uint32 ids of ``buf[start:stop]``; ``done`` is True when
            nothing more can be encoded from this range (``stop == end``, or at an open end only
            held-back text is left). ``done`` False with ``stop == start`` means one pretoken is
            longer than the window: call again with a larger ``max_bytes``. The work runs without
            the GIL. Equivalent to ``reference.encode(buf[start:stop], ...)`` for the pieces it
            covers.
        """
        cdef Py_ssize_t n_buf = buf.shape[0], stop = start
        cdef bint done = True
        cdef const Specials* sp = &specials.c if specials is not None else NULL
        if not (0 <= start <= end <= n_buf):
            raise ValueError("need 0 <= start <= end <= len(buf)")
        if pattern_id < 0 or pattern_id > 2:
            raise ValueError(f"unknown pattern id {pattern_id}")
        self.out_n = 0
        if end > start:
            with nogil:
                self._encode_text(pattern_id, sp, &buf[0], n_buf, start, end, max_bytes, open_end,
                                  &stop, &done)
        return self._take_out(), stop, done

    def encode_whole(self, const uint8_t[::1] buf not None, Py_ssize_t start, Py_ssize_t end,
                     int pattern_id, SpecialTable specials=None, Py_ssize_t block=1 << 20):
        """:meth:`encode_text` of all of ``buf[start:end]`` (a closed end), ``block`` bytes at a
        time, into one array: the calls ``Tokenizer._iter_encode`` makes (a block that holds
        only part of one pretoken is retried twice as large), without an array per block and
        their concatenation. The buffer is reserved once for about a token per 3 bytes, in huge
        pages (a whole text's ids fill it): a 5 MB text faulted in some 2,300 4 KiB pages a call
        through the blocks (arrays and their join), a new process's first calls paying for each.

        >>> t = RankTable(np.array([97], np.uint32), np.array([98], np.uint32),
        ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
        >>> Encoder(t).encode_whole(b"ab abab  ab", 0, 11, 0, None, 3).tolist()
        [256, 32, 256, 256, 32, 32, 256]
        """
        cdef Py_ssize_t n_buf = buf.shape[0], pos = start, stop = start, size = block
        cdef bint done = False
        cdef const Specials* sp = &specials.c if specials is not None else NULL
        if not (0 <= start <= end <= n_buf):
            raise ValueError("need 0 <= start <= end <= len(buf)")
        if pattern_id < 0 or pattern_id > 2:
            raise ValueError(f"unknown pattern id {pattern_id}")
        if block < 1:
            raise ValueError("block must be positive")
        self.out_n = 0
        if end > start:
            with nogil:
                self._reserve_out(min((end - start) // 3, <Py_ssize_t>RESERVE_MAX), True)
                while True:
                    self._encode_text(pattern_id, sp, &buf[0], n_buf, pos, end, size, False, &stop, &done)
                    if done:
                        break
                    size = 2 * size if stop == pos else block
                    pos = stop
        return self._take_out()

    def encode_counted(self, const uint8_t[::1] buf not None, Py_ssize_t start, Py_ssize_t end,
                       int pattern_id, SpecialTable specials, Py_ssize_t max_bytes,
                       const int64_t[::1] lengths not None, bint narrow=False):
        """:meth:`encode_text` (a closed end) for the corpus encoder, with the ids' byte count
        in the same pass: ``(ids, stop, done, n_bytes)``. ``ids`` are uint16 when ``narrow``
        (then ``len(lengths) <= 65536``), else uint32; ``n_bytes`` is ``lengths[ids].sum()``, or
        -1 when an id is outside ``lengths`` (``sum_lengths``' contract).

        >>> t = RankTable(np.array([97], np.uint32), np.array([98], np.uint32),
        ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
        >>> lengths = np.array([1] * 256 + [2], np.int64)
        >>> ids, stop, done, n = Encoder(t).encode_counted(b"abc ab", 0, 6, 0, None, 0, lengths, True)
        >>> ids.tolist(), ids.dtype.name, stop, done, n
        ([256, 99, 32, 256], 'uint16', 6, True, 6)
        """
        cdef Py_ssize_t n_buf = buf.shape[0], stop = start
        cdef bint done = True
        cdef int64_t n_bytes = 0
        cdef const Specials* sp = &specials.c if specials is not None else NULL
        if not (0 <= start <= end <= n_buf):
            raise ValueError("need 0 <= start <= end <= len(buf)")
        if pattern_id < 0 or pattern_id > 2:
            raise ValueError(f"unknown pattern id {pattern_id}")
        if narrow and lengths.shape[0] > (1 << 16):
            raise ValueError("narrow needs a table of at most 65536 ids")
        self.out_n = 0
        if end > start:
            with nogil:
                self._encode_text(pattern_id, sp, &buf[0], n_buf, start, end, max_bytes, False,
                                  &stop, &done)
        ids = self._take_counted(lengths, narrow, &n_bytes)
        return ids, stop, done, n_bytes

    def encode_piece(self, const uint8_t[::1] piece, str method="auto"):
        """Token ids of one pretoken (no cache): ``method`` is ``auto``, ``scan`` or ``heap``.

        ``scan`` accepts pieces up to 128 bytes. Equivalent to ``reference.encode_pretoken``.
        """
        cdef Py_ssize_t n = piece.shape[0], m = 0
        cdef vector[token_id_t] out
        if n == 0:
            return []
        out.resize(n)
        if method == "scan" or (method == "auto" and n <= SHORT_PIECE):
            if n > SHORT_PIECE:
                raise ValueError(f"scan handles pieces up to {SHORT_PIECE} bytes")
            with nogil:
                m = self._merge_scan(&piece[0], n, out.data())
        elif method in ("heap", "auto"):
            with nogil:
                m = self._merge_heap(&piece[0], n, out.data())
        else:
            raise ValueError(f"unknown method {method!r}")
        return [int(out[i]) for i in range(m)]

    def encode_pieces(self, const uint8_t[::1] buf not None, const int64_t[::1] ends not None,
                      int64_t start=0, const int64_t[::1] forced_ids=None):
        """Encode the pretokens ``buf[start:ends[0]]``, ``buf[ends[0]:ends[1]]``, ... in order.

        The path for custom patterns (pre-tokenized by ``regex`` in Python); named patterns go
        through ``encode_text``.

        Args:
            buf: the bytes (any read-only buffer: ``bytes``, an mmap, a uint8 array).
            ends: int64, the end offset of each pretoken, non-decreasing, at most ``len(buf)``.
            start: where the first pretoken starts.
            forced_ids: optional int64, one per pretoken: ``-1`` to merge the bytes, an id >= 0 to
                emit for the whole piece (a special token), ``-2`` to emit nothing (text that a
                custom pattern does not match, which the reference drops).

        Returns:
            A uint32 ndarray of token ids. Runs without the GIL.
        """
        cdef Py_ssize_t n_pieces = ends.shape[0], k, k0
        cdef Py_ssize_t n_buf = buf.shape[0]
        cdef int64_t prev = start
        cdef bint has_forced = forced_ids is not None
        cdef const uint8_t* base
        if has_forced and forced_ids.shape[0] != n_pieces:
            raise ValueError("forced_ids must have one entry per pretoken")
        if start < 0 or start > n_buf:
            raise ValueError("start is outside the buffer")
        for k in range(n_pieces):
            if ends[k] < prev or ends[k] > n_buf:
                raise ValueError("ends must be non-decreasing and within the buffer")
            prev = ends[k]
        self.out_n = 0
        if n_buf == 0 or n_pieces == 0:
            return self._take_out()
        base = &buf[0]
        prev = start
        with nogil:
            k = 0
            while k < n_pieces:
                if has_forced and forced_ids[k] != -1:
                    if forced_ids[k] >= 0:
                        self._reserve_out(1)
                        self.out_buf[self.out_n] = <token_id_t>forced_ids[k]
                        self.out_n += 1
                    prev = ends[k]
                    k += 1
                    continue
                k0 = k                       # a run of pieces to merge
                while k < n_pieces and not (has_forced and forced_ids[k] != -1):
                    k += 1
                self._emit_pieces(base, prev, &ends[k0], k - k0, base + n_buf, NULL)
                prev = ends[k - 1]
        return self._take_out()

    def cache_info(self):
        """``{"entries", "misses", "single_hits", "bytes"}`` of the pretoken cache (misses =
        pretokens merged; single_hits = misses of the cache found in ``singles`` instead)."""
        return {
            "entries": int(self.n_entries),
            "misses": int(self.misses),
            "single_hits": int(self.single_hits),
            "bytes": int(self.arena_cap + sizeof(CacheSlot) * self.n_slots),
        }

    def absorb_cache(self, Encoder other not None):
        """Move ``other``'s cached pretokens into this encoder's cache (those it lacks), then
        empty ``other``'s (its slots shrink back to the initial size): what a batch job's threads
        learned beside the shared cache is kept for the next call. Both encoders share one rank
        table and no other thread uses them meanwhile.

        >>> t = RankTable(np.array([97], np.uint32), np.array([98], np.uint32),
        ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
        >>> a, b = Encoder(t), Encoder(t)
        >>> _ = b.encode_text(b"ab abab", 0, 7, 0)
        >>> a.absorb_cache(b); a.cache_info()["entries"] > 0 == b.cache_info()["entries"]
        True
        """
        if other.table is not self.table:
            raise ValueError("the encoders must share one rank table")
        if other is self:
            return
        with nogil:
            self._absorb(other)

    cdef int _absorb(self, Encoder other) noexcept nogil:
        cdef Py_ssize_t k, n, j, want
        cdef uint8_t key[4096]
        cdef uint64_t h
        cdef uint32_t n_ids
        cdef const CacheSlot* sl
        cdef const token_id_t* ids
        cdef uint8_t* grown
        # Room first, for all of ``other``'s entries at once. ``other``'s slots are walked in their
        # order, i.e. by hash: into a table smaller than ``other``'s, those keys all land at its
        # start, one cluster that every probe walks (quadratic; absorbing 62k GPT-2 pieces into a
        # fresh encoder took 0.16 s, 2.5 us a piece, 3x the batch that had learnt them). In a
        # table at least as large, keys in hash order spread over the whole of it.
        want = min(self.n_entries + other.n_entries, self.max_entries)
        while 3 * want > 2 * self.n_slots:
            if self._cache_grow() < 0:
                break
        want = self.arena_size + other.arena_size
        if want > self.arena_cap and want <= ARENA_MAX:
            grown = <uint8_t*>realloc(self.arena, want + ARENA_SLACK)
            if grown != NULL:
                self.arena = grown
                self.arena_cap = want
        for k in range(other.n_slots):
            sl = &other.slots[k]
            if sl.meta == 0:
                continue
            n = sl.meta >> 12
            n_ids = sl.meta & 0xFFF
            for j in range(8):
                key[j] = <uint8_t>(sl.w0 >> (8 * j))
            if n > 8:
                memcpy(key + 8, other._slot_tail(sl), n - 8)
            h = _key_hash(key, n, sl.w0, key + (n if n > 8 else 8))
            if self._cache_find(key, n, sl.w0, h) != NULL:
                continue
            if n_ids <= INLINE_IDS:
                ids = &sl.ids[0]
            else:
                ids = <const token_id_t*>(other.arena + sl.off)
            if self._cache_insert(key, n, sl.w0, h, ids, n_ids) < 0:
                break
        other._cache_clear()
        if other.n_slots > MIN_SLOTS:
            other._slots_alloc(MIN_SLOTS)     # (on failure the old, cleared slots stay)
        return 0

    def clear_cache(self):
        """Drop every cached pretoken."""
        self._cache_clear()

    def copy_cache_from(self, Encoder other not None):
        """Make this encoder's pretoken cache a copy of ``other``'s (an encoder over the same rank
        table, used by no other thread meanwhile): a thread that joins a batch starts as warm as
        the encoder that ran before (two memcpy: the slots and the arena).

        >>> t = RankTable(np.array([97], np.uint32), np.array([98], np.uint32),
        ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
        >>> a, b = Encoder(t), Encoder(t)
        >>> _ = a.encode_text(b"ab abab", 0, 7, 0)
        >>> b.copy_cache_from(a); b.cache_info()["entries"] == a.cache_info()["entries"] > 0
        True
        """
        cdef uint8_t* arena = NULL
        if other.table is not self.table:
            raise ValueError("the encoders must share one rank table")
        if other is self:
            return
        if other.arena_size:
            arena = <uint8_t*>malloc(other.arena_size + ARENA_SLACK)
            if arena == NULL:
                raise MemoryError()
        if self._slots_alloc(other.n_slots) < 0:
            free(arena)
            raise MemoryError()
        memcpy(self.slots, other.slots, other.n_slots * sizeof(CacheSlot))
        free(self.arena)
        self.arena = arena
        if arena != NULL:
            memcpy(arena, other.arena, other.arena_size)
        self.arena_size = self.arena_cap = other.arena_size
        self.n_entries = other.n_entries


# ==== Single tokens and batch jobs ===============================================================


def build_singles(RankTable table not None, TokenTable tokens not None, Py_ssize_t max_len=256):
    """The pieces that encode as one token, proven by merging each: an ``Encoder`` whose cache
    holds ``token bytes -> [id]`` for every token of 2 to ``max_len`` bytes that the merge loop
    turns into exactly itself, and nothing else. It is read, never written, by the encoders it is
    given to (``Encoder(..., singles=...)``), which look a piece up there when their own cache
    misses, before merging it: on a cold cache most pieces of a text are single tokens.

    A token is not always its own encoding (the merges may never build it from its bytes, or build
    a different split first), hence the proof, not the vocabulary. Equivalent to
    ``{b: [i] for i, b in vocab if reference.encode_pretoken(b) == [i]}``.

    >>> t = RankTable(np.array([97, 256], np.uint32), np.array([98, 99], np.uint32),
    ...               np.array([256, 257], np.uint32), np.arange(256, dtype=np.uint32))
    >>> tt = TokenTable([bytes([i]) for i in range(256)] + [b"ab", b"abc", b"bc"])
    >>> s = build_singles(t, tt); s.cache_info()["entries"]    # "bc" is never built
    2
    >>> s.encode_piece(b"abc"), Encoder(t, singles=s).encode_pieces(b"abcab", np.array([3, 5])).tolist()
    ([257], [257, 256])
    """
    if max_len < 2 or max_len > 4095:
        raise ValueError("max_len must lie in 2 .. 4095")
    cdef Py_ssize_t i, n, got, count = 0
    cdef const int64_t* offs = tokens.offsets.data()
    cdef const uint8_t* data = tokens.data.data()
    cdef const uint8_t* p
    cdef vector[token_id_t] out
    cdef uint64_t w0
    for i in range(tokens.n):
        n = offs[i + 1] - offs[i]
        if tokens.valid[i] and 2 <= n <= max_len:
            count += 1
    cdef Encoder singles = Encoder(table, max_entries=max(count, 1) + 1, max_cached_len=max_len)
    out.resize(max_len)
    with nogil:
        for i in range(tokens.n):
            n = offs[i + 1] - offs[i]
            if not tokens.valid[i] or n < 2 or n > max_len:
                continue
            p = data + offs[i]
            got = singles._merge(p, n, out.data())
            if got != 1 or out[0] != <token_id_t>i:
                continue                    # not its own encoding (or not the canonical id)
            w0 = _load_head(p, n, p + n)
            singles._cache_insert(p, n, w0, _key_hash(p, n, w0, p + n), out.data(), 1)
    return singles


cdef extern from *:
    """
    #if defined(_MSC_VER)
    #include <intrin.h>
    static Py_ssize_t bpe_fetch_add(Py_ssize_t* p, Py_ssize_t v) {
        return (Py_ssize_t)_InterlockedExchangeAdd64((volatile long long*)p, (long long)v);
    }
    #else
    static Py_ssize_t bpe_fetch_add(Py_ssize_t* p, Py_ssize_t v) {
        return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
    }
    #endif
    """
    Py_ssize_t fetch_add "bpe_fetch_add"(Py_ssize_t* p, Py_ssize_t v) noexcept nogil


cdef class BatchJob:
    """Many documents encoded by several threads in one native job, then gathered by one copy.

    Each thread calls :meth:`run` with an encoder of its own; without the GIL it takes the next
    document by an atomic counter, encodes it whole (``Encoder.encode_text`` of it alone) into
    its encoder's buffer and notes where. :meth:`collect` then copies every document's ids into
    one uint32 array, in order. With ``shared`` (an encoder not used by any thread meanwhile), every
    thread looks pieces up in that encoder's cache first (read-only: nobody writes it while the
    job runs) and keeps what it merges in its own cache; ``Tokenizer`` moves those into the
    shared one afterwards (``Encoder.absorb_cache``).

    Args:
        texts: a list of ``str`` (UTF-8, ``surrogateescape``) or bytes-like documents.
        pattern_id, specials: as ``Encoder.encode_text``.

    >>> t = RankTable(np.array([97], np.uint32), np.array([98], np.uint32),
    ...               np.array([256], np.uint32), np.arange(256, dtype=np.uint32))
    >>> job = BatchJob(["ab ab", "", b"abc"], 0)
    >>> job.run(Encoder(t))
    >>> ids, offsets = job.collect(); ids.tolist(), offsets.tolist()
    ([256, 32, 256, 256, 99], [0, 3, 3, 5])
    """

    def __init__(self, texts, int pattern_id, SpecialTable specials=None):
        if pattern_id < 0 or pattern_id > 2:
            raise ValueError(f"unknown pattern id {pattern_id}")
        cdef Py_ssize_t n = len(texts), k, size = 0
        cdef const char* p = NULL
        cdef int64_t total = 0
        keep = []
        self.ptrs.resize(n)
        self.sizes.resize(n)
        for k in range(n):
            t = texts[k]
            if isinstance(t, str):
                p = utf8_if_free(t, &size)                  # ASCII, or UTF-8 kept: no copy
                if p == NULL:
                    t = _encode_utf8(<str>t)
                    p = PyBytes_AS_STRING(t)
                    size = PyBytes_GET_SIZE(t)
            else:
                if not isinstance(t, bytes):
                    t = bytes(t)
                p = PyBytes_AS_STRING(t)
                size = PyBytes_GET_SIZE(t)
            keep.append(t)
            self.ptrs[k] = <const uint8_t*>p
            self.sizes[k] = size
            total += size
        self.keep = keep
        self.pattern_id = pattern_id
        self.specials = specials
        self.n_docs = n
        self.n_bytes = total
        self.next_doc = 0
        self.doc_n.assign(n, 0)
        self.doc_at.assign(n, 0)
        self.doc_who.assign(n, -1)
        self.workers = []

    def run(self, Encoder enc not None, Encoder shared=None, Py_ssize_t n_workers=1):
        """Encode documents with ``enc`` until none is left (call once per thread, each with its
        own encoder; ``shared``: a cache to read first, see the class; ``n_workers``: the threads
        running the job, each reserves room for its share of the ids first). Releases the GIL."""
        cdef Py_ssize_t k, stop = 0
        cdef bint done = True
        cdef int32_t who
        cdef const Specials* sp = &self.specials.c if self.specials is not None else NULL
        if n_workers < 1:
            raise ValueError("n_workers must be positive")
        if shared is enc:
            shared = None
        if shared is not None and shared.table is not enc.table:
            raise ValueError("the encoders must share one rank table")
        who = <int32_t>len(self.workers)
        self.workers.append(enc)
        enc.out_n = 0
        enc.shared = shared
        try:
            with nogil:
                # its share of the ids, guessed at one per 3 bytes (_emit_pieces reserves what it
                # needs on top): a new encoder's buffer is made once, not grown by copies
                enc._reserve_out(min(self.n_bytes // (3 * n_workers), <int64_t>RESERVE_MAX), True)
                while True:
                    k = fetch_add(&self.next_doc, 1)
                    if k >= self.n_docs:
                        break
                    self.doc_who[k] = who
                    self.doc_at[k] = enc.out_n
                    if self.sizes[k] > 0:
                        enc._encode_text(self.pattern_id, sp, self.ptrs[k], self.sizes[k], 0, self.sizes[k],
                                         0, False, &stop, &done)
                    self.doc_n[k] = enc.out_n - self.doc_at[k]
        finally:
            enc.shared = None

    def collect(self, TokenTable lists=None):
        """``(ids, offsets)`` after every :meth:`run` returned: uint32 ids of all documents back
        to back, int64 offsets (``n_docs + 1``). The workers' buffers are emptied. One worker's
        buffer becomes ``ids`` itself (no copy; the encoder starts a new one).

        With ``lists`` (the tokenizer's ``TokenTable``): the list of each document's ids instead,
        built straight from the workers' buffers (no flat copy in between); equal to
        ``lists.split_lists(*collect())``.
        """
        cdef Py_ssize_t k, k0, n = self.n_docs, built = 0
        cdef int64_t total = 0
        cdef int32_t who
        cdef Encoder enc
        cdef vector[token_id_t*] bufs
        cdef list out
        if n and self.next_doc < n:
            raise RuntimeError("collect() before every document was encoded")
        for k in range(n):
            if self.doc_who[k] < 0:
                raise RuntimeError("a document was not encoded (a worker failed)")
        if lists is not None:
            for enc in self.workers:
                bufs.push_back(enc.out_buf)
            out = [None] * n
            try:
                for k in range(n):
                    out[k] = lists._list(bufs[self.doc_who[k]] + self.doc_at[k] if self.doc_n[k] else NULL,
                                         self.doc_n[k])          # untracked while the batch is built
                    built = k + 1
            finally:
                for k in range(built):
                    gc_track(<PyObject*>out[k])
                self._release_workers()
            return out
        offsets = np.empty(n + 1, dtype=np.int64)
        cdef int64_t[::1] offs = offsets
        offs[0] = 0
        for k in range(n):
            total += self.doc_n[k]
            offs[k + 1] = total
        if len(self.workers) == 1 and total > 0 and self._one_run(total):
            ids = _hand_over(<Encoder>self.workers[0], total)
            self._release_workers()
            return ids, offsets
        ids = np.empty(total, dtype=np.uint32)
        cdef uint32_t[::1] flat = ids
        for enc in self.workers:
            bufs.push_back(enc.out_buf)
        with nogil:
            k = 0
            while k < n:                    # a run of documents of one worker is one copy
                k0 = k
                who = self.doc_who[k]
                k += 1
                while k < n and self.doc_who[k] == who and self.doc_at[k] == self.doc_at[k - 1] + self.doc_n[k - 1]:
                    k += 1
                if offs[k] > offs[k0]:
                    memcpy(&flat[offs[k0]], bufs[who] + self.doc_at[k0], (offs[k] - offs[k0]) * sizeof(token_id_t))
        self._release_workers()
        return ids, offsets

    cdef bint _one_run(self, int64_t total):
        """Whether the ids lie in worker 0's buffer in document order from its start (one worker)."""
        cdef Py_ssize_t k
        cdef int64_t at = 0
        for k in range(self.n_docs):
            if self.doc_who[k] != 0 or self.doc_at[k] != at:
                return False
            at += self.doc_n[k]
        return at == total and (<Encoder>self.workers[0]).out_n == total

    cdef void _release_workers(self):
        cdef Encoder enc
        for enc in self.workers:
            enc.out_n = 0
            if enc.out_cap > (1 << 24):     # don't keep a huge buffer alive between calls
                free(enc.out_buf)
                enc.out_buf = NULL
                enc.out_cap = 0
        self.workers = []
        self.keep = None


@cython.final
cdef class _OwnedIds:
    """A malloc'ed uint32 buffer handed over from an encoder, freed with the last array over it."""
    cdef token_id_t* p
    cdef Py_ssize_t n

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, <void*>self.p, self.n * sizeof(token_id_t), 0, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    def __dealloc__(self):
        free(self.p)


cdef object _hand_over(Encoder enc, Py_ssize_t n):
    """The first ``n`` ids of ``enc``'s buffer as a uint32 array that owns the buffer (trimmed to
    ``n``); the encoder starts a new buffer on its next call."""
    cdef _OwnedIds owner = _OwnedIds.__new__(_OwnedIds)
    cdef token_id_t* trimmed = <token_id_t*>realloc(enc.out_buf, n * sizeof(token_id_t))
    owner.p = trimmed if trimmed != NULL else enc.out_buf
    owner.n = n
    enc.out_buf = NULL
    enc.out_cap = 0
    enc.out_n = 0
    return np.frombuffer(owner, dtype=np.uint32)


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

    >>> from bpe_core.engine.units import RankMerger
    >>> m = RankMerger(np.array([1, 5], np.uint32), np.array([2, 3], np.uint32), np.array([5, 6], np.uint32))
    >>> t = Stage2Table(m)                                   # (1, 2) -> 5, (5, 3) -> 6
    >>> t.lookup(1, 2), t.lookup(5, 3), t.lookup(2, 3), t.lookup(3, 1)   # 2-3: inside 1 2 3 -> 6
    ((True, 0, 5), (True, 1, 6), (True, None, None), (False, None, None))
    """

    def __init__(self, RankMerger merger not None, bint all_cross=False, Py_ssize_t max_pairs=-1,
                 token_lengths=None):
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
        self.shift = 60                 # at most 2/3 full: 16-byte slots, 24 bytes a pair
        while 2 * cap < <uint64_t>(3 * len(pairs) + 3):
            cap <<= 1
            self.shift -= 1
        self.mask = cap - 1
        empty.key = EMPTY_KEY
        empty.res = 0
        empty.rank = NO_RANK
        self.slots.assign(cap, empty)
        # the filter: a blocked Bloom filter (3 bits of one 64-bit word per pair), about 6 bits per
        # pair (~7% false hits), 2**12 .. 2**18 bits (0.5 .. 32 KiB): it stays in L1
        fbits = 12
        while fbits < 18 and (1 << fbits) < 6 * len(pairs):
            fbits += 1
        self.fshift = 64 - (fbits - 6)
        self.filter.assign((1 << fbits) // 64, 0)
        for key in pairs:
            h = key * MUL1
            self.filter[h >> self.fshift] |= _filter_bits(h)
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
    return v


cdef inline uint64_t _filter_bits(uint64_t h) noexcept nogil:
    """The three bits a pair hash ``h`` sets in its filter word (from bits 26-43 of ``h``; the word
    is chosen by the top bits)."""
    return (((<uint64_t>1) << ((h >> 26) & 63)) | ((<uint64_t>1) << ((h >> 32) & 63))
            | ((<uint64_t>1) << ((h >> 38) & 63)))


cdef inline bint _cross(const XView* v, token_id_t a, token_id_t b, uint32_t* rank, token_id_t* res) noexcept nogil:
    """Whether ``(a, b)`` is crossable; ``rank`` gets its first rank (or NO_RANK; the LATER_RANKS
    flag stays set) and ``res`` the id it merges into."""
    cdef pair_key_t key = pack_pair(a, b)
    cdef uint64_t slot, f, h
    cdef int64_t r
    if v.all_cross:
        r = (<RankMerger>v.merger)._rank(a, b, -1, res)
        rank[0] = <uint32_t>r if r >= 0 else NO_RANK
        return True
    f = key * MUL1
    h = _filter_bits(f)
    if (v.filter[f >> v.fshift] & h) != h:
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


cdef class Stage2Scratch:
    """The scratch of one thread's stage-2 merging (``encode_stage_aware``)."""


cdef Py_ssize_t _merge_segment(const XView* v, Stage2Scratch sc, token_id_t* out, Py_ssize_t a,
                               Py_ssize_t b, Py_ssize_t w, const uint32_t* rk0,
                               const token_id_t* rs0) noexcept nogil:
    """Stage-2 merge the segment ``out[a:b]`` and write it at ``out[w:]`` (``w <= a``); returns the
    new ``w``. Up to ``SHORT_SEG`` ids: ``_merge_short`` (``rk0, rs0``: its pairs' lookups);
    longer: ``RankMerger._merge`` (a heap)."""
    cdef Py_ssize_t n = b - a, m
    if n <= 0:
        return w
    if n == 1:
        out[w] = out[a]
        return w + 1
    if n <= SHORT_SEG:
        m = _merge_short(v, out + a, n, rk0, rs0)
    else:
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


cdef enum:
    STAGE_WINDOW = 1024      # pretokens a window of _stage_span (its pair arrays, ~17 bytes an id, stay in L1/L2)

cdef enum:
    PROBE_AHEAD = 8          # pairs whose slot is asked for ahead of its probe (_look_up_pairs)


cdef void _look_up_pairs(const XView* v, Stage2Scratch sc, const token_id_t* out, Py_ssize_t lo,
                         Py_ssize_t hi) noexcept nogil:
    """``_cross`` of every pair ``out[k - 1], out[k]`` for ``lo <= k < hi`` (``lo >= 1``), into
    ``sc.pair_cross[k - lo]`` (0 or 1), ``sc.pair_rank`` and ``sc.pair_res`` (rank NO_RANK: no
    merge; the result is then not set), with few branches on the answer: a pass tests every pair
    against the filter and lists those that pass (no branch), a second probes the slots of the
    listed ones (each asked for ``PROBE_AHEAD`` pairs ahead). About 40% of pairs are crossable, in
    no order a branch predictor can learn: one branch on that per pair costs more than the lookups."""
    cdef Py_ssize_t k, t, m = 0
    cdef uint64_t key, f, h, slot
    cdef uint32_t r
    cdef uint8_t* cross = sc.pair_cross.data()
    cdef uint32_t* ranks = sc.pair_rank.data()
    cdef token_id_t* results = sc.pair_res.data()
    cdef int64_t* cand = sc.pair_cand.data()
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
        f = key * MUL1
        h = _filter_bits(f)
        cross[k - lo] = 0
        ranks[k - lo] = NO_RANK
        cand[m] = k
        m += (v.filter[f >> v.fshift] & h) == h
    for t in range(min(m, <Py_ssize_t>PROBE_AHEAD)):
        k = cand[t]
        prefetch(&v.slots[(pack_pair(out[k - 1], out[k]) * MUL2) >> v.shift])
    for t in range(m):
        if t + PROBE_AHEAD < m:
            k = cand[t + PROBE_AHEAD]
            prefetch(&v.slots[(pack_pair(out[k - 1], out[k]) * MUL2) >> v.shift])
        k = cand[t]
        key = pack_pair(out[k - 1], out[k])
        slot = (key * MUL2) >> v.shift
        while True:
            if v.slots[slot].key == key:
                cross[k - lo] = 1
                ranks[k - lo] = v.slots[slot].rank
                results[k - lo] = v.slots[slot].res
                break
            if v.slots[slot].key == EMPTY_KEY:
                break
            slot = (slot + 1) & v.mask


cdef inline uint8_t _unit_joins(uint8_t fp, uint8_t fc, int split) noexcept nogil:
    """1 when a unit goes on between two pretokens with flags ``fp`` and ``fc``: neither holds a
    digit and (``SPLIT_HF``) they do not meet inside a run of whitespace."""
    return ((((fp | fc) & PT_NUMERIC) == 0)
            & ((split == SPLIT_UNITS) | ((fp & PT_ENDS_SPACE) == 0) | ((fc & PT_STARTS_SPACE) == 0)))


cdef int _stage_span(Encoder enc, const XView* v, Stage2Scratch sc, int pattern_id, int split,
                     const uint8_t* s, Py_ssize_t a, Py_ssize_t b, const uint8_t* limit) except -1 nogil:
    """Encode the text ``s[a:b]`` (no special token in it): stage 1 per pretoken, then stage 2.

    Pretokens are scanned ``ENDS_CAP`` at a time and their stage-1 ids emitted (the ``Encoder`` and
    its cache). Then, for the window, in passes with few branches on the data (``_look_up_pairs``):

    1. every pair of neighbouring ids is looked up (``Stage2Table``: crossable, first rank, result);
    2. between two pretokens, a crossable pair is a cut when a unit ends there (the flags of both,
       computed for every pretoken; ``split`` SPLIT_HF or SPLIT_UNITS) and, with SPLIT_UNITS, the
       pairs of a numeric pretoken between two digit groups are cuts (``_digit_group_cuts``);
    3. the cuts, 64 ids to a bit mask, are visited in order (count trailing zeros), and each segment
       between two cuts is merged and written back, compacted, in place: one id as it is, two ids
       as their pair's lookup says (without a branch), more by ``_merge_segment``.

    The unfinished segment at the end of a window moves down to the written ids before the next
    window's ids are emitted after it (its pairs are looked up again with them when it is short).
    """
    cdef int64_t* ends = enc.ends_buf
    cdef int64_t* starts
    cdef Py_ssize_t p = a, q = a, n, j, k, k1, e, w, seg, lo = 0, hi, first, t, length, open_at = -1
    cdef uint32_t* pr_rank
    cdef token_id_t* pr_res
    cdef uint8_t* pr_cross
    cdef token_id_t* out
    cdef uint8_t fc = 0, fl = 0
    cdef bint have_prev = False
    if <Py_ssize_t>sc.starts.size() < ENDS_CAP + 1:
        sc.starts.resize(ENDS_CAP + 1)
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
        elif first - seg <= SHORT_SEG:
            lo = seg + 1                    # the unfinished segment's pairs again (short: cheap)
        else:
            lo = first                      # a long one merges without its pairs' lookups
        if <Py_ssize_t>sc.pair_rank.size() < hi - lo + 1:
            sc.pair_rank.resize(hi - lo + 1)
            sc.pair_res.resize(hi - lo + 1)
            sc.pair_cross.resize(hi - lo + 1)
            sc.pair_cand.resize(hi - lo + 1)
        pr_rank = sc.pair_rank.data()
        pr_res = sc.pair_res.data()
        pr_cross = sc.pair_cross.data()
        # 1. the lookups
        if hi > lo:
            _look_up_pairs(v, sc, out, lo, hi)
        # 2. where units end
        for j in range(n):
            e = ends[j]
            k = starts[j]
            k1 = starts[j + 1]
            fc = _pretoken_flags(s, q, e)
            if have_prev:
                pr_cross[k - lo] &= _unit_joins(fl, fc, split)
            have_prev = True
            if split == SPLIT_UNITS and fc & PT_NUMERIC and k1 - k >= 2:
                _digit_group_cuts(v, sc, s, q, e, out + k, k1 - k)
                for t in range(1, k1 - k):
                    if sc.inner_cut[t]:
                        pr_cross[k + t - lo] = 0
            fl = fc
            q = e
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
        bits = 0
        for i in range(nb):
            bits |= (<uint64_t>(cross[k - lo + i] ^ 1)) << i
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
            elif seg + 1 >= lo:
                w = _merge_segment(v, sc, out, seg, c, w, ranks + (seg + 1 - lo), results + (seg + 1 - lo))
            else:                           # a long segment from an earlier window
                w = _merge_segment(v, sc, out, seg, c, w, ranks, results)
            seg = c
        k += nb
    seg_out[0] = seg
    return w


def encode_stage_aware(Encoder enc not None, Stage2Table stage2 not None, Stage2Scratch scratch not None,
                       const uint8_t[::1] buf not None, int pattern_id, SpecialTable specials,
                       str split="hf"):
    """Encode a whole text with a SuperBPE model (the ``"hf"`` or ``"units"`` stage-2 split; SupraTok's
    is ``"units"``), without the GIL.

    Args:
        enc: an ``Encoder`` over the model's stage-1 merges (its ``RankTable``).
        stage2: a ``Stage2Table`` over the stage-2 ``RankMerger`` (canonical ids).
        scratch: this thread's ``Stage2Scratch``.
        buf: the text; special tokens (``specials``, may be None) become their id and end units.
        pattern_id: the named pattern (``PATTERN_IDS``).
        split: ``"hf"`` or ``"units"`` (which needs ``stage2`` built with ``token_lengths``).

    Returns:
        uint32 ids. Equivalent to ``superbpe.StageAwareEncoder.encode_python`` and
        ``reference.encode_superbpe(..., split=split)``.
    """
    cdef Py_ssize_t n_buf = buf.shape[0], pos = 0, ms = 0, me = 0
    cdef token_id_t mid = 0
    cdef const Specials* sp = &specials.c if specials is not None else NULL
    cdef const uint8_t* s
    cdef bint found
    cdef XView v = _xview(stage2)
    cdef int split_id
    if pattern_id < 0 or pattern_id > 2:
        raise ValueError(f"unknown pattern id {pattern_id}")
    if split == "hf":
        split_id = SPLIT_HF
    elif split == "units":
        split_id = SPLIT_UNITS
        if v.n_lengths == 0:
            raise ValueError("the 'units' split needs a Stage2Table built with token_lengths")
    else:
        raise ValueError(f"the native stage-aware encoder has no split {split!r} (hf, units)")
    enc.out_n = 0
    if n_buf == 0:
        return enc._take_out()
    s = &buf[0]
    with nogil:
        while pos < n_buf:
            found = sp != NULL and _find_special(sp, s, pos, n_buf, n_buf, &ms, &me, &mid)
            if not found:
                ms = me = n_buf
            if ms > pos:
                _stage_span(enc, &v, scratch, pattern_id, split_id, s, pos, ms, s + n_buf)
            if found:
                enc._reserve_out(1)
                enc.out_buf[enc.out_n] = mid
                enc.out_n += 1
            pos = me
    return enc._take_out()


# ==== The UTF-8 of a str =========================================================================

@cython.final
cdef class Utf8View:
    """A read-only buffer over the UTF-8 that CPython keeps in a ``str`` (see :func:`utf8_of`);
    it holds the ``str``, so the bytes stay valid while the view lives."""
    cdef object text
    cdef const char* p
    cdef Py_ssize_t n

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, <void*>self.p, self.n, 1, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    def __len__(self):
        return self.n


cdef object _encode_utf8(str text):
    """``text.encode("utf-8", "surrogateescape")``: our encoder (``bpe_utf8_bytes``),
    CPython's where ``text`` holds a surrogate."""
    cdef PyObject* got = utf8_bytes(text)
    if got == NULL:
        return text.encode("utf-8", "surrogateescape")
    result = <object>got
    decref(got)
    return result


def encode_utf8(str text not None):
    """``text.encode("utf-8", "surrogateescape")`` (a new ``bytes``; the converter of ``utf8_of``
    and ``BatchJob``, exposed for tests).

    >>> encode_utf8("hi é€😀\\udcff"), encode_utf8("a" * 9 + "ÿ")
    (b'hi \\xc3\\xa9\\xe2\\x82\\xac\\xf0\\x9f\\x98\\x80\\xff', b'aaaaaaaaa\\xc3\\xbf')
    """
    return _encode_utf8(text)


def utf8_of(str text not None):
    """The UTF-8 of ``text`` with ``surrogateescape``, as a buffer: ``text.encode("utf-8",
    "surrogateescape")`` without the copy where the ``str`` holds it already. An ASCII ``str`` is
    its own UTF-8 (no copy); another ``str`` whose UTF-8 CPython made and kept before
    (``PyUnicode_AsUTF8``) is read there. Any other ``str`` is encoded as before: making and
    keeping its UTF-8 (``PyUnicode_AsUTF8AndSize``, as tiktoken's binding does) cost ~30% more CPU
    than ``encode`` for a ``str`` seen once, and doubles its memory.

    >>> bytes(utf8_of("hi é")), bytes(utf8_of("a\\udcff")), len(utf8_of("€")), type(utf8_of("ab")).__name__
    (b'hi \\xc3\\xa9', b'a\\xff', 3, 'Utf8View')
    """
    cdef Py_ssize_t size = 0
    cdef const char* p = utf8_if_free(text, &size)
    cdef Utf8View view
    if p == NULL:                                   # no UTF-8 kept
        return _encode_utf8(text)
    view = Utf8View.__new__(Utf8View)
    view.text = text
    view.p = p
    view.n = size
    return view


# ==== Bytes the ids stand for ====================================================================

@cython.boundscheck(False)
@cython.wraparound(False)
def sum_lengths(const int64_t[::1] lengths not None, const uint32_t[::1] ids not None):
    """``lengths[ids].sum()`` without the gathered copy (the corpus encoder's conservation check,
    block by block); -1 when an id is outside ``lengths``.

    >>> sum_lengths(np.array([1, 2, 3], np.int64), np.array([2, 2, 0], np.uint32))
    7
    >>> sum_lengths(np.ones(2, np.int64), np.array([5], np.uint32))
    -1
    """
    cdef Py_ssize_t k, n = ids.shape[0], m = lengths.shape[0]
    cdef int64_t total = 0
    cdef uint32_t x
    with nogil:
        for k in range(n):
            x = ids[k]
            if x >= m:
                total = -1
                break
            total += lengths[x]
    return total


# ==== Token table: decoding, and Python lists of ids ===========================================

ctypedef fused id_t:
    uint16_t
    uint32_t
    int64_t


@cython.boundscheck(False)
@cython.wraparound(False)
cdef class TokenTable:
    """The bytes of every token, back to back (``data``, with ``offsets``), and the Python ``int``
    of every id, built once per tokenizer: decoding is one pass over the ids into one
    preallocated ``bytes``, and a list of ids is built from shared ``int`` objects.

    Args:
        decoder: id -> token bytes, ``None`` where the id is unused (a sparse vocabulary).
        max_ints: ids below this get a shared ``int`` object (larger ones are created per use).

    >>> t = TokenTable([b"a", None, b"bc"])
    >>> t.decode([0, 2, 0]), t.decode(np.array([2], np.uint16)), t.decode([1])
    (b'abca', b'bc', None)
    >>> t.to_list(np.array([2, 0, 7], np.uint32))
    [2, 0, 7]
    """

    def __init__(self, decoder, Py_ssize_t max_ints=1 << 20):
        cdef Py_ssize_t n = len(decoder), i, off = 0
        self.n = n
        self.offsets.resize(n + 1)
        self.valid.assign(n, 0)
        parts = []
        for i in range(n):
            b = decoder[i]
            self.offsets[i] = off
            if b is not None:
                self.valid[i] = 1
                parts.append(b)
                off += len(b)
        self.offsets[n] = off
        joined = b"".join(parts)
        self.data.resize(off + 16)          # 16 bytes of slack: short tokens are copied 16 at a time
        if off:
            memcpy(self.data.data(), <const char*>joined, off)
        memset(self.data.data() + off, 0, 16)
        self.ints = list(range(min(n, max_ints)))
        self.n_ints = len(self.ints)
        self.int_ptrs.resize(self.n_ints)
        for i in range(self.n_ints):
            self.int_ptrs[i] = <PyObject*>self.ints[i]

    def lengths(self):
        """The byte length of every id as int64 (0 where the id is unused): what the corpus
        encoder's conservation check sums, from the offsets (no pass over Python objects).

        >>> TokenTable([b"a", None, b"bc"]).lengths().tolist()
        [1, 0, 2]
        """
        out = np.empty(self.n, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef Py_ssize_t i
        for i in range(self.n):
            o[i] = self.offsets[i + 1] - self.offsets[i]
        return out

    def decode(self, ids):
        """The bytes of ``ids`` (a list or tuple of ints, or a 1-D C-contiguous uint16, uint32 or
        int64 array), or None when an id is not in the table (the caller names it)."""
        cdef vector[int64_t] scratch
        cdef Py_ssize_t n, k
        cdef long long v
        cdef list seq
        if isinstance(ids, np.ndarray):
            return self._decode_array(ids)
        seq = ids if type(ids) is list else list(ids)
        n = len(seq)
        scratch.resize(n)
        for k in range(n):
            x = seq[k]                      # a list item, read without bounds checks
            if type(x) is not int:
                try:
                    x = x.__index__()
                except (AttributeError, TypeError):
                    return None
            try:
                v = x
            except OverflowError:
                return None
            scratch[k] = v
        return _decode_ids(self, scratch.data(), n)

    def _decode_array(self, const id_t[::1] ids):
        cdef Py_ssize_t n = ids.shape[0]
        if n == 0:
            return b""
        return _decode_ids(self, &ids[0], n)

    def to_list(self, const uint32_t[::1] ids not None):
        """The ids as a Python list of ints (one pass; ids below ``max_ints`` share their object)."""
        if ids.shape[0] == 0:
            return []
        out = self._list(&ids[0], ids.shape[0])
        gc_track(<PyObject*>out)
        return out

    def split_lists(self, const uint32_t[::1] ids not None, const int64_t[::1] offsets not None):
        """``[ids[offsets[k]:offsets[k + 1]] as a list for each k]``.

        The lists are kept out of the cyclic garbage collector while they are built and handed to
        it together at the end: a batch of thousands of lists otherwise triggers collections that
        walk every id of the lists built so far (a third of the time of this call).
        """
        cdef Py_ssize_t k, m = offsets.shape[0] - 1, built = 0
        cdef list out
        if m < 0 or (m >= 0 and (offsets[0] < 0 or offsets[m] > ids.shape[0])):
            raise ValueError("offsets must lie within ids")
        for k in range(m):
            if offsets[k + 1] < offsets[k]:
                raise ValueError("offsets must be non-decreasing")
        out = [None] * max(m, 0)
        try:
            for k in range(m):
                item = self._list(&ids[offsets[k]] if offsets[k + 1] > offsets[k] else NULL,
                                  offsets[k + 1] - offsets[k])                          # untracked
                out[k] = item
                built = k + 1
        finally:
            for k in range(built):
                gc_track(<PyObject*>out[k])
        return out

    cdef object _list(self, const uint32_t* p, Py_ssize_t n):
        """The ids as a new list, its slots written once (not zeroed first); the list comes back
        untracked by the cyclic collector (the caller tracks it)."""
        cdef PyObject* lst = list_unset(n)
        cdef PyObject* o
        cdef Py_ssize_t i, j
        cdef uint32_t v
        cdef void** ptrs = self.int_ptrs.data()
        cdef Py_ssize_t n_ints = self.n_ints
        if lst == NULL:
            raise MemoryError()
        for i in range(n):
            v = p[i]
            if i + LIST_AHEAD < n and p[i + LIST_AHEAD] < <uint64_t>n_ints:
                # the int of an id a few places on, whose count the incref below will write: the
                # ints of a 50k vocab (1.6 MB) are read out of order, mostly from past the L2 cache
                prefetch(ptrs[p[i + LIST_AHEAD]])
            if v < <uint64_t>n_ints:
                o = <PyObject*>ptrs[v]
                incref(o)
            else:
                o = long_from_u32(v)
                if o == NULL:
                    for j in range(i, n):       # the unset slots, so the list can be freed
                        list_set(lst, j, NULL)
                    decref(lst)
                    raise MemoryError()
            list_set(lst, i, o)
        result = <object>lst
        decref(lst)
        return result


cdef object _decode_ids(TokenTable t, const id_t* ids, Py_ssize_t n):
    """Two passes: the total length (and every id checked), then the copy into one ``bytes``."""
    cdef const int64_t* offs = t.offsets.data()
    cdef const uint8_t* valid = t.valid.data()
    cdef const uint8_t* data = t.data.data()
    cdef Py_ssize_t k, total = 0, pos = 0, length
    cdef int64_t v
    cdef bint bad = False
    cdef uint8_t* out
    with nogil:
        for k in range(n):
            v = <int64_t>ids[k]
            if v < 0 or v >= t.n or not valid[v]:
                bad = True
                break
            total += offs[v + 1] - offs[v]
    if bad:
        return None
    result = PyBytes_FromStringAndSize(NULL, total)
    out = <uint8_t*>PyBytes_AS_STRING(result)
    with nogil:
        for k in range(n):
            v = <int64_t>ids[k]
            length = offs[v + 1] - offs[v]
            if length <= 16 and pos + 16 <= total:
                memcpy(out + pos, data + offs[v], 16)
            else:
                memcpy(out + pos, data + offs[v], length)
            pos += length
    return result
