# _encode.pyx, part 1 of 10 (``include``d: compiled into the module as if written there).
# The C side of the encoder: the cache slot and arena record layouts, specials, the inline C helpers
# (hashing constants, little-endian loads, tail compare, buffer growth, prefetch) and the constants.

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
    static PyObject** bpe_list_items(PyObject* l) { return ((PyListObject*)l)->ob_item; }
    /* c more references to o, at once (TokenTable._list's counted references). Not on a build
       without the GIL, whose counts are split between threads: there _list increfs each. */
    #ifdef Py_GIL_DISABLED
    #define BPE_COUNTED_REFS 0
    static void bpe_add_refs(PyObject* o, Py_ssize_t c) { while (c--) Py_INCREF(o); }
    #else
    #define BPE_COUNTED_REFS 1
    static void bpe_add_refs(PyObject* o, Py_ssize_t c) { Py_SET_REFCNT(o, Py_REFCNT(o) + c); }
    #endif
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
    PyObject** list_items "bpe_list_items"(PyObject* l)
    void add_refs "bpe_add_refs"(PyObject* o, Py_ssize_t c) noexcept
    const bint COUNTED_REFS "BPE_COUNTED_REFS"


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
    /* The UTF-8 of a str's code points (PEP 393 kind 1, 2 or 4), sixteen (SSE2) or eight / four /
       two code points at a time while they are ASCII, in one pass into a bytes object of the worst-case size (the
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
    #if defined(__SSE2__) || defined(_M_X64)
    #include <emmintrin.h>
    #define BPE_UTF8_SSE2 1
    #endif
    static char* bpe_utf8_write(const void* data, int kind, Py_ssize_t n, char* o) {
        Py_ssize_t i = 0, j;
        uint64_t w;
        if (kind == 1) {
            const uint8_t* s = (const uint8_t*)data;
    #if defined(BPE_UTF8_SSE2)
            /* 16 code points a step while they are ASCII (one compare, one store) */
            for (; i + 16 <= n; i += 16) {
                __m128i a = _mm_loadu_si128((const __m128i*)(s + i));
                if (_mm_movemask_epi8(a) == 0) {
                    _mm_storeu_si128((__m128i*)o, a);
                    o += 16;
                } else {
                    for (j = 0; j < 16; j++)
                        o = bpe_utf8_put(o, s[i + j]);
                }
            }
    #endif
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
    #if defined(BPE_UTF8_SSE2)
            /* 16 code units a step while they are ASCII: two loads, a test, one pack and store */
            const __m128i high = _mm_set1_epi16((short)0xFF80);
            for (; i + 16 <= n; i += 16) {
                __m128i a = _mm_loadu_si128((const __m128i*)(s + i));
                __m128i b = _mm_loadu_si128((const __m128i*)(s + i + 8));
                __m128i t = _mm_and_si128(_mm_or_si128(a, b), high);
                if (_mm_movemask_epi8(_mm_cmpeq_epi16(t, _mm_setzero_si128())) == 0xFFFF) {
                    _mm_storeu_si128((__m128i*)o, _mm_packus_epi16(a, b));
                    o += 16;
                } else {
                    for (j = 0; j < 16; j++)
                        BPE_UTF8_SLOW(s[i + j]);
                }
            }
    #endif
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
    #if defined(BPE_UTF8_SSE2)
            /* 16 code points a step while they are ASCII: four loads, a test, two packs, one store */
            const __m128i high = _mm_set1_epi32((int)0xFFFFFF80u);
            for (; i + 16 <= n; i += 16) {
                __m128i a = _mm_loadu_si128((const __m128i*)(s + i));
                __m128i b = _mm_loadu_si128((const __m128i*)(s + i + 4));
                __m128i c = _mm_loadu_si128((const __m128i*)(s + i + 8));
                __m128i d = _mm_loadu_si128((const __m128i*)(s + i + 12));
                __m128i t = _mm_and_si128(_mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d)), high);
                if (_mm_movemask_epi8(_mm_cmpeq_epi32(t, _mm_setzero_si128())) == 0xFFFF) {
                    _mm_storeu_si128((__m128i*)o, _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d)));
                    o += 16;
                } else {
                    for (j = 0; j < 16; j++)
                        BPE_UTF8_SLOW(s[i + j]);
                }
            }
    #endif
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
    /* size zeroed bytes for a cache's slot table; from 2 MiB up on Linux 2 MiB aligned and advised
       to use transparent huge pages. Its probes land at random: a 4 MiB table over 4 KiB pages is
       1,024 pages, which with the text and the ids streaming past overflow the TLB, and under
       virtualisation a TLB miss walks two page tables. Freed with free. */
    static void* bpe_enc_calloc_huge(size_t size) {
    #if defined(__linux__) && defined(MADV_HUGEPAGE)
        const size_t page = (size_t)2 << 20;
        if (size >= page) {
            void* p = NULL;
            if (posix_memalign(&p, page, size) != 0)
                return NULL;
            madvise(p, size & ~(page - 1), MADV_HUGEPAGE);
            memset(p, 0, size);
            return p;
        }
    #endif
        return calloc(size, 1);
    }
    /* A batch job's shared cache is written by its threads (one at a time, under a spin lock)
       while they read it: a slot is filled, then published by a release store of its meta word,
       and read after an acquire load of it (plain moves on x86; they only keep the compiler
       from reading the slot's other words first). */
    #if defined(_MSC_VER)
    #include <intrin.h>
    static uint32_t bpe_enc_load_acquire(const uint32_t* p) {
        uint32_t v = *(const volatile uint32_t*)p; _ReadWriteBarrier(); return v;
    }
    static void bpe_enc_store_release(uint32_t* p, uint32_t v) {
        _ReadWriteBarrier(); *(volatile uint32_t*)p = v;
    }
    static void bpe_enc_lock(long* l) {
        while (_InterlockedExchange(l, 1)) {
            while (*(volatile long*)l) _mm_pause();
        }
    }
    static void bpe_enc_unlock(long* l) { _InterlockedExchange(l, 0); }
    #else
    #include <sched.h>
    static uint32_t bpe_enc_load_acquire(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static void bpe_enc_store_release(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static void bpe_enc_lock(long* l) {
        int spins = 0;
        while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE)) {
            while (__atomic_load_n(l, __ATOMIC_RELAXED)) {
                if (++spins > 1000) { sched_yield(); spins = 0; }
    #if defined(__x86_64__) || defined(__i386__)
                else __builtin_ia32_pause();
    #endif
            }
        }
    }
    static void bpe_enc_unlock(long* l) { __atomic_store_n(l, 0, __ATOMIC_RELEASE); }
    #endif
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
    void* calloc_huge "bpe_enc_calloc_huge"(size_t size) noexcept nogil
    uint32_t load_acquire "bpe_enc_load_acquire"(const uint32_t* p) noexcept nogil
    void store_release "bpe_enc_store_release"(uint32_t* p, uint32_t v) noexcept nogil
    void spin_lock "bpe_enc_lock"(long* l) noexcept nogil
    void spin_unlock "bpe_enc_unlock"(long* l) noexcept nogil


cdef enum:
    SHORT_PIECE = 128          # longest piece merged by the linear scan; longer ones use the heap
    INLINE_IDS = 4             # ids held in the cache slot itself
    LIST_AHEAD = 16            # TokenTable._list prefetches the int of the id this many places on
    COUNTED_LIST = 4096        # a list of this many ids or more counts its ints' references (_list)
    HAND_OVER_IDS = 1 << 16    # outputs this long are handed over, not copied (``_take_out``)
    BLOCK = 32                 # _emit_pieces hashes and prefetches a block of pieces, then probes the one before
    RING = 2 * BLOCK           # its ring of hashes (two blocks)
    RING_MASK = RING - 1
    ENDS_CAP = 4096            # pretoken ends scanned ahead (32 KiB of int64: stays in L1/L2)
    HOLD_BACK = 2              # pretokens held back at an open end (see _encode_span)
    MIN_SLOTS = 4096
    ARENA_MAX = 16 << 20       # the cache is cleared when its arena would outgrow this
    RESERVE_MAX = 1 << 24      # ids a batch worker reserves at most before its first document
    TEXT_KEEP = 64 << 20       # an encoder keeps a UTF-8 scratch (encode_all) up to this many bytes
    ARENA_SLACK = 8            # readable bytes past arena_cap (a key tail is compared 8 bytes at once)
