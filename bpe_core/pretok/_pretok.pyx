"""Native pre-tokenizer: the GPT-2, cl100k and o200k split patterns, hand-compiled over UTF-8 bytes.

The truth is ``regex``: for ``text = data.decode("utf-8", "surrogateescape")`` the pretokens are
``[m.group().encode("utf-8", "surrogateescape") for m in regex.finditer(pattern, text)]``. The
scanners here give byte-identical pieces without decoding to ``str``:

- A character is one valid UTF-8 sequence (Python's strict rules: no overlongs, no encoded
  surrogates, nothing above U+10FFFF), or else one byte, which ``surrogateescape`` turns into
  U+DC80..U+DCFF: a lone surrogate, "other" to every class.
- Its classes (``\\p{L}``, ``\\p{N}``, ``\\s``, o200k's case classes, and what ``(?i:s)`` etc.
  match) come from ``_unicode_tables.h``, probed from ``regex`` by ``scripts/gen_unicode_tables.py``.
- Each ``_end_<pattern>`` tries the alternatives of its pattern in order, reproducing the
  backtracking that matters (a whitespace run gives its last character back to ``(?!\\S)``; o200k's
  ``[U]*[W]+`` ends at the last W of the U-run), so each character is looked at a bounded number of
  times: linear time on any input.

Only ``pretokenize.py`` imports this module; the Python functions below check inputs and release
the GIL around the ``noexcept nogil`` cores declared in ``_pretok.pxd``.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memchr, memcmp, memcpy, memset
from libcpp.algorithm cimport sort
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from cpython cimport array

import array as _array

from bpe_core.runtime.lazy import np  # numpy on first use (a small run never imports it)

# Templates of the ``array.array`` outputs (``numpy=False``): uint8, int64.
cdef array.array _U8 = _array.array("B")
cdef array.array _I64 = _array.array("q")

cdef extern from "_unicode_tables.h" nogil:
    const char* BPE_UT_REGEX_VERSION
    const char* BPE_UT_UNICODE_VERSION
    const char* BPE_UT_DIGEST
    const uint16_t bpe_ut_leaves[]
    uint16_t bpe_ut_flags(uint32_t cp)
    enum:
        BPE_UT_L
        BPE_UT_N
        BPE_UT_S
        BPE_UT_U
        BPE_UT_W

# The fast path over 64 ASCII bytes at a time (see the header for its rules and contract).
cdef extern from "_ascii_window.h" nogil:
    unsigned bpe_aw_class(uint8_t c)
    int bpe_ascii_window(int pattern, const uint8_t* s, int64_t i, int64_t* ends, int64_t* stop)

# The counters' front-cache pass over a batch of pretokens (see the header).
cdef extern from "_count_front.h" nogil:
    ctypedef struct bpe_front_slot:
        pass
    enum:
        BPE_SHORT_MAX
    void bpe_cf_key(const uint8_t* p, uint64_t length, const uint8_t* limit,
                    const bpe_front_slot* front, uint64_t front_mask, uint64_t* keys,
                    uint32_t* fronts, size_t k)
    size_t bpe_cf_window(int pattern, const uint8_t* s, int64_t i, int64_t* stop,
                         const uint8_t* limit, const bpe_front_slot* front, uint64_t front_mask,
                         int64_t* ends, uint64_t* keys, uint32_t* fronts, size_t k)
    size_t bpe_front_hits(const uint64_t* keys, const uint32_t* fronts, size_t got,
                          bpe_front_slot* front, uint32_t* misses)

# Small C helpers: little-endian loads, byte order, count-trailing-zeros, prefetch, table memory.
cdef extern from *:
    """
    #include <string.h>
    #if defined(_MSC_VER)
    #include <stdlib.h>
    #include <intrin.h>
    #define BPE_BSWAP64(x) _byteswap_uint64(x)
    #else
    #define BPE_BSWAP64(x) __builtin_bswap64(x)
    #endif
    /* 8 bytes as a little-endian integer: byte k lands in bits 8k..8k+7 on every platform. */
    static inline uint64_t bpe_load_le64(const uint8_t* p) {
        uint64_t w;
        memcpy(&w, p, 8);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = BPE_BSWAP64(w);
    #endif
        return w;
    }
    /* A hint to start loading the cache line at p. */
    #if defined(_MSC_VER)
    #include <xmmintrin.h>
    #define bpe_prefetch(p) _mm_prefetch((const char*)(p), _MM_HINT_T0)
    #else
    #define bpe_prefetch(p) __builtin_prefetch((const void*)(p))
    #endif
    /* Index of the lowest set bit of w != 0. */
    static inline int bpe_ctz64(uint64_t w) {
    #if defined(_MSC_VER)
        unsigned long k; _BitScanForward64(&k, w); return (int)k;
    #else
        return __builtin_ctzll(w);
    #endif
    }
    /* A little-endian word turned around: comparing these compares the bytes in order. */
    static inline uint64_t bpe_order64(uint64_t w) { return BPE_BSWAP64(w); }

    /* Zeroed memory for the hash table. Lookups jump around it, so where the OS allows, large
     * blocks ask for transparent huge pages: with 4 KiB pages nearly every probe of a table of a
     * few MiB is a TLB miss (and under virtualisation a costly one). Free with free(). */
    #if defined(__linux__)
    #include <stdlib.h>
    #include <sys/mman.h>
    #endif
    /* Zeroed memory aligned to cache lines (64 bytes) where posix_memalign is (else calloc's
     * alignment: only slower). Free with free(). */
    static void* bpe_lines_alloc(size_t size) {
    #if defined(_MSC_VER)
        return calloc(size ? size : 1, 1);
    #else
        void* p = NULL;
        size = (size + 63) / 64 * 64;
        if (posix_memalign(&p, 64, size ? size : 64) != 0) return NULL;
        memset(p, 0, size);
        return p;
    #endif
    }
    static void* bpe_table_alloc(size_t size) {
    #if defined(__linux__) && defined(MADV_HUGEPAGE)
        const size_t huge = (size_t)2 << 20;
        if (size >= 2 * huge) {
            void* p = NULL;
            size_t rounded = (size + huge - 1) / huge * huge;
            if (posix_memalign(&p, huge, rounded) != 0) return NULL;
            madvise(p, rounded, MADV_HUGEPAGE);
            memset(p, 0, size);
            return p;
        }
    #endif
        return calloc(size, 1);
    }
    """
    uint64_t bpe_load_le64(const uint8_t* p) noexcept nogil
    uint64_t bpe_order64(uint64_t w) noexcept nogil
    int bpe_ctz64(uint64_t w) noexcept nogil
    void bpe_prefetch(const void* p) noexcept nogil
    void* bpe_table_alloc(size_t size) noexcept nogil
    void* bpe_lines_alloc(size_t size) noexcept nogil


# The table the scanners were built from (see scripts/gen_unicode_tables.py).
TABLES_REGEX_VERSION = BPE_UT_REGEX_VERSION.decode("ascii")
TABLES_UNICODE_VERSION = BPE_UT_UNICODE_VERSION.decode("ascii")
TABLES_DIGEST = BPE_UT_DIGEST.decode("ascii")
PATTERN_IDS = {"gpt2": PATTERN_GPT2, "cl100k": PATTERN_CL100K, "o200k": PATTERN_O200K}

cdef enum:
    LNS = BPE_UT_L | BPE_UT_N | BPE_UT_S  # none of these: "other", [^\s\p{L}\p{N}]
    APOS = 0x27  # '
    SPACE = 0x20
    LF = 0x0A
    CR = 0x0D
    SLASH = 0x2F


# ==== Characters ===================================================================================


cdef uint16_t _char_mb(const uint8_t* s, Py_ssize_t i, Py_ssize_t n,
                      Py_ssize_t* end) noexcept nogil:
    """``_char`` for a lead byte >= 0x80 (kept out of line so the ASCII paths stay small)."""
    cdef uint32_t b0 = s[i], b1, b2, b3
    if b0 >= 0xC2 and b0 < 0xE0:
        if i + 1 < n:
            b1 = s[i + 1]
            if (b1 & 0xC0) == 0x80:
                end[0] = i + 2
                return bpe_ut_flags(((b0 & 0x1F) << 6) | (b1 & 0x3F))
    elif b0 >= 0xE0 and b0 < 0xF0:
        if i + 2 < n:
            b1 = s[i + 1]
            b2 = s[i + 2]
            if ((b2 & 0xC0) == 0x80
                    and (b1 >= (0xA0 if b0 == 0xE0 else 0x80))
                    and (b1 <= (0x9F if b0 == 0xED else 0xBF))):
                end[0] = i + 3
                return bpe_ut_flags(((b0 & 0x0F) << 12) | ((b1 & 0x3F) << 6) | (b2 & 0x3F))
    elif b0 >= 0xF0 and b0 < 0xF5:
        if i + 3 < n:
            b1 = s[i + 1]
            b2 = s[i + 2]
            b3 = s[i + 3]
            if ((b2 & 0xC0) == 0x80 and (b3 & 0xC0) == 0x80
                    and (b1 >= (0x90 if b0 == 0xF0 else 0x80))
                    and (b1 <= (0x8F if b0 == 0xF4 else 0xBF))):
                end[0] = i + 4
                return bpe_ut_flags(((b0 & 0x07) << 18) | ((b1 & 0x3F) << 12)
                                    | ((b2 & 0x3F) << 6) | (b3 & 0x3F))
    end[0] = i + 1
    return bpe_ut_flags(0xDC00 | b0)  # an undecodable byte: its surrogateescape code point


cdef inline uint16_t _char(const uint8_t* s, Py_ssize_t i, Py_ssize_t n,
                           Py_ssize_t* end) noexcept nogil:
    """Flags of the character at s[i] (i < n); sets *end to the byte after it.

    A character is a valid UTF-8 sequence within s[i:n] (Python's strict decoder: no overlongs,
    no encoded surrogates, nothing above U+10FFFF, not cut by n) or, failing that, the single
    byte s[i] as the surrogate U+DC00 + s[i], which is what ``surrogateescape`` decodes it to.
    """
    if s[i] < 0x80:
        end[0] = i + 1
        return bpe_ut_leaves[s[i]]
    return _char_mb(s, i, n, end)


cdef inline Py_ssize_t _run(const uint8_t* s, Py_ssize_t j, Py_ssize_t n,
                            uint16_t mask, uint16_t want) noexcept nogil:
    """End of the run of characters from j whose ``flags & mask == want``."""
    cdef Py_ssize_t e
    cdef uint8_t c
    while j < n:
        c = s[j]
        if c < 0x80:
            if (bpe_ut_leaves[c] & mask) != want:
                break
            j += 1
        else:
            if (_char_mb(s, j, n, &e) & mask) != want:
                break
            j = e
    return j


cdef inline Py_ssize_t _run_ascii(const uint8_t* s, Py_ssize_t j, Py_ssize_t n, uint64_t fold,
                                  uint64_t add_lo, uint64_t add_hi, uint16_t mask,
                                  uint16_t want) noexcept nogil:
    """``_run(s, j, n, mask, want)``, eight bytes at a time while they are ASCII.

    The class must hold exactly the ASCII bytes x with ``lo <= (x | fold) <= hi`` (letters,
    lowercase, uppercase, digits). Most words are short ASCII runs; finding their end with one bit
    trick per 8 bytes instead of a branch per byte saves the mispredicted loop exit. For x < 0x80,
    ``x + (0x80 - lo)`` reaches 0x80 iff ``x >= lo`` and ``x + (0x7F - hi)`` iff ``x > hi``; no byte
    carries into the next. A byte >= 0x80 (maybe a non-ASCII member) hands over to ``_run``.
    ``add_lo``/``add_hi``/``fold`` are those constants repeated in all 8 bytes.
    """
    cdef uint64_t w, x, miss
    cdef Py_ssize_t k
    while j + 8 <= n:
        w = bpe_load_le64(s + j)
        x = (w & 0x7F7F7F7F7F7F7F7FULL) | fold
        miss = ~(((x + add_lo) & ~(x + add_hi)) & ~w) & 0x8080808080808080ULL
        if miss == 0:
            j += 8
            continue
        k = j + (bpe_ctz64(miss) >> 3)
        if s[k] < 0x80:
            return k
        return _run(s, k, n, mask, want)
    return _run(s, j, n, mask, want)


cdef inline Py_ssize_t _run_letters(const uint8_t* s, Py_ssize_t j, Py_ssize_t n) noexcept nogil:
    """``\p{L}*`` from j: ASCII ``[A-Za-z]`` (folded to a..z: 0x61..0x7A), then any letter."""
    return _run_ascii(s, j, n, 0x2020202020202020ULL, 0x1F1F1F1F1F1F1F1FULL,
                      0x0505050505050505ULL, BPE_UT_L, BPE_UT_L)


cdef inline Py_ssize_t _run_lower(const uint8_t* s, Py_ssize_t j, Py_ssize_t n) noexcept nogil:
    """o200k's ``[W]*`` from j: ASCII ``[a-z]`` (0x61..0x7A), then any W character."""
    return _run_ascii(s, j, n, 0, 0x1F1F1F1F1F1F1F1FULL, 0x0505050505050505ULL,
                      BPE_UT_W, BPE_UT_W)


cdef inline Py_ssize_t _run_upper(const uint8_t* s, Py_ssize_t j, Py_ssize_t n) noexcept nogil:
    """o200k's ``[U]*`` from j: ASCII ``[A-Z]`` (0x41..0x5A), then any U character."""
    return _run_ascii(s, j, n, 0, 0x3F3F3F3F3F3F3F3FULL, 0x2525252525252525ULL,
                      BPE_UT_U, BPE_UT_U)


cdef inline Py_ssize_t _run_numbers(const uint8_t* s, Py_ssize_t j, Py_ssize_t n) noexcept nogil:
    """``\p{N}*`` from j: ASCII ``[0-9]`` (0x30..0x39), then any number."""
    return _run_ascii(s, j, n, 0, 0x5050505050505050ULL, 0x4646464646464646ULL,
                      BPE_UT_N, BPE_UT_N)


cdef inline Py_ssize_t _run_digits(const uint8_t* s, Py_ssize_t j, Py_ssize_t n) noexcept nogil:
    """``\\p{N}{1,3}`` after the first digit, which ends at j: up to two more digits."""
    cdef Py_ssize_t e
    cdef int k
    for k in range(2):
        if j >= n or not (_char(s, j, n, &e) & BPE_UT_N):
            break
        j = e
    return j


cdef inline Py_ssize_t _run_bytes(const uint8_t* s, Py_ssize_t j, Py_ssize_t n,
                                  uint8_t a, uint8_t b, uint8_t c) noexcept nogil:
    """End of the run of the ASCII bytes a, b, c from j (``[\\r\\n]*``, ``[\\r\\n/]*``)."""
    while j < n and (s[j] == a or s[j] == b or s[j] == c):
        j += 1
    return j


cdef inline Py_ssize_t _contraction_ci(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """``'(?i:[sdmt]|ll|ve|re)`` at i: its end, or -1 (cl100k and o200k: the same seven endings)."""
    cdef Py_ssize_t j, k
    cdef uint16_t a, b
    if i + 1 >= n or s[i] != APOS:
        return -1
    a = _char(s, i + 1, n, &j) >> 8
    if a == c's' or a == c'd' or a == c'm' or a == c't':
        return j
    if (a == c'l' or a == c'v' or a == c'r') and j < n:
        b = _char(s, j, n, &k) >> 8
        if (a == c'l' and b == c'l') or (a != c'l' and b == c'e'):
            return k
    return -1


cdef inline Py_ssize_t _ws_run(const uint8_t* s, Py_ssize_t j, Py_ssize_t n,
                               Py_ssize_t* last, Py_ssize_t* after_crlf) noexcept nogil:
    """End of the ``\\s`` run that continues at j; updates *last (start of its last character) and
    *after_crlf (the byte after its last CR or LF, if any)."""
    cdef Py_ssize_t e
    cdef uint8_t c
    while j < n:
        c = s[j]
        if c < 0x80:
            if not (bpe_ut_leaves[c] & BPE_UT_S):
                break
            if c == LF or c == CR:
                after_crlf[0] = j + 1
            last[0] = j
            j += 1
        else:
            if not (_char_mb(s, j, n, &e) & BPE_UT_S):
                break
            last[0] = j
            j = e
    return j


# ==== Scanners =====================================================================================
#
# Each _end_<pattern> is small and inlined into the driver loops; it handles the frequent cases
# (letters, an optional prefix before letters, digits) and leaves punctuation and whitespace to
# out-of-line helpers.


cdef Py_ssize_t _ws_end(const uint8_t* s, Py_ssize_t i, Py_ssize_t j, Py_ssize_t n,
                        int pattern_id) noexcept nogil:
    """The whitespace alternatives at i, whose character ends at j (s[i] is ``\s``).

    gpt2: ``\s+(?!\S)|\s+``; cl100k: ``\s++$|\s*[\r\n]|\s+(?!\S)|\s``;
    o200k: ``\s*[\r\n]+|\s+(?!\S)|\s+``. ``\s+(?!\S)`` takes the whole run at the end of the
    text, else gives its last character back (unless the run is one character).
    """
    cdef Py_ssize_t last = i
    cdef Py_ssize_t after_crlf = j if (s[i] == CR or s[i] == LF) else -1
    cdef Py_ssize_t k = _ws_run(s, j, n, &last, &after_crlf)
    if pattern_id == PATTERN_GPT2:
        after_crlf = -1
    if pattern_id == PATTERN_CL100K and k == n:  # \s++$ comes before \s*[\r\n]
        return n
    if after_crlf >= 0:  # \s*[\r\n] (cl100k), \s*[\r\n]+ (o200k): to the last CR/LF of the run
        return after_crlf
    if k == n:
        return n
    if last > i:
        return last
    return k


cdef Py_ssize_t _other_end(const uint8_t* s, Py_ssize_t i, Py_ssize_t j, uint16_t f, Py_ssize_t n,
                           int pattern_id) noexcept nogil:
    """`` ?[^\s\p{L}\p{N}]+`` and what follows it, else the whitespace alternatives.

    Called when s[i] (ending at j, flags f) is not a letter and starts no letter/digit pretoken.
    cl100k appends ``[\r\n]*``, o200k ``[\r\n/]*``.
    """
    cdef Py_ssize_t k
    cdef uint16_t f1
    if s[i] == SPACE and j < n:
        f1 = _char(s, j, n, &k)
        if not (f1 & LNS):
            f = f1
            j = k
    if f & BPE_UT_S:
        return _ws_end(s, i, j, n, pattern_id)
    j = _run(s, j, n, LNS, 0)
    if pattern_id == PATTERN_CL100K:
        return _run_bytes(s, j, n, CR, LF, LF)
    if pattern_id == PATTERN_O200K:
        return _run_bytes(s, j, n, CR, LF, SLASH)
    return j


cdef inline Py_ssize_t _end_gpt2(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """GPT-2: ``'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+``.

    Example: ``I'm  a`` -> ``I``, ``'m``, `` ``, `` a``.
    """
    cdef uint8_t c = s[i], c1
    cdef Py_ssize_t j, k
    cdef uint16_t f, f1
    if c == APOS and i + 1 < n:  # case-sensitive contractions
        c1 = s[i + 1]
        if c1 == c's' or c1 == c'd' or c1 == c'm' or c1 == c't':
            return i + 2
        if i + 2 < n and ((c1 == c'l' and s[i + 2] == c'l') or (c1 == c'v' and s[i + 2] == c'e')
                          or (c1 == c'r' and s[i + 2] == c'e')):
            return i + 3
    f = _char(s, i, n, &j)
    if c == SPACE and j < n:  # " ?" before a letter or digit run
        f1 = _char(s, j, n, &k)
        if f1 & (BPE_UT_L | BPE_UT_N):
            f = f1
            j = k
    if f & BPE_UT_L:
        return _run_letters(s, j, n)
    if f & BPE_UT_N:
        return _run_numbers(s, j, n)
    return _other_end(s, i, j, f, n, PATTERN_GPT2)


cdef inline Py_ssize_t _end_cl100k(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """cl100k: ``'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|``
    `` ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s``.

    Example: ``I'M 123456!\n\n`` -> ``I``, ``'M``, `` ``, ``123``, ``456``, ``!\n\n``.
    """
    cdef uint8_t c = s[i]
    cdef Py_ssize_t j, k
    cdef uint16_t f
    if c == APOS:
        k = _contraction_ci(s, i, n)
        if k >= 0:
            return k
    f = _char(s, i, n, &j)
    if f & BPE_UT_L:
        return _run_letters(s, j, n)
    if f & BPE_UT_N:
        return _run_digits(s, j, n)
    # [^\r\n\p{L}\p{N}]?+\p{L}++: one prefix character before letters (possessive: if no
    # letter follows, the alternative fails; without the prefix it could not match either).
    if c != CR and c != LF and j < n and (_char(s, j, n, &k) & BPE_UT_L):
        return _run_letters(s, k, n)
    return _other_end(s, i, j, f, n, PATTERN_CL100K)


cdef inline Py_ssize_t _o200k_lower_first(const uint8_t* s, Py_ssize_t p, Py_ssize_t n) noexcept nogil:
    """``[U]*[W]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`` at p: its end, or -1.

    U = ``[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]``, W = ``[\p{Ll}\p{Lm}\p{Lo}\p{M}]``. ``[U]*`` backs off
    from the end of the U-run until ``[W]+`` can start: at the last W character of the run, or
    just after the run when a W (an Ll) follows it.
    """
    cdef Py_ssize_t q = p, e, k = -1
    cdef uint16_t f = 0
    while q < n:
        f = _char(s, q, n, &e)
        if not (f & BPE_UT_U):
            break
        if f & BPE_UT_W:
            k = q
        q = e
    if q < n and (f & BPE_UT_W):
        k = q
    if k < 0:
        return -1
    e = _run_lower(s, k, n)
    k = _contraction_ci(s, e, n)
    return k if k >= 0 else e


cdef Py_ssize_t _o200k_upper_first(const uint8_t* s, Py_ssize_t p, Py_ssize_t n) noexcept nogil:
    """``[U]+[W]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`` at p: its end, or -1."""
    cdef Py_ssize_t e
    if p >= n or not (_char(s, p, n, &e) & BPE_UT_U):
        return -1
    e = _run_lower(s, _run_upper(s, e, n), n)
    p = _contraction_ci(s, e, n)
    return p if p >= 0 else e


cdef inline Py_ssize_t _end_o200k(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """o200k: ``P?[U]*[W]+C?|P?[U]+[W]*C?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|``
    ``\s+(?!\S)|\s+`` with P = ``[^\r\n\p{L}\p{N}]`` and C the contractions, any case.

    Example: ``HELLOworld's 1234`` -> ``HELLOworld's``, `` ``, ``123``, ``4``.
    """
    cdef uint8_t c = s[i]
    cdef Py_ssize_t j, k
    cdef uint16_t f = _char(s, i, n, &j)
    cdef bint prefix = not (f & (BPE_UT_L | BPE_UT_N)) and c != CR and c != LF
    # Alternative 1 with, then without, the optional prefix; then alternative 2 likewise.
    if prefix:
        k = _o200k_lower_first(s, j, n)
        if k >= 0:
            return k
    if f & (BPE_UT_U | BPE_UT_W):
        k = _o200k_lower_first(s, i, n)
        if k >= 0:
            return k
    if prefix:
        k = _o200k_upper_first(s, j, n)
        if k >= 0:
            return k
    if f & BPE_UT_U:
        k = _o200k_upper_first(s, i, n)
        if k >= 0:
            return k
    if f & BPE_UT_N:
        return _run_digits(s, j, n)
    return _other_end(s, i, j, f, n, PATTERN_O200K)


cdef Py_ssize_t _next_gpt2(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    return _end_gpt2(s, i, n)


cdef Py_ssize_t _next_cl100k(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    return _end_cl100k(s, i, n)


cdef Py_ssize_t _next_o200k(const uint8_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    return _end_o200k(s, i, n)


# The drivers switch on the pattern once, outside the loop, so each loop inlines its scanner.


cdef inline bint _ascii_letter(uint8_t c) noexcept nogil:
    """``[A-Za-z]``: ``c | 0x20`` in ``a..z`` (the ASCII letters, all ``\p{L}``)."""
    return <uint8_t>((c | 0x20) - 0x61) < 26


cdef bint _check_ascii_classes() noexcept nogil:
    """Whether the Unicode tables give every ASCII byte the class the 64-byte windows assume
    (``bpe_aw_class``: letters, upper case, digits, whitespace); if not, the windows stay off."""
    cdef unsigned c, f, want
    cdef uint16_t t
    for c in range(128):
        f = bpe_aw_class(<uint8_t>c)
        t = bpe_ut_leaves[c]
        want = (((f & 1) != 0) * BPE_UT_L) | (((f & 4) != 0) * BPE_UT_N) | (((f & 8) != 0) * BPE_UT_S)
        want |= (((f & 2) != 0) * BPE_UT_U) | ((((f & 1) != 0) and not (f & 2)) * BPE_UT_W)
        if (t & (BPE_UT_L | BPE_UT_N | BPE_UT_S | BPE_UT_U | BPE_UT_W)) != want:
            return False
    return True


cdef bint _WINDOWS = _check_ascii_classes()
ASCII_WINDOWS = bool(_WINDOWS)  # for the tests: the fast path is in use


cdef inline Py_ssize_t _window(int pattern_id, const uint8_t* s, Py_ssize_t i, int64_t* ends,
                               Py_ssize_t room, int64_t* stop) noexcept nogil:
    """The pretoken ends the 64 ASCII bytes at s[i] prove (``bpe_ascii_window``; needs i + 64 <= n),
    at most ``room`` of them, into ends; how many."""
    cdef int64_t spare[64]
    cdef Py_ssize_t k
    if room >= 62:  # a window writes at most 62
        return bpe_ascii_window(pattern_id, s, i, ends, stop)
    k = bpe_ascii_window(pattern_id, s, i, spare, stop)
    if k > room:
        k = room
    memcpy(ends, spare, k * sizeof(int64_t))
    return k


cdef Py_ssize_t _split_ends(int pattern_id, const uint8_t* s, Py_ssize_t* pos, Py_ssize_t n,
                            int64_t* ends, Py_ssize_t cap) noexcept nogil:
    # Where 64 bytes on are still in the span, a window proves the ends of many pretokens at once
    # (ASCII text); else, and up to ``stop`` (the byte after a non-ASCII byte that stopped a
    # window), and when a window proves nothing, one pretoken with the exact scanner.
    cdef Py_ssize_t i = pos[0], n_ends = 0, k
    cdef int64_t stop = 0
    if pattern_id == PATTERN_GPT2:
        while i < n and n_ends < cap:
            if _WINDOWS and i >= stop and n - i >= 64:
                k = _window(PATTERN_GPT2, s, i, ends + n_ends, cap - n_ends, &stop)
                if k > 0:
                    n_ends += k
                    i = ends[n_ends - 1]
                    continue
            # The most frequent pretokens, an ASCII letter or a space and an ASCII letter, then
            # letters, take the same path as in _end_gpt2 without a call.
            if _ascii_letter(s[i]):
                i = _run_letters(s, i + 1, n)
            elif s[i] == SPACE and i + 1 < n and _ascii_letter(s[i + 1]):
                i = _run_letters(s, i + 2, n)
            else:
                i = _end_gpt2(s, i, n)
            ends[n_ends] = i
            n_ends += 1
    elif pattern_id == PATTERN_CL100K:
        while i < n and n_ends < cap:
            if _WINDOWS and i >= stop and n - i >= 64:
                k = _window(PATTERN_CL100K, s, i, ends + n_ends, cap - n_ends, &stop)
                if k > 0:
                    n_ends += k
                    i = ends[n_ends - 1]
                    continue
            if _ascii_letter(s[i]):  # likewise for _end_cl100k
                i = _run_letters(s, i + 1, n)
            elif s[i] == SPACE and i + 1 < n and _ascii_letter(s[i + 1]):
                i = _run_letters(s, i + 2, n)
            else:
                i = _end_cl100k(s, i, n)
            ends[n_ends] = i
            n_ends += 1
    else:
        while i < n and n_ends < cap:
            if _WINDOWS and i >= stop and n - i >= 64:
                k = _window(PATTERN_O200K, s, i, ends + n_ends, cap - n_ends, &stop)
                if k > 0:
                    n_ends += k
                    i = ends[n_ends - 1]
                    continue
            i = _end_o200k(s, i, n)
            ends[n_ends] = i
            n_ends += 1
    pos[0] = i
    return n_ends


# ==== Counting =====================================================================================


cdef enum:
    SCAN_CAP = 128  # pretoken ends the counters scan ahead of hashing them (1 KiB: stays in L1)


cdef uint64_t _HEAD_MASKS[17][2]  # [min(length, 16)] -> the masks of the two head words
cdef int _k
for _k in range(17):
    _HEAD_MASKS[_k][0] = 0xFFFFFFFFFFFFFFFFULL if _k >= 8 else (<uint64_t>1 << (8 * _k)) - 1
    _HEAD_MASKS[_k][1] = (0xFFFFFFFFFFFFFFFFULL if _k >= 16
                          else ((<uint64_t>1 << (8 * (_k - 8))) - 1 if _k > 8 else 0))


cdef inline void _head16(const uint8_t* p, Py_ssize_t length, const uint8_t* limit,
                         uint64_t* w0, uint64_t* w1) noexcept nogil:
    """The first 16 bytes of p[0:length], zero-padded, as two little-endian words.

    Reads 16 bytes at once when they lie before ``limit`` (the end of the whole buffer), then
    masks them with a table lookup rather than branches on the length.
    """
    cdef uint8_t tmp[16]
    cdef uint64_t a, b
    cdef Py_ssize_t k
    if p + 16 <= limit:
        a = bpe_load_le64(p)
        b = bpe_load_le64(p + 8)
    else:
        for k in range(16):
            tmp[k] = p[k] if k < length else 0
        a = bpe_load_le64(tmp)
        b = bpe_load_le64(tmp + 8)
    k = length if length < 16 else 16
    a &= _HEAD_MASKS[k][0]
    b &= _HEAD_MASKS[k][1]
    w0[0] = a
    w1[0] = b


cdef inline uint64_t _hash(uint64_t w0, uint64_t w1, const uint8_t* p,
                           Py_ssize_t length) noexcept nogil:
    """64-bit hash of a word from its head words (and, past 16 bytes, the rest of p)."""
    cdef uint64_t h = (w0 * 0x9E3779B97F4A7C15ULL) ^ ((w1 + <uint64_t>length) * 0xC2B2AE3D27D4EB4FULL)
    cdef Py_ssize_t i = 16
    cdef uint8_t tmp[8]
    cdef Py_ssize_t k
    while i < length:
        if i + 8 <= length:
            h = (h ^ bpe_load_le64(p + i)) * 0xBF58476D1CE4E5B9ULL
        else:
            for k in range(8):
                tmp[k] = p[i + k] if i + k < length else 0
            h = (h ^ bpe_load_le64(tmp)) * 0xBF58476D1CE4E5B9ULL
        h ^= h >> 31
        i += 8
    h ^= h >> 32
    h *= 0xD6E8FEB86659FD93ULL
    h ^= h >> 32
    return h


cdef int _table_init(CountTable* t, Py_ssize_t capacity) noexcept nogil:
    t.slots = <uint64_t*>bpe_table_alloc(capacity * sizeof(uint64_t))
    t.mask = capacity - 1
    t.cap_entries = capacity // 2
    t.entries = <Entry*>bpe_table_alloc(t.cap_entries * sizeof(Entry))
    t.n_entries = 0
    return 0 if (t.slots != NULL and t.entries != NULL) else -1


cdef void _table_free(CountTable* t) noexcept nogil:
    free(t.slots)
    free(t.entries)
    t.slots = NULL
    t.entries = NULL


cdef int _table_grow(CountTable* t) noexcept nogil:
    """Double the capacity: a new slot array, the entries array extended in place."""
    cdef Py_ssize_t cap = (t.mask + 1) * 2, i, idx
    cdef uint64_t h
    cdef uint64_t* slots = <uint64_t*>bpe_table_alloc(cap * sizeof(uint64_t))
    cdef Entry* entries = <Entry*>bpe_table_alloc((cap // 2) * sizeof(Entry))
    if slots == NULL or entries == NULL:
        free(slots)
        free(entries)
        return -1
    memcpy(entries, t.entries, t.n_entries * sizeof(Entry))
    free(t.entries)
    for i in range(t.n_entries):
        h = _hash(entries[i].w0, entries[i].w1, entries[i].ptr, entries[i].length)
        idx = h & (cap - 1)
        while slots[idx] != 0:
            idx = (idx + 1) & (cap - 1)
        slots[idx] = (h & 0xFFFFFFFF00000000ULL) | <uint64_t>(i + 1)
    free(t.slots)
    t.slots = slots
    t.entries = entries
    t.mask = cap - 1
    t.cap_entries = cap // 2
    return 0


cdef inline void _pend(Pending* q, const uint8_t* p, Py_ssize_t length, const uint8_t* limit,
                       CountTable* t) noexcept nogil:
    """Record a scanned pretoken with its hash, and start loading its first probe slot."""
    q.ptr = p
    q.length = length
    _head16(p, length, limit, &q.w0, &q.w1)
    q.h = _hash(q.w0, q.w1, p, length)
    bpe_prefetch(&t.slots[q.h & t.mask])


cdef inline int _table_add(CountTable* t, const Pending* q, int64_t count) noexcept nogil:
    """Add count to the entry of the word q, inserting it if new; 0, or -1 when out of memory.

    A slot is 8 bytes (hash tag, entry number), so the probe array stays small; entries are
    dense in first-seen order, so the frequent words, seen early, share cache lines; each keeps
    its first 16 bytes inline, and only words longer than that compare the rest in the buffer.
    """
    cdef uint64_t tag = q.h & 0xFFFFFFFF00000000ULL, slot
    cdef Py_ssize_t idx = q.h & t.mask, length = q.length
    cdef Entry* e
    while True:
        slot = t.slots[idx]
        if slot == 0:
            break
        if (slot & 0xFFFFFFFF00000000ULL) == tag:
            e = &t.entries[(slot & 0xFFFFFFFFULL) - 1]
            if (e.w0 == q.w0 and e.w1 == q.w1 and e.length == length
                    and (length <= 16 or memcmp(e.ptr + 16, q.ptr + 16, length - 16) == 0)):
                e.count += count
                return 0
        idx = (idx + 1) & t.mask
    if t.n_entries >= t.cap_entries:  # keep the slots at most half full
        if t.n_entries >= <Py_ssize_t>0xFFFFFFFFLL or _table_grow(t) != 0:
            return -1
        return _table_add(t, q, count)
    e = &t.entries[t.n_entries]
    e.w0 = q.w0
    e.w1 = q.w1
    e.ptr = q.ptr
    e.length = length
    e.count = count
    t.n_entries += 1
    t.slots[idx] = tag | <uint64_t>t.n_entries
    return 0


cdef inline void _prefetch_entries(const CountTable* t, const Pending* queue,
                                   Py_ssize_t n_pending) noexcept nogil:
    """Request the entries a batch of pending pretokens will look up (their slots were requested
    when they were scanned), so that the batch's cache misses overlap (the three ``_flush``)."""
    cdef Py_ssize_t k
    cdef uint64_t slot
    for k in range(n_pending):
        slot = t.slots[queue[k].h & t.mask]
        if slot != 0:
            bpe_prefetch(&t.entries[(slot & 0xFFFFFFFFULL) - 1])


cdef int _flush(CountTable* t, const Pending* queue, Py_ssize_t n_pending) noexcept nogil:
    """Count a batch of pending pretokens.

    The slots were requested when the pretokens were scanned; the entries they name are requested
    now, all at once, and only then are the lookups done: the cache misses of a batch overlap
    instead of stalling one after another (the table outgrows the caches on real corpora).
    """
    cdef Py_ssize_t k
    _prefetch_entries(t, queue, n_pending)
    for k in range(n_pending):
        if _table_add(t, &queue[k], 1) != 0:
            return -1
    return 0


# ---- The plain count: a front cache, a short table, a long table ----
#
# Words of up to 15 bytes (BPE_SHORT_MAX, nearly every pretoken) are counted in two structures, words
# of 16 or more in the CountTable above (``_table_add``: an entry that points back into the buffer).
#
# - The short table: open addressing with linear probing, each 32-byte slot holding a word's first
#   16 bytes (zero-padded), its length and its count inline, so a lookup touches one cache line and
#   follows no pointer. At most 3/4 full (a probe run of a few slots stays in a line or two, and
#   the table holding every unique word is the largest thing a worker allocates); it doubles when a
#   batch would pass that.
# - The front cache: a small direct-mapped array (FRONT_SLOTS, in L2) in front of it. A slot holds
#   a word's key (its head words, the length in the top byte: _count_front.h), its slot number in
#   the short table and the counts not yet added there; a hit is an increment. A miss goes through the short table, then takes the front slot, and the
#   word it evicts has its pending counts added to its short slot (a direct index, no lookup).
#   Before the short table grows (its slot numbers change) and at the end, every pending count is
#   added and the front cache emptied. Counts are sums: the order they arrive in changes nothing.


cdef enum:
    FRONT_SLOTS = 32768  # at most (1 MiB); fewer for a small input
    SHORT_MIN_SLOTS = 64
    SHORT_START_SLOTS = 1 << 18  # at most, to begin with (8 MiB; a slot per 64 bytes of input)


cdef inline uint64_t _short_hash(uint64_t w0, uint64_t w1, Py_ssize_t length) noexcept nogil:
    """``_hash`` of a word of up to 16 bytes (its head words say it all; the short table's are up to 15)."""
    cdef uint64_t h = (w0 * 0x9E3779B97F4A7C15ULL) ^ ((w1 + <uint64_t>length) * 0xC2B2AE3D27D4EB4FULL)
    h ^= h >> 32
    h *= 0xD6E8FEB86659FD93ULL
    h ^= h >> 32
    return h


cdef int _counter_init(WordCounter* c, Py_ssize_t n_bytes) noexcept nogil:
    """Structures sized to the input (a small input, small ones); 0, or -1 when out of memory."""
    cdef Py_ssize_t n_front = 64, n_short = SHORT_MIN_SLOTS
    while n_front < FRONT_SLOTS and n_front < n_bytes // 32:
        n_front *= 2
    while n_short < SHORT_START_SLOTS and n_short < n_bytes // 64:
        n_short *= 2
    c.front = <FrontSlot*>bpe_lines_alloc(n_front * sizeof(FrontSlot))  # a slot never straddles two lines
    c.front_mask = n_front - 1
    c.short.slots = <ShortSlot*>bpe_table_alloc(n_short * sizeof(ShortSlot))
    c.short.mask = n_short - 1
    c.short.n_words = 0
    if _table_init(&c.long, 64) != 0 or c.front == NULL or c.short.slots == NULL:
        return -1
    return 0


cdef void _counter_free(WordCounter* c) noexcept nogil:
    free(c.front)
    free(c.short.slots)
    c.front = NULL
    c.short.slots = NULL
    _table_free(&c.long)


cdef void _front_drain(WordCounter* c) noexcept nogil:
    """Add every front slot's pending counts to its short slot and empty the front cache."""
    cdef Py_ssize_t k
    cdef FrontSlot* f
    for k in range(<Py_ssize_t>c.front_mask + 1):
        f = &c.front[k]
        if f.pending != 0:
            c.short.slots[f.idx].count += f.pending
    memset(c.front, 0, (c.front_mask + 1) * sizeof(FrontSlot))


cdef int _short_grow(WordCounter* c) noexcept nogil:
    """Double the short table (the front cache is drained first: its slot numbers change)."""
    cdef Py_ssize_t cap = (c.short.mask + 1) * 2, k, idx
    cdef ShortSlot* old = c.short.slots
    cdef ShortSlot* slots
    if cap > (<Py_ssize_t>1 << 32):  # slot numbers are uint32 in the front cache
        return -1
    slots = <ShortSlot*>bpe_table_alloc(cap * sizeof(ShortSlot))
    if slots == NULL:
        return -1
    _front_drain(c)
    for k in range(c.short.mask + 1):
        if old[k].length != 0:
            idx = _short_hash(old[k].w0, old[k].w1, <Py_ssize_t>old[k].length) & (cap - 1)
            while slots[idx].length != 0:
                idx = (idx + 1) & (cap - 1)
            slots[idx] = old[k]
    free(old)
    c.short.slots = slots
    c.short.mask = cap - 1
    return 0


cdef int _flush_short(WordCounter* c, const ShortPending* queue, Py_ssize_t n_pending) noexcept nogil:
    """Count a batch of front-cache misses in the short table; each word then takes its front slot.

    The short slots were requested when the misses were found (and the evicted words' slots), so
    the cache misses of a batch overlap.
    """
    cdef Py_ssize_t k, idx
    cdef uint64_t mask
    cdef bint empty
    cdef ShortSlot* e
    cdef FrontSlot* f
    cdef const ShortPending* q
    if 4 * (c.short.n_words + n_pending) > 3 * (c.short.mask + 1):  # at most 3/4 full
        if _short_grow(c) != 0:
            return -1
    mask = c.short.mask
    for k in range(n_pending):
        q = &queue[k]
        idx = q.h & mask
        e = &c.short.slots[idx]
        empty = e.length == 0
        if not (empty or (e.w0 == q.w0 and e.w1 == q.w1 and e.length == q.length)):
            while True:  # the first slot holds another word: probe on
                idx = (idx + 1) & mask
                e = &c.short.slots[idx]
                empty = e.length == 0
                if empty or (e.w0 == q.w0 and e.w1 == q.w1 and e.length == q.length):
                    break
        # The word's slot, empty or its own: the same writes either way (no branch on which; an
        # empty slot's count is 0).
        e.w0 = q.w0
        e.w1 = q.w1
        e.length = q.length
        e.count += 1
        c.short.n_words += empty
        f = &c.front[q.front]
        c.short.slots[f.idx].count += f.pending  # the evicted word's counts (an empty slot: 0 to slot 0)
        f.w0 = q.w0
        f.w1 = q.w1 | (<uint64_t>q.length << 56)  # the key of bpe_front_count
        f.length = <uint32_t>q.length
        f.idx = <uint32_t>idx
        f.pending = 0
    return 0


cdef Py_ssize_t _key_ends(int pattern_id, const uint8_t* s, Py_ssize_t* pos, Py_ssize_t n,
                          const uint8_t* limit, const WordCounter* c, int64_t* ends, uint64_t* keys,
                          uint32_t* fronts) noexcept nogil:
    """``_split_ends`` (same ends, SCAN_CAP or up to 62 more), each pretoken keyed for the front cache
    as it is found (``bpe_cf_window``, ``bpe_cf_key``): its key and front slot (requested)."""
    cdef Py_ssize_t i = pos[0], a
    cdef size_t n_ends = 0, k
    cdef int64_t stop = 0
    cdef const bpe_front_slot* front = <const bpe_front_slot*>c.front
    cdef uint64_t mask = c.front_mask
    if pattern_id == PATTERN_GPT2:
        while i < n and n_ends < SCAN_CAP:
            if _WINDOWS and i >= stop and n - i >= 64:
                k = bpe_cf_window(PATTERN_GPT2, s, i, &stop, limit, front, mask, ends, keys, fronts, n_ends)
                if k > n_ends:
                    n_ends = k
                    i = ends[n_ends - 1]
                    continue
            a = i
            if _ascii_letter(s[i]):  # as in _split_ends
                i = _run_letters(s, i + 1, n)
            elif s[i] == SPACE and i + 1 < n and _ascii_letter(s[i + 1]):
                i = _run_letters(s, i + 2, n)
            else:
                i = _end_gpt2(s, i, n)
            bpe_cf_key(s + a, i - a, limit, front, mask, keys, fronts, n_ends)
            ends[n_ends] = i
            n_ends += 1
    elif pattern_id == PATTERN_CL100K:
        while i < n and n_ends < SCAN_CAP:
            if _WINDOWS and i >= stop and n - i >= 64:
                k = bpe_cf_window(PATTERN_CL100K, s, i, &stop, limit, front, mask, ends, keys, fronts,
                                  n_ends)
                if k > n_ends:
                    n_ends = k
                    i = ends[n_ends - 1]
                    continue
            a = i
            if _ascii_letter(s[i]):
                i = _run_letters(s, i + 1, n)
            elif s[i] == SPACE and i + 1 < n and _ascii_letter(s[i + 1]):
                i = _run_letters(s, i + 2, n)
            else:
                i = _end_cl100k(s, i, n)
            bpe_cf_key(s + a, i - a, limit, front, mask, keys, fronts, n_ends)
            ends[n_ends] = i
            n_ends += 1
    else:
        while i < n and n_ends < SCAN_CAP:
            if _WINDOWS and i >= stop and n - i >= 64:
                k = bpe_cf_window(PATTERN_O200K, s, i, &stop, limit, front, mask, ends, keys, fronts,
                                  n_ends)
                if k > n_ends:
                    n_ends = k
                    i = ends[n_ends - 1]
                    continue
            a = i
            i = _end_o200k(s, i, n)
            bpe_cf_key(s + a, i - a, limit, front, mask, keys, fronts, n_ends)
            ends[n_ends] = i
            n_ends += 1
    pos[0] = i
    return n_ends


cdef int _count_span(int pattern_id, const uint8_t* s, Py_ssize_t i, Py_ssize_t n,
                     const uint8_t* limit, WordCounter* c) noexcept nogil:
    """Count the pretokens of s[i:n] into c (its front cache keeps pending counts: ``_counter_drain``).

    The pretokens come from ``_key_ends`` (``_split_ends`` keying each pretoken for the front cache
    as it is found, and requesting its front slot), SCAN_CAP or a few more at a time, and are looked
    up in a second pass (``bpe_front_hits``), so the slots' cache misses overlap with the scanning
    and with each other. Misses queue for the short table
    (``_flush_short``) BATCH at a time, each batch flushed when the next one is full (its slots were
    requested a batch earlier); longer words queue for the long table (``_flush``).
    """
    cdef ShortPending queues[2][BATCH]
    cdef ShortPending* queue = queues[0]
    cdef ShortPending* older = queues[1]
    cdef ShortPending* swap
    cdef Py_ssize_t n_older = 0
    cdef Pending long_queue[BATCH]
    cdef int64_t ends[SCAN_CAP + 64]
    cdef uint64_t heads[2 * (SCAN_CAP + 64)]
    cdef uint32_t fronts[SCAN_CAP + 64]
    cdef uint32_t misses[SCAN_CAP + 64]
    cdef Py_ssize_t j, k, got, n_misses, length, start = i, n_pending = 0, n_long = 0
    cdef int64_t a
    cdef uint64_t w0, w1, h
    cdef FrontSlot* f
    cdef ShortPending* q
    while i < n:
        got = _key_ends(pattern_id, s, &i, n, limit, c, ends, heads, fronts)
        n_misses = bpe_front_hits(heads, fronts, got, <bpe_front_slot*>c.front, misses)
        for j in range(n_misses):
            k = misses[j]
            a = ends[k - 1] if k > 0 else start
            length = ends[k] - a
            if length <= BPE_SHORT_MAX:
                w0 = heads[2 * k]
                w1 = heads[2 * k + 1] & 0x00FFFFFFFFFFFFFFULL  # without the length tag
                f = &c.front[fronts[k]]
                bpe_prefetch(&c.short.slots[f.idx])  # where its evicted word's counts go (_flush_short)
                h = _short_hash(w0, w1, length)
                bpe_prefetch(&c.short.slots[h & c.short.mask])
                bpe_prefetch(&c.short.slots[(h + 1) & c.short.mask])  # its probe's next slot
                q = &queue[n_pending]
                q.w0 = w0
                q.w1 = w1
                q.h = h
                q.length = length
                q.front = fronts[k]
                n_pending += 1
                if n_pending == BATCH:
                    # Flush the batch before this one: its slots have had a batch's time to
                    # arrive; this one waits its turn.
                    if _flush_short(c, older, n_older) != 0:
                        return -1
                    swap = older
                    older = queue
                    queue = swap
                    n_older = n_pending
                    n_pending = 0
            else:
                _pend(&long_queue[n_long], s + a, length, limit, &c.long)
                n_long += 1
                if n_long == BATCH:
                    if _flush(&c.long, long_queue, n_long) != 0:
                        return -1
                    n_long = 0
        if got > 0:
            start = ends[got - 1]
    if _flush_short(c, older, n_older) != 0 or _flush_short(c, queue, n_pending) != 0:
        return -1
    return _flush(&c.long, long_queue, n_long)


cdef void _counter_drain(WordCounter* c) noexcept nogil:
    """Add the front cache's pending counts to the short table (before it is read)."""
    _front_drain(c)


# ---- Record mode: also the entry number of every pretoken, in text order ----


cdef struct IdBuf:  # a growable uint32 array (libc memory)
    uint32_t* data
    Py_ssize_t n
    Py_ssize_t cap


cdef int _ids_reserve(IdBuf* rec, Py_ssize_t more) noexcept nogil:
    """Room for ``more`` further ids (capacity doubles); 0, or -1 when out of memory."""
    cdef Py_ssize_t cap = rec.cap
    cdef uint32_t* data
    if rec.n + more <= cap:
        return 0
    if cap < (1 << 16):
        cap = 1 << 16
    while cap < rec.n + more:
        cap *= 2
    data = <uint32_t*>realloc(rec.data, cap * sizeof(uint32_t))
    if data == NULL:
        return -1
    rec.data = data
    rec.cap = cap
    return 0


cdef inline Py_ssize_t _table_add_id(CountTable* t, const Pending* q) noexcept nogil:
    """``_table_add(t, q, 1)`` that returns the word's entry number (or -1 when out of memory).

    A twin rather than a change to ``_table_add``: the plain count's code stays as it was.
    """
    cdef uint64_t tag = q.h & 0xFFFFFFFF00000000ULL, slot
    cdef Py_ssize_t idx = q.h & t.mask, length = q.length, i
    cdef Entry* e
    while True:
        slot = t.slots[idx]
        if slot == 0:
            break
        if (slot & 0xFFFFFFFF00000000ULL) == tag:
            i = <Py_ssize_t>(slot & 0xFFFFFFFFULL) - 1
            e = &t.entries[i]
            if (e.w0 == q.w0 and e.w1 == q.w1 and e.length == length
                    and (length <= 16 or memcmp(e.ptr + 16, q.ptr + 16, length - 16) == 0)):
                e.count += 1
                return i
        idx = (idx + 1) & t.mask
    if t.n_entries >= t.cap_entries:  # keep the slots at most half full
        if t.n_entries >= <Py_ssize_t>0xFFFFFFFFLL or _table_grow(t) != 0:
            return -1
        return _table_add_id(t, q)
    e = &t.entries[t.n_entries]
    e.w0 = q.w0
    e.w1 = q.w1
    e.ptr = q.ptr
    e.length = length
    e.count = 1
    t.n_entries += 1
    t.slots[idx] = tag | <uint64_t>t.n_entries
    return t.n_entries - 1


cdef int _flush_rec(CountTable* t, const Pending* queue, Py_ssize_t n_pending,
                    IdBuf* rec) noexcept nogil:
    """``_flush``, appending each pretoken's entry number to rec (room for the batch: the caller)."""
    cdef Py_ssize_t k, e
    _prefetch_entries(t, queue, n_pending)
    for k in range(n_pending):
        e = _table_add_id(t, &queue[k])
        if e < 0:
            return -1
        rec.data[rec.n] = <uint32_t>e  # < 2**32 - 1: _table_add refuses more entries
        rec.n += 1
    return 0


cdef int _count_span_rec(int pattern_id, const uint8_t* s, Py_ssize_t i, Py_ssize_t n,
                         const uint8_t* limit, CountTable* table, IdBuf* rec) noexcept nogil:
    """``_count_span`` that also appends the entry number of each pretoken, in order, to rec.

    A twin of ``_count_span`` rather than a flag in it, so the plain count's loop stays as it is.
    """
    cdef Pending queue[BATCH]
    cdef int64_t ends[SCAN_CAP]
    cdef Py_ssize_t k, got, start = i, n_pending = 0
    while i < n:
        got = _split_ends(pattern_id, s, &i, n, ends, SCAN_CAP)
        for k in range(got):
            _pend(&queue[n_pending], s + start, ends[k] - start, limit, table)
            start = ends[k]
            n_pending += 1
            if n_pending == BATCH:
                if _ids_reserve(rec, BATCH) != 0 or _flush_rec(table, queue, n_pending, rec) != 0:
                    return -1
                n_pending = 0
    if _ids_reserve(rec, n_pending) != 0:
        return -1
    return _flush_rec(table, queue, n_pending, rec)


cdef bint _entry_less(const Entry& a, const Entry& b) noexcept nogil:
    """Python bytes order: byte by byte, then the shorter first (the inline heads decide most)."""
    cdef uint64_t x = bpe_order64(a.w0), y = bpe_order64(b.w0)
    cdef int r
    if x != y:
        return x < y
    x = bpe_order64(a.w1)
    y = bpe_order64(b.w1)
    if x != y:
        return x < y
    if a.length > 16 and b.length > 16:
        r = memcmp(a.ptr + 16, b.ptr + 16, (a.length if a.length < b.length else b.length) - 16)
        if r != 0:
            return r < 0
    return a.length < b.length


ctypedef bint (*EntryLess)(const Entry&, const Entry&) noexcept nogil

cdef extern from *:
    """
    #include <algorithm>
    /* order[0:n] = 0..n-1 sorted so that e[order[0]], e[order[1]], ... are in less-order. */
    template <class E, class L>
    static void bpe_sort_order(uint32_t* order, size_t n, const E* e, L less) {
        for (size_t i = 0; i < n; i++) order[i] = (uint32_t)i;
        std::sort(order, order + n, [e, less](uint32_t a, uint32_t b) { return (bool)less(e[a], e[b]); });
    }
    """
    void bpe_sort_order[E, L](uint32_t* order, size_t n, const E* e, L less) noexcept nogil


cdef extern from *:
    """
    #include <algorithm>
    #include <stdlib.h>
    /* A word's sort key: its first 16 bytes as big-endian words (so integer order is byte order),
     * and its entry number. */
    struct BpeSortKey { uint64_t k0, k1; uint32_t idx; };
    /* order[0:n] = the entry numbers in less-order, as bpe_sort_order, but sorting 24-byte keys
     * with an inlined comparison: the heads decide nearly every comparison without touching the
     * entries (40 bytes each, and a call per comparison). 0, or -1 when out of memory. */
    template <class E, class L>
    static int bpe_sort_keys(uint32_t* order, size_t n, const E* e, L less) {
        BpeSortKey* keys = (BpeSortKey*)malloc((n ? n : 1) * sizeof(BpeSortKey));
        if (keys == NULL) return -1;
        for (size_t i = 0; i < n; i++) {
            keys[i].k0 = bpe_order64(e[i].w0);
            keys[i].k1 = bpe_order64(e[i].w1);
            keys[i].idx = (uint32_t)i;
        }
        std::sort(keys, keys + n, [e, less](const BpeSortKey& a, const BpeSortKey& b) {
            if (a.k0 != b.k0) return a.k0 < b.k0;
            if (a.k1 != b.k1) return a.k1 < b.k1;
            return (bool)less(e[a.idx], e[b.idx]);
        });
        for (size_t i = 0; i < n; i++) order[i] = keys[i].idx;
        free(keys);
        return 0;
    }
    """
    int bpe_sort_keys[E, L](uint32_t* order, size_t n, const E* e, L less) noexcept nogil


cdef extern from *:
    """
    #include <algorithm>
    #include <string.h>
    /* A word of the plain count as a sort key: its first 16 bytes as big-endian words (integer order
     * is byte order), its count, min(length, 17), and (a longer word) its entry in the long table. */
    struct BpeWordKey { uint64_t k0, k1; int64_t count; uint32_t idx, len17; };
    /* Python bytes order. Equal heads: a word of up to 16 bytes is decided by its length (its zero
     * padding is all that differs); two longer words by the long table's less. */
    template <class E, class L>
    struct BpeWordLess {
        const E* longs;
        L less;
        bool operator()(const BpeWordKey& a, const BpeWordKey& b) const {
            if (a.k0 != b.k0) return a.k0 < b.k0;
            if (a.k1 != b.k1) return a.k1 < b.k1;
            if (a.len17 != b.len17 || a.len17 <= 16) return a.len17 < b.len17;
            return (bool)less(longs[a.idx], longs[b.idx]);
        }
    };
    /* A short word (up to 15 bytes) as a 24-byte sort key: its first 15 bytes (zero-padded) as
     * big-endian words with its length as the 16th byte, and its count. Two short words never have
     * the same key, and integer order is Python bytes order (equal padded bytes: the shorter word,
     * whose padding is all that differs, has the smaller length). */
    struct BpeShortKey { uint64_t k0, k1; int64_t count; };
    struct BpeShortLess {
        bool operator()(const BpeShortKey& a, const BpeShortKey& b) const {
            return a.k0 < b.k0 || (a.k0 == b.k0 && a.k1 < b.k1);
        }
    };
    template <class K> static inline unsigned bpe_key_byte(const K& k, int d) {
        return (unsigned)((d < 8 ? k.k0 >> (56 - 8 * d) : k.k1 >> (120 - 8 * d)) & 255u);
    }
    /* MSD radix sort on byte d.. of the heads: a counting pass and a scatter per level (a level every
     * key agrees on costs one pass), std::sort for small groups and past the heads. The scatters go
     * back and forth between the keys and tmp (no copy back): bpe_radix_in sorts a[0:n] in place
     * with tmp[0:n] as scratch, bpe_radix_to sorts src[0:n] into dst[0:n] (src is scratch). */
    template <class K, class C> static void bpe_radix_to(K* src, K* dst, size_t n, int d, const C& less);
    /* The level of byte d (or the first after it where the keys differ) of a[0:n] counted into cnt;
     * its byte index, or 16 when the keys agree on every byte left. */
    template <class K> static inline int bpe_radix_level(const K* a, size_t n, int d, size_t* cnt) {
        size_t i;
        for (; d < 16; d++) {
            memset(cnt, 0, 256 * sizeof(size_t));
            for (i = 0; i < n; i++) cnt[bpe_key_byte(a[i], d)]++;
            if (cnt[bpe_key_byte(a[0], d)] != n) break;
        }
        return d;
    }
    template <class K, class C>
    static void bpe_radix_in(K* a, K* tmp, size_t n, int d, const C& less) {
        size_t cnt[256], pos[256], p, i;
        int b;
        if (n < 64 || (d = bpe_radix_level(a, n, d, cnt)) == 16) { std::sort(a, a + n, less); return; }
        for (b = 0, p = 0; b < 256; b++) { pos[b] = p; p += cnt[b]; }
        for (i = 0; i < n; i++) tmp[pos[bpe_key_byte(a[i], d)]++] = a[i];
        for (b = 0, p = 0; b < 256; b++) {
            if (cnt[b] == 1) a[p] = tmp[p];
            else if (cnt[b] > 1) bpe_radix_to(tmp + p, a + p, cnt[b], d + 1, less);
            p += cnt[b];
        }
    }
    template <class K, class C>
    static void bpe_radix_to(K* src, K* dst, size_t n, int d, const C& less) {
        size_t cnt[256], pos[256], p, i;
        int b;
        if (n < 64 || (d = bpe_radix_level(src, n, d, cnt)) == 16) {
            memcpy(dst, src, n * sizeof(K));
            std::sort(dst, dst + n, less);
            return;
        }
        for (b = 0, p = 0; b < 256; b++) { pos[b] = p; p += cnt[b]; }
        for (i = 0; i < n; i++) dst[pos[bpe_key_byte(src[i], d)]++] = src[i];
        for (b = 0, p = 0; b < 256; b++) {
            if (cnt[b] > 1) bpe_radix_in(dst + p, src + p, cnt[b], d + 1, less);
            p += cnt[b];
        }
    }
    /* keys[0:n] (short words) in Python bytes order, with tmp[0:n] as scratch (NULL: allocated
     * here); 0, or -1 when out of memory. */
    static int bpe_sort_short(BpeShortKey* keys, size_t n, BpeShortKey* tmp) {
        BpeShortLess cmp;
        BpeShortKey* own = NULL;
        if (n < 64) { std::sort(keys, keys + n, cmp); return 0; }
        if (tmp == NULL) {
            tmp = own = (BpeShortKey*)malloc(n * sizeof(BpeShortKey));
            if (tmp == NULL) return -1;
        }
        bpe_radix_in(keys, tmp, n, 0, cmp);
        free(own);
        return 0;
    }
    /* keys[0:n] in Python bytes order, with tmp[0:n] as scratch (NULL: allocated here); 0, or -1
     * when out of memory. */
    template <class E, class L>
    static int bpe_sort_words(BpeWordKey* keys, size_t n, const E* longs, L less, BpeWordKey* tmp) {
        BpeWordLess<E, L> cmp = {longs, less};
        BpeWordKey* own = NULL;
        if (n < 64) { std::sort(keys, keys + n, cmp); return 0; }
        if (tmp == NULL) {
            tmp = own = (BpeWordKey*)malloc(n * sizeof(BpeWordKey));
            if (tmp == NULL) return -1;
        }
        bpe_radix_in(keys, tmp, n, 0, cmp);
        free(own);
        return 0;
    }
    /* 16 bytes from two big-endian head words (the keys' k0, k1). */
    static inline void bpe_store_key16(uint8_t* p, uint64_t k0, uint64_t k1) {
    #if !(defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__)
        k0 = BPE_BSWAP64(k0);
        k1 = BPE_BSWAP64(k1);
    #endif
        memcpy(p, &k0, 8);
        memcpy(p + 8, &k1, 8);
    }
    """
    struct BpeWordKey:
        uint64_t k0
        uint64_t k1
        int64_t count
        uint32_t idx
        uint32_t len17
    struct BpeShortKey:
        uint64_t k0
        uint64_t k1
        int64_t count
    int bpe_sort_words[E, L](BpeWordKey* keys, size_t n, const E* longs, L less, BpeWordKey* tmp) noexcept nogil
    int bpe_sort_short(BpeShortKey* keys, size_t n, BpeShortKey* tmp) noexcept nogil
    void bpe_store_key16(uint8_t* p, uint64_t k0, uint64_t k1) noexcept nogil


cdef object _counter_to_arrays(WordCounter* c, bint numpy=True):
    """The words of a drained counter sorted by bytes, copied out as (arena, offsets, counts):
    numpy arrays, or ``array.array`` (``"B"``, ``"q"``, ``"q"``) when not ``numpy``.

    Each short word becomes a 24-byte key (``BpeShortKey``: its heads byte-swapped with its length
    as the 16th byte, unique, so integer order is bytes order; and its count), written over the
    short table's own slots (a key per slot, packed to the front: the slots are 32 bytes, and a key
    never lands past the slot it comes from); the long table's words become 32-byte keys
    (``BpeWordKey``) after them where the table has room (else allocated). Each kind is sorted on
    its own (an MSD radix sort on the heads, comparisons only within small groups; the short keys'
    scratch is the table's free slots where there are enough), and the two sorted lists are merged
    as they are written out: a short word goes before a long one when its padded first 15 bytes
    are at most the long word's first 15 (it is then smaller, or a prefix of it). A short word is
    written as its 16 head bytes at once (the next word overwrites the rest), a long one copied
    from the buffer.
    """
    cdef Py_ssize_t i, j, k = 0, n_short = c.short.n_words, n_long = c.long.n_entries
    cdef Py_ssize_t n_words = n_short + n_long, n_bytes = 0, pos = 0, length, w = 0
    cdef Py_ssize_t n_slots = c.short.mask + 1
    cdef size_t room = <size_t>n_slots * sizeof(ShortSlot), used
    cdef ShortSlot* slots = c.short.slots
    cdef ShortSlot slot
    cdef Entry* longs = c.long.entries
    cdef BpeShortKey* skey
    cdef BpeShortKey* skeys = <BpeShortKey*>slots
    cdef BpeShortKey* scratch = NULL
    cdef BpeWordKey* lkey
    cdef BpeWordKey* lkeys = NULL
    cdef bint own_lkeys = False
    cdef uint64_t s15 = 0, l15 = 0
    cdef uint8_t tmp[16]
    cdef int status = 0
    cdef uint8_t[::1] arena_view
    cdef int64_t[::1] offsets_view
    cdef int64_t[::1] counts_view
    cdef uint8_t* out
    with nogil:
        # The short words' keys over their own slots, packed to the front (no branch per slot:
        # every slot writes a key where the next word's key goes, only a word moves on).
        for i in range(n_slots):
            slot = slots[i]
            skeys[k].k0 = bpe_order64(slot.w0)
            skeys[k].k1 = bpe_order64(slot.w1) | slot.length
            skeys[k].count = slot.count
            n_bytes += <Py_ssize_t>slot.length
            k += slot.length != 0
        used = <size_t>n_short * sizeof(BpeShortKey)
        if n_long > 0:  # the long keys after the short ones where they fit
            if used + <size_t>n_long * sizeof(BpeWordKey) <= room:
                lkeys = <BpeWordKey*>(<uint8_t*>slots + used)
                used += <size_t>n_long * sizeof(BpeWordKey)
            else:
                lkeys = <BpeWordKey*>malloc(n_long * sizeof(BpeWordKey))
                own_lkeys = True
        if used + <size_t>n_short * sizeof(BpeShortKey) <= room:
            scratch = <BpeShortKey*>(<uint8_t*>slots + used)
    if n_long > 0 and lkeys == NULL:
        raise MemoryError("count_pretokens: cannot allocate the sort keys of the table")
    try:
        with nogil:
            for i in range(n_long):
                lkeys[i].k0 = bpe_order64(longs[i].w0)
                lkeys[i].k1 = bpe_order64(longs[i].w1)
                lkeys[i].count = longs[i].count
                lkeys[i].idx = <uint32_t>i
                lkeys[i].len17 = 17
                n_bytes += longs[i].length
            status = bpe_sort_short(skeys, n_short, scratch)
            if status == 0:
                status = bpe_sort_words[Entry, EntryLess](lkeys, n_long, longs, _entry_less, NULL)
        if status != 0:
            raise MemoryError("count_pretokens: cannot allocate the sort buffer of the table")
        arena, offsets, counts = _table_arrays(n_bytes, n_words, numpy)
        arena_view = arena
        offsets_view = offsets
        counts_view = counts
        out = &arena_view[0] if n_bytes > 0 else NULL
        with nogil:
            i = 0
            j = 0
            if n_long > 0:  # the first 15 bytes of the next long word (l15) and of the next short one
                l15 = lkeys[0].k1 >> 8
            while w < n_words:
                offsets_view[w] = pos
                if i < n_short and (j == n_long or skeys[i].k0 < lkeys[j].k0 or (
                        skeys[i].k0 == lkeys[j].k0 and (skeys[i].k1 >> 8) <= l15)):
                    skey = &skeys[i]
                    counts_view[w] = skey.count
                    length = <Py_ssize_t>(skey.k1 & 255)
                    if pos + 16 <= n_bytes:
                        bpe_store_key16(out + pos, skey.k0, skey.k1)
                    else:
                        bpe_store_key16(tmp, skey.k0, skey.k1)
                        memcpy(out + pos, tmp, length)
                    i += 1
                else:
                    lkey = &lkeys[j]
                    counts_view[w] = lkey.count
                    length = longs[lkey.idx].length
                    memcpy(out + pos, longs[lkey.idx].ptr, length)
                    j += 1
                    if j < n_long:
                        l15 = lkeys[j].k1 >> 8
                pos += length
                w += 1
            offsets_view[n_words] = pos
        return arena, offsets, counts
    finally:
        if own_lkeys:
            free(lkeys)


cdef inline int _word_cmp(const uint8_t* a, Py_ssize_t na, const uint8_t* b,
                          Py_ssize_t nb) noexcept nogil:
    cdef int r = memcmp(a, b, na if na < nb else nb)
    if r != 0:
        return r
    return (na > nb) - (na < nb)


# ==== Python entry points ==========================================================================


def _check_pattern_id(int pattern_id):
    if pattern_id not in (PATTERN_GPT2, PATTERN_CL100K, PATTERN_O200K):
        raise ValueError(f"unknown pattern id {pattern_id}; expected one of {PATTERN_IDS}")


def split_ends(const uint8_t[::1] buf, int pattern_id):
    """End offsets of the pretokens of ``buf`` under a named pattern, in order.

    Contract: ``buf`` is a C-contiguous uint8 buffer (``bytes``, ``bytearray``, ``np.memmap``);
    ``pattern_id`` is ``PATTERN_IDS[name]``. Returns an int64 array ``ends`` with
    ``ends[-1] == len(buf)`` (empty for an empty buffer); pretoken k is ``buf[ends[k-1]:ends[k]]``.

    >>> split_ends(b"Hi  there!", PATTERN_IDS["gpt2"]).tolist()
    [2, 3, 9, 10]

    Plain equivalent: the cumulative byte lengths of
    ``regex.findall(pattern, bytes(buf).decode("utf-8", "surrogateescape"))``, each piece encoded
    back with ``surrogateescape`` (``pretokenize.pretoken_ends`` does exactly that for a user regex).
    """
    _check_pattern_id(pattern_id)
    cdef Py_ssize_t n = buf.shape[0], pos = 0, n_ends = 0, cap = n // 4 + 16, got
    cdef int64_t[::1] ends_view
    ends = np.empty(cap, dtype=np.int64)
    cdef const uint8_t* s = &buf[0] if n > 0 else NULL
    while pos < n:
        if n_ends == cap:  # average pretokens are > 4 bytes: rarely taken
            cap = cap * 2
            grown = np.empty(cap, dtype=np.int64)
            grown[:n_ends] = ends[:n_ends]
            ends = grown
        ends_view = ends
        with nogil:
            got = _split_ends(pattern_id, s, &pos, n, &ends_view[n_ends], cap - n_ends)
        n_ends += got
    ends_view = None  # release the buffer so the array can shrink in place
    ends.resize(n_ends, refcheck=False)
    return ends


cdef enum:
    PIECES_CAP = 1024  # pretoken ends scanned per batch by split_pieces
    PREFETCH = 16  # split_pieces prefetches objects this many pretokens ahead, buckets twice as far
    PIECE_CACHE = 1 << 17  # most slots of split_pieces' cache of short pretokens (4 MiB)


# A short pretoken already turned into a bytes object (split_pieces): its zero-padded first 16
# bytes and length identify it.
cdef struct CachedPiece:
    PyObject* obj  # borrowed (the items array holds every object made in the call), or NULL
    uint64_t w0
    uint64_t w1
    Py_ssize_t length


# Reference-counting helpers on raw pointers: split_pieces fills a C array of new references that
# then becomes the list, so no Python object passes through Cython's own reference counting.
cdef extern from *:
    """
    static inline PyObject* bpe_bytes_new(const uint8_t* p, Py_ssize_t n) {
        return PyBytes_FromStringAndSize((const char*)p, n);
    }
    static inline void bpe_incref(PyObject* o) { Py_INCREF(o); }
    static inline void bpe_xdecref(PyObject* o) { Py_XDECREF(o); }

    /* The list of items[0:n] (new references; items allocated with PyMem_Malloc/PyMem_Realloc,
     * cap entries). On CPython's default build the array becomes the list's own item array, as
     * list.append would have grown it (no copy); elsewhere the references move into PyList_New(n).
     * items is consumed either way; on failure (NULL, MemoryError set) the references are
     * released. */
    static PyObject* bpe_list_adopt(PyObject** items, Py_ssize_t n, Py_ssize_t cap) {
        Py_ssize_t i;
    #if !defined(PYPY_VERSION) && !defined(Py_GIL_DISABLED) && !defined(Py_LIMITED_API)
        PyListObject* list = (PyListObject*)PyList_New(0);
        if (list != NULL) {
            if (n == 0) {
                PyMem_Free(items);
                return (PyObject*)list;
            }
            if (cap / 2 > n) {  /* give back the room of an estimate far off */
                PyObject** fitted = (PyObject**)PyMem_Realloc(items, (size_t)n * sizeof(PyObject*));
                if (fitted != NULL) {
                    items = fitted;
                    cap = n;
                }
            }
            list->ob_item = items;
            list->allocated = cap;
            Py_SET_SIZE(list, n);
            return (PyObject*)list;
        }
    #else
        PyObject* list = PyList_New(n);
        if (list != NULL) {
            for (i = 0; i < n; i++) PyList_SET_ITEM(list, i, items[i]);
            PyMem_Free(items);
            return list;
        }
    #endif
        for (i = 0; i < n; i++) Py_DECREF(items[i]);
        PyMem_Free(items);
        return NULL;
    }
    """
    PyObject* bpe_bytes_new(const uint8_t* p, Py_ssize_t n)
    void bpe_incref(PyObject* o)
    void bpe_xdecref(PyObject* o)
    object bpe_list_adopt(PyObject** items, Py_ssize_t n, Py_ssize_t cap)


cdef void _piece_keys(const uint8_t* s, Py_ssize_t start, const int64_t* ends, Py_ssize_t got,
                      const uint8_t* limit, uint64_t* keys, CachedPiece* cache,
                      uint64_t mask) noexcept nogil:
    """Head words and cache slot of each of a batch of pretokens (keys[3j..3j+2] = w0, w1, slot),
    prefetching the slots: the lookups that follow then rarely wait for memory."""
    cdef Py_ssize_t j, length
    cdef uint64_t w0, w1, h
    for j in range(got):
        length = ends[j] - start
        _head16(s + start, length, limit, &w0, &w1)
        h = (_hash(w0, w1, s + start, length if length <= 16 else 16) & mask) * 2
        keys[3 * j] = w0
        keys[3 * j + 1] = w1
        keys[3 * j + 2] = h
        start = ends[j]


cdef Py_ssize_t _pieces(const uint8_t* s, Py_ssize_t start, const int64_t* ends, Py_ssize_t got,
                        const uint64_t* keys, CachedPiece* cache, PyObject** items) noexcept:
    """A new reference to ``bytes(s[a:b])`` for each pretoken of a batch, into items[0:got].

    A pretoken of up to 16 bytes goes through its cache slot (keys from ``_piece_keys``): most are
    frequent short words, so most get (a new reference to) a bytes object made before instead of
    allocating and copying one. Bytes are immutable: sharing is safe. Returns how many items were
    written: ``got``, or fewer when out of memory (MemoryError set).
    """
    cdef Py_ssize_t j, length
    cdef CachedPiece* slot
    cdef CachedPiece spare
    cdef PyObject* obj
    cdef uint64_t w0, w1
    for j in range(min(2 * PREFETCH, got)):
        bpe_prefetch(&cache[keys[3 * j + 2]])
    for j in range(got):
        # Two stages ahead, spread evenly over the loop: the bucket of a later pretoken, and the
        # object of a nearer one (a hit touches its refcount).
        if j + 2 * PREFETCH < got:
            bpe_prefetch(&cache[keys[3 * (j + 2 * PREFETCH) + 2]])
        if j + PREFETCH < got:
            obj = cache[keys[3 * (j + PREFETCH) + 2]].obj
            if obj != NULL:
                bpe_prefetch(obj)
        length = ends[j] - start
        slot = &cache[keys[3 * j + 2]]  # a bucket of two ways, one cache line
        w0 = keys[3 * j]
        w1 = keys[3 * j + 1]
        if length <= 16 and slot[0].w0 == w0 and slot[0].w1 == w1 and slot[0].length == length:
            obj = slot[0].obj
            bpe_incref(obj)
        elif length <= 16 and slot[1].w0 == w0 and slot[1].w1 == w1 and slot[1].length == length:
            obj = slot[1].obj  # the recent way first
            bpe_incref(obj)
            spare = slot[0]
            slot[0] = slot[1]
            slot[1] = spare
        else:
            obj = bpe_bytes_new(s + start, length)
            if obj == NULL:
                return j
            if length <= 16:  # the older way goes
                slot[1] = slot[0]
                slot[0].obj = obj
                slot[0].w0 = w0
                slot[0].w1 = w1
                slot[0].length = length
        items[j] = obj
        start = ends[j]
    return got


cdef Py_ssize_t _find_all(const uint8_t* s, Py_ssize_t n, const uint8_t* tok, Py_ssize_t m,
                          int64_t* starts, Py_ssize_t cap, Py_ssize_t* pos) noexcept nogil:
    """Up to cap starts of the non-overlapping occurrences of tok (m >= 1 bytes) in s[*pos:n], left
    to right; advances *pos past the last one written (or to n). Returns how many.

    ``memchr`` finds each candidate first byte (vectorized: special tokens start with a rare byte
    such as ``<``), ``memcmp`` checks the rest.
    """
    cdef Py_ssize_t i = pos[0], k = 0
    cdef const uint8_t* hit
    cdef uint8_t first = tok[0]
    while k < cap and n - i >= m:
        hit = <const uint8_t*>memchr(s + i, first, n - i - m + 1)
        if hit == NULL:
            i = n
            break
        i = hit - s
        if memcmp(hit + 1, tok + 1, m - 1) == 0:
            starts[k] = i
            k += 1
            i += m
        else:
            i += 1
    pos[0] = i if n - i >= m else n
    return k


def find_special(const uint8_t[::1] buf, const uint8_t[::1] token):
    """The ``[start, end)`` spans of the non-overlapping occurrences of ``token`` in ``buf``, left
    to right, as an int64 ``(k, 2)`` array.

    >>> find_special(b"a<s>b<s><s", b"<s>").tolist()
    [[1, 4], [5, 8]]

    Plain equivalent: the loop ``pos = buf.find(token, pos)`` / ``pos += len(token)`` (what
    ``corpus.specials.split_on_specials`` finds for a single special token).
    """
    cdef Py_ssize_t n = buf.shape[0], m = token.shape[0], pos = 0, total = 0, got, cap = 256, k
    if m == 0:
        raise ValueError("find_special: the token is empty")
    cdef int64_t[::1] view
    starts = np.empty(cap, dtype=np.int64)
    while pos < n:
        if total == cap:
            cap *= 2
            grown = np.empty(cap, dtype=np.int64)
            grown[:total] = starts[:total]
            starts = grown
        view = starts
        with nogil:
            got = _find_all(&buf[0], n, &token[0], m, &view[total], cap - total, &pos)
        total += got
    spans = np.empty((total, 2), dtype=np.int64)
    if total:
        spans[:, 0] = starts[:total]
        spans[:, 1] = spans[:, 0] + m
    return spans


cdef Py_ssize_t _match_any(const uint8_t* s, Py_ssize_t i, Py_ssize_t end, const uint8_t** toks,
                           const Py_ssize_t* lens, Py_ssize_t n_toks) noexcept nogil:
    """The length of the first of the tokens (longest first) that occurs at s[i] within s[:end], or 0."""
    cdef Py_ssize_t t
    for t in range(n_toks):
        if lens[t] <= end - i and s[i] == toks[t][0] and memcmp(s + i, toks[t], lens[t]) == 0:
            return lens[t]
    return 0


cdef Py_ssize_t _find_specials(const uint8_t* s, Py_ssize_t end, const uint8_t** toks, const Py_ssize_t* lens, Py_ssize_t n_toks,
                               const uint8_t* firsts, int64_t* found, Py_ssize_t cap,
                               Py_ssize_t* pos) noexcept nogil:
    """Up to cap occurrences (start, end pairs into found) of the tokens in s[*pos:end], left to
    right, non-overlapping, the longest token at a position first: ``specials_regex(tokens).finditer``.
    Advances *pos past the last one written (or to end); returns how many.

    When every token starts with one byte (``<|...|>``), ``memchr`` finds the candidates; else
    ``firsts`` (256 flags) is read byte by byte.
    """
    cdef Py_ssize_t i = pos[0], k = 0, m
    cdef const uint8_t* hit
    cdef uint8_t one = toks[0][0]
    cdef bint single = True
    for m in range(256):
        if firsts[m] and m != one:
            single = False
    while k < cap and i < end:
        if single:
            hit = <const uint8_t*>memchr(s + i, one, end - i)
            if hit == NULL:
                i = end
                break
            i = hit - s
        elif not firsts[s[i]]:
            i += 1
            continue
        m = _match_any(s, i, end, toks, lens, n_toks)
        if m > 0:
            found[2 * k] = i
            found[2 * k + 1] = i + m
            k += 1
            i += m
        else:
            i += 1
    pos[0] = i
    return k


def special_spans(const uint8_t[::1] buf, Py_ssize_t start, Py_ssize_t end, tokens):
    """The ``[start, end)`` spans of the special-token occurrences in ``buf[start:end]``, as an int64
    ``(k, 2)`` array: left to right, non-overlapping, at each position the first of ``tokens`` (a
    sequence of non-empty ``bytes``, longest first) that occurs there.

    >>> special_spans(b"<s><s>x<s", 0, 9, [b"<s>x", b"<s>"]).tolist()
    [[0, 3], [3, 7]]

    Plain equivalent: ``[m.span() for m in corpus.specials.specials_regex(tokens).finditer(buf,
    start, end)]`` (the regex alternation tries the tokens in the order given, longest first).
    """
    cdef Py_ssize_t n = buf.shape[0], n_toks = len(tokens), t, total = 0, got, cap = 256, pos = start
    if not 0 <= start <= end <= n:
        raise ValueError(f"special_spans: [{start}, {end}) is not inside the buffer of {n} bytes")
    if n_toks == 0:
        return np.zeros((0, 2), dtype=np.int64)
    held = [bytes(tok) for tok in tokens]
    cdef const uint8_t** toks = <const uint8_t**>malloc(n_toks * sizeof(uint8_t*))
    cdef Py_ssize_t* lens = <Py_ssize_t*>malloc(n_toks * sizeof(Py_ssize_t))
    cdef uint8_t firsts[256]
    cdef int64_t[:, ::1] view
    cdef const uint8_t* s = &buf[0] if n > 0 else NULL
    try:
        if toks == NULL or lens == NULL:
            raise MemoryError("special_spans: out of memory")
        memset(firsts, 0, 256)
        for t in range(n_toks):
            if len(held[t]) == 0:
                raise ValueError("special_spans: a special token is empty")
            if t > 0 and len(held[t]) > len(held[t - 1]):
                raise ValueError("special_spans: the tokens must come longest first")
            toks[t] = <const uint8_t*><char*>held[t]
            lens[t] = len(held[t])
            firsts[toks[t][0]] = 1
        found = np.empty((cap, 2), dtype=np.int64)
        while pos < end:
            if total == cap:
                cap *= 2
                grown = np.empty((cap, 2), dtype=np.int64)
                grown[:total] = found[:total]
                found = grown
            view = found
            with nogil:
                got = _find_specials(s, end, toks, lens, n_toks, firsts, &view[total, 0],
                                     cap - total, &pos)
            total += got
        return found[:total].copy()
    finally:
        free(toks)
        free(lens)


def split_pieces(const uint8_t[::1] buf, int pattern_id, const int64_t[:, ::1] specials):
    """The pretokens of ``buf`` under a named pattern as a ``list[bytes]``, special tokens kept.

    Contract: ``buf`` as in ``split_ends``; ``specials`` is a ``(k, 2)`` int64 array of the
    ``[start, end)`` spans of the special tokens in ``buf``, sorted and not overlapping (as
    ``patterns.specials_regex(...).finditer`` finds them). The text before, between and after them
    is pre-tokenized span by span; each special token is one item. The items concatenate to
    ``buf``; equal short items may be one shared ``bytes`` object.

    >>> split_pieces(b"Hi  there!<s>ok", PATTERN_IDS["gpt2"], np.array([[10, 13]]))
    [b'Hi', b' ', b' there', b'!', b'<s>', b'ok']

    Plain equivalent: ``patterns.split_on_specials`` and, for each text part, the pieces
    ``buf[ends[k-1]:ends[k]]`` of ``split_ends`` (the regex pieces, see there). The items are
    written straight into the list's item array, batch by batch of ends: no ``tolist()``, no
    slicing and no ``append`` in Python.
    """
    _check_pattern_id(pattern_id)
    cdef Py_ssize_t n = buf.shape[0], n_specials = specials.shape[0], k = 0, pos = 0, seg_end
    cdef Py_ssize_t start, got, j, a, b, prev_end = 0, n_items = 0, cap, done
    cdef int64_t ends[PIECES_CAP]
    cdef uint64_t keys[3 * PIECES_CAP]
    cdef const uint8_t* s = &buf[0] if n > 0 else NULL
    cdef CachedPiece* cache
    cdef void* cache_mem
    cdef PyObject** items
    cdef PyObject** grown
    cdef PyObject* obj
    cdef Py_ssize_t n_slots = 64
    if n_specials > 0 and specials.shape[1] != 2:
        raise ValueError(f"specials must have shape (k, 2), got ({n_specials}, {specials.shape[1]})")
    for k in range(n_specials):
        a = specials[k, 0]
        b = specials[k, 1]
        if not prev_end <= a < b <= n:
            raise ValueError(f"special span {k} = [{a}, {b}) is empty, out of order or not inside "
                             f"the buffer of {n} bytes")
        prev_end = b
    while n_slots < PIECE_CACHE and n_slots < n // 16:  # a small input gets a small cache
        n_slots *= 2
    cap = n // 4 + n_specials + PIECES_CAP  # most text averages over 4 bytes a pretoken
    cache_mem = calloc(n_slots * sizeof(CachedPiece) + 64, 1)  # buckets aligned to cache lines
    cache = <CachedPiece*>((<size_t>cache_mem + 63) & ~(<size_t>63))
    items = <PyObject**>PyMem_Malloc(cap * sizeof(PyObject*))
    try:
        if cache_mem == NULL or items == NULL:
            raise MemoryError()
        k = 0
        while True:
            seg_end = specials[k, 0] if k < n_specials else n
            while pos < seg_end:
                start = pos
                got = _split_ends(pattern_id, s, &pos, seg_end, ends, PIECES_CAP)
                if cap - n_items < got + 1:  # room for the batch and a special token
                    grown = <PyObject**>PyMem_Realloc(items, 2 * cap * sizeof(PyObject*))
                    if grown == NULL:
                        raise MemoryError()
                    items = grown
                    cap *= 2
                _piece_keys(s, start, ends, got, s + n, keys, cache, n_slots // 2 - 1)
                done = _pieces(s, start, ends, got, keys, cache, items + n_items)
                n_items += done
                if done < got:
                    raise MemoryError()
            if k == n_specials:
                break
            obj = bpe_bytes_new(s + seg_end, specials[k, 1] - seg_end)
            if obj == NULL:
                raise MemoryError()
            items[n_items] = obj
            n_items += 1
            pos = specials[k, 1]
            k += 1
        out = bpe_list_adopt(items, n_items, cap)  # consumes items, also on failure
        items = NULL
        return out
    finally:
        if items != NULL:
            for j in range(n_items):
                bpe_xdecref(items[j])
            PyMem_Free(items)
        free(cache_mem)


cdef object _table_to_arrays(CountTable* t, bint presorted=False, bint numpy=True):
    """Sort the entries by bytes (unless ``presorted``) and copy them out as (arena, offsets, counts):
    numpy arrays, or ``array.array`` (``"B"``, ``"q"``, ``"q"``) when not ``numpy``.

    The sort orders entry numbers by 24-byte keys (``bpe_sort_keys``), then the copy reads the
    entries in that order: the entries themselves are not moved.
    """
    cdef Py_ssize_t i, n_words = t.n_entries, n_bytes = 0, pos = 0
    cdef Entry* entries = t.entries
    cdef Entry* e
    cdef uint32_t* order = NULL
    cdef int status = 0
    cdef uint8_t[::1] arena_view
    cdef int64_t[::1] offsets_view
    cdef int64_t[::1] counts_view
    cdef uint8_t* out
    if n_words > 1 and not presorted:
        order = <uint32_t*>malloc(n_words * sizeof(uint32_t))
        if order == NULL:
            raise MemoryError("count_pretokens: cannot allocate the sort order of the table")
    try:
        with nogil:
            if order != NULL:
                status = bpe_sort_keys[Entry, EntryLess](order, n_words, entries, _entry_less)
            for i in range(n_words):
                n_bytes += entries[i].length
        if status != 0:
            raise MemoryError("count_pretokens: cannot allocate the sort keys of the table")
        arena, offsets, counts = _table_arrays(n_bytes, n_words, numpy)
        arena_view = arena
        offsets_view = offsets
        counts_view = counts
        out = &arena_view[0] if n_bytes > 0 else NULL
        with nogil:
            for i in range(n_words):
                e = &entries[order[i] if order != NULL else i]
                offsets_view[i] = pos
                counts_view[i] = e.count
                memcpy(out + pos, e.ptr, e.length)
                pos += e.length
            offsets_view[n_words] = pos
        return arena, offsets, counts
    finally:
        free(order)


cdef class _OwnedIds:
    """A malloc'd uint32 array lent to numpy as an array's memory (freed with this object)."""
    cdef uint32_t* data
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __cinit__(self):
        self.data = NULL
        self.shape[0] = 0
        self.strides[0] = sizeof(uint32_t)

    def __dealloc__(self):
        free(self.data)

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        lend_u32(buffer, self, self.data, self.shape, self.strides)

    def __releasebuffer__(self, Py_buffer* buffer):
        pass


cdef uint32_t _NO_ID = 0


cdef int lend_u32(Py_buffer* buffer, object owner, uint32_t* data, Py_ssize_t* shape,
                  Py_ssize_t* strides) except -1:
    """Fill ``buffer`` for a 1-d writable uint32 array of ``shape[0]`` items at ``data`` (NULL when
    empty) owned by ``owner``: the body of a ``__getbuffer__`` that lends C memory to numpy."""
    return lend_items(buffer, owner, <void*>data, sizeof(uint32_t), b"I", shape, strides)


cdef int lend_items(Py_buffer* buffer, object owner, void* data, Py_ssize_t itemsize, char* fmt,
                    Py_ssize_t* shape, Py_ssize_t* strides) except -1:
    """:func:`lend_u32` for items of any size and ``struct`` format (``b"q"``: int64)."""
    strides[0] = itemsize
    buffer.buf = data if data != NULL else <void*>&_NO_ID
    buffer.format = fmt
    buffer.internal = NULL
    buffer.itemsize = itemsize
    buffer.len = shape[0] * itemsize
    buffer.ndim = 1
    buffer.obj = owner
    buffer.readonly = 0
    buffer.shape = shape
    buffer.strides = strides
    buffer.suboffsets = NULL
    return 0


cdef object _record_to_arrays(CountTable* t, IdBuf* rec):
    """``_table_to_arrays`` plus ``ids``: each recorded entry number as its row in the sorted table.

    Sorts an index array rather than the entries, so it knows where each entry went
    (``rank[old] = new``), moves the entries into that order, then maps the ids through ``rank`` in
    place; the ids' buffer becomes the array's memory (taken from ``rec``: no copy).
    """
    cdef Py_ssize_t i, n_words = t.n_entries, n_ids = rec.n
    cdef uint32_t* order = NULL
    cdef uint32_t* rank = NULL
    cdef Entry* moved = NULL
    cdef uint32_t* data = rec.data
    cdef _OwnedIds held
    try:
        if n_words > 0:
            order = <uint32_t*>malloc(n_words * sizeof(uint32_t))
            rank = <uint32_t*>malloc(n_words * sizeof(uint32_t))
            moved = <Entry*>malloc(n_words * sizeof(Entry))
            if order == NULL or rank == NULL or moved == NULL:
                raise MemoryError("count_pretokens: cannot allocate the sort order of the table")
            with nogil:
                bpe_sort_order[Entry, EntryLess](order, n_words, t.entries, _entry_less)
                for i in range(n_words):
                    moved[i] = t.entries[order[i]]
                    rank[order[i]] = <uint32_t>i
            free(t.entries)
            t.entries = moved
            moved = NULL
        out = _table_to_arrays(t, True)
        with nogil:
            for i in range(n_ids):
                data[i] = rank[data[i]]
        held = _OwnedIds()
        held.data = data
        held.shape[0] = n_ids
        rec.data = NULL             # the array owns it now
        rec.n = rec.cap = 0
        return out + (np.frombuffer(held, dtype=np.uint32),)
    finally:
        free(order)
        free(rank)
        free(moved)



cdef tuple _table_arrays(Py_ssize_t n_bytes, Py_ssize_t n_words, bint numpy):
    """The arena, offsets and counts of a sorted table, to be filled: numpy arrays, or
    ``array.array`` on a small run (no numpy)."""
    if numpy:
        return (np.empty(n_bytes, dtype=np.uint8), np.empty(n_words + 1, dtype=np.int64),
                np.empty(n_words, dtype=np.int64))
    return array.clone(_U8, n_bytes, False), array.clone(_I64, n_words + 1, False), array.clone(_I64, n_words, False)

def count_pretokens(const uint8_t[::1] buf, const int64_t[:, ::1] spans, int pattern_id,
                    bint record=False, bint numpy=True):
    """Count the pretokens of every ``[start, end)`` span of ``buf``: the sorted word table.

    Contract: each row of ``spans`` (int64, shape ``(k, 2)``, C order) is a text range of ``buf``
    between special tokens; spans are pre-tokenized independently (each one as a whole text).
    Every pretoken is hashed straight into a C hash table (no Python object per pretoken). Returns
    ``(arena, offsets, counts)``: uint8, int64 ``n_words + 1``, int64 ``n_words``; word i is
    ``arena[offsets[i]:offsets[i+1]]``, seen ``counts[i]`` times; words are unique and sorted in
    Python ``bytes`` order.

    >>> a, o, c = count_pretokens(b"a a<|>a", np.array([[0, 3], [6, 7]]), PATTERN_IDS["gpt2"])
    >>> [bytes(a[o[i]:o[i + 1]]) for i in range(len(c))], c.tolist()
    ([b' a', b'a'], [1, 2])

    With ``record`` it returns ``(arena, offsets, counts, ids)``: ``ids`` (uint32, one per pretoken,
    ``ids.size == counts.sum()``) gives, in text order (the spans in the order given, each left to
    right), the row of each pretoken in the table: the k-th pretoken is
    ``arena[offsets[ids[k]]:offsets[ids[k] + 1]]``. The plain count's loop is untouched by this;
    recording uses a twin of it (``_count_span_rec``).

    >>> a, o, c, ids = count_pretokens(b"a a<|>a", np.array([[0, 3], [6, 7]]),
    ...                                PATTERN_IDS["gpt2"], record=True)
    >>> ids.tolist(), [bytes(a[o[i]:o[i + 1]]) for i in ids]
    ([1, 0, 1], [b'a', b' a', b'a'])

    ``numpy=False`` (not with ``record``): the three tables are ``array.array`` (``"B"``, ``"q"``,
    ``"q"``) with the same items, and numpy is not imported (a small run, ``pretok.counting``).

    Plain equivalent: ``sorted(Counter(p for start, end in spans for p in
    pretokenize(buf[start:end], pattern)).items())``; with ``record``, ``ids`` is
    ``[row[p] for start, end in spans for p in pretokenize(buf[start:end], pattern)]``.
    """
    _check_pattern_id(pattern_id)
    if record and not numpy:
        raise ValueError("count_pretokens: record=True returns numpy arrays (numpy=False is not supported)")
    cdef Py_ssize_t n = buf.shape[0], k, start, end, i
    cdef const uint8_t* s = &buf[0] if n > 0 else NULL
    if spans.shape[1] != 2:
        raise ValueError(f"spans must have shape (k, 2), got ({spans.shape[0]}, {spans.shape[1]})")
    for k in range(spans.shape[0]):
        if not (0 <= spans[k, 0] <= spans[k, 1] <= n):
            raise ValueError(f"span {k} = [{spans[k, 0]}, {spans[k, 1]}) is not inside the buffer"
                             f" of {n} bytes")
    cdef CountTable table
    cdef WordCounter counter
    cdef IdBuf rec
    cdef Py_ssize_t span_bytes = 0
    cdef int status = 0
    rec.data = NULL
    rec.n = 0
    rec.cap = 0
    table.slots = NULL
    table.entries = NULL
    memset(&counter, 0, sizeof(WordCounter))
    for k in range(spans.shape[0]):
        span_bytes += spans[k, 1] - spans[k, 0]
    try:
        if record:
            if _table_init(&table, 1 << 14) != 0:
                raise MemoryError("count_pretokens: cannot allocate the hash table")
            # room for a pretoken per 4 bytes of the spans at the start (English: ~1 per 4.5): address
            # space only until written, and seldom a copy to grow
            if _ids_reserve(&rec, span_bytes // 4 + 1) != 0:
                raise MemoryError("count_pretokens: cannot allocate the ids")
            with nogil:
                for k in range(spans.shape[0]):
                    status = _count_span_rec(pattern_id, s, spans[k, 0], spans[k, 1], s + n,
                                             &table, &rec)
                    if status != 0:
                        break
            if status != 0:
                raise MemoryError("count_pretokens: out of memory growing the hash table or the ids")
            return _record_to_arrays(&table, &rec)
        if _counter_init(&counter, span_bytes) != 0:
            raise MemoryError("count_pretokens: cannot allocate the hash table")
        with nogil:
            for k in range(spans.shape[0]):
                status = _count_span(pattern_id, s, spans[k, 0], spans[k, 1], s + n, &counter)
                if status != 0:
                    break
            if status == 0:
                _counter_drain(&counter)
        if status != 0:
            raise MemoryError("count_pretokens: out of memory growing the hash table")
        return _counter_to_arrays(&counter, numpy)
    finally:
        _table_free(&table)
        _counter_free(&counter)
        free(rec.data)


cdef inline bint _run_less(WordRun* runs, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    """Heap order: the run whose current word is smaller (ties: the lower run index)."""
    cdef WordRun* x = &runs[a]
    cdef WordRun* y = &runs[b]
    cdef int r = _word_cmp(x.arena + x.offsets[x.pos], x.offsets[x.pos + 1] - x.offsets[x.pos],
                           y.arena + y.offsets[y.pos], y.offsets[y.pos + 1] - y.offsets[y.pos])
    return r < 0 or (r == 0 and a < b)


cdef void _sift_down(WordRun* runs, Py_ssize_t* heap, Py_ssize_t size, Py_ssize_t i) noexcept nogil:
    cdef Py_ssize_t child, top
    while True:
        child = 2 * i + 1
        if child >= size:
            return
        if child + 1 < size and _run_less(runs, heap[child + 1], heap[child]):
            child += 1
        if not _run_less(runs, heap[child], heap[i]):
            return
        top = heap[i]
        heap[i] = heap[child]
        heap[child] = top
        i = child


cdef void _merge_runs(WordRun* runs, Py_ssize_t n_runs, Py_ssize_t* heap, uint8_t* arena,
                      int64_t* offsets, int64_t* counts, Py_ssize_t* n_words,
                      Py_ssize_t* n_bytes) noexcept nogil:
    """k-way merge of sorted word runs, summing the counts of equal words.

    With ``arena == NULL`` it only measures: *n_words and *n_bytes of the merged table.
    """
    cdef Py_ssize_t size = 0, r, w = 0, nb = 0, length
    cdef const uint8_t* word
    cdef const uint8_t* prev = NULL
    cdef Py_ssize_t prev_length = -1
    cdef WordRun* run
    for r in range(n_runs):
        runs[r].pos = 0
        if runs[r].n_words > 0:
            heap[size] = r
            size += 1
    for r in range(size // 2 - 1, -1, -1):
        _sift_down(runs, heap, size, r)
    while size > 0:
        run = &runs[heap[0]]
        word = run.arena + run.offsets[run.pos]
        length = run.offsets[run.pos + 1] - run.offsets[run.pos]
        if prev_length >= 0 and _word_cmp(word, length, prev, prev_length) == 0:
            if arena != NULL:
                counts[w - 1] += run.counts[run.pos]
        else:
            if arena != NULL:
                offsets[w] = nb
                counts[w] = run.counts[run.pos]
                memcpy(arena + nb, word, length)
            w += 1
            nb += length
            prev = word
            prev_length = length
        run.pos += 1
        if run.pos == run.n_words:
            size -= 1
            heap[0] = heap[size]
        _sift_down(runs, heap, size, 0)
    if arena != NULL:
        offsets[w] = nb
    n_words[0] = w
    n_bytes[0] = nb


cdef bint _run_is_sorted(WordRun* run) noexcept nogil:
    """Offsets start at 0, never decrease, and words are strictly increasing (unique, sorted)."""
    cdef Py_ssize_t i
    if run.offsets[0] != 0:
        return False
    for i in range(run.n_words):
        if run.offsets[i + 1] < run.offsets[i]:
            return False
        if i > 0 and _word_cmp(run.arena + run.offsets[i - 1], run.offsets[i] - run.offsets[i - 1],
                               run.arena + run.offsets[i], run.offsets[i + 1] - run.offsets[i]) >= 0:
            return False
    return True


def merge_counts(tables):
    """Sum sorted word tables into one sorted word table (a k-way merge, no Python object per word).

    Contract: ``tables`` is a sequence of ``(arena, offsets, counts)`` as ``count_pretokens``
    returns them (uint8, int64, int64; each sorted by bytes, words unique). Returns one such table
    holding every word of any input with the sum of its counts. Raises ``ValueError`` on a table
    that is malformed or not sorted.

    >>> t1 = (np.frombuffer(b"ab", np.uint8), np.array([0, 1, 2]), np.array([1, 2]))
    >>> t2 = (np.frombuffer(b"bc", np.uint8), np.array([0, 1, 2]), np.array([5, 1]))
    >>> a, o, c = merge_counts([t1, t2])
    >>> bytes(a), o.tolist(), c.tolist()
    (b'abc', [0, 1, 2, 3], [1, 7, 1])

    Plain equivalent: ``sorted(sum((Counter(dict(rows(t))) for t in tables), Counter()).items())``.
    """
    cdef Py_ssize_t n_runs = len(tables), r, n_words = 0, n_bytes = 0
    cdef const uint8_t[::1] arena_view
    cdef const int64_t[::1] offsets_view
    cdef const int64_t[::1] counts_view
    keep = []  # the memoryviews stay alive while C pointers into them are used
    cdef WordRun* runs = <WordRun*>calloc(n_runs + 1, sizeof(WordRun))
    cdef Py_ssize_t* heap = <Py_ssize_t*>calloc(n_runs + 1, sizeof(Py_ssize_t))
    cdef bint ok
    cdef uint8_t[::1] out_arena
    cdef int64_t[::1] out_offsets
    cdef int64_t[::1] out_counts
    cdef uint8_t* arena_ptr
    try:
        if runs == NULL or heap == NULL:
            raise MemoryError("merge_counts: cannot allocate the merge heap")
        for r, table in enumerate(tables):
            arena, offsets, counts = table
            arena_view = np.ascontiguousarray(arena, dtype=np.uint8)
            offsets_view = np.ascontiguousarray(offsets, dtype=np.int64)
            counts_view = np.ascontiguousarray(counts, dtype=np.int64)
            if offsets_view.shape[0] != counts_view.shape[0] + 1:
                raise ValueError(f"table {r}: offsets must have len(counts) + 1 entries")
            if offsets_view[offsets_view.shape[0] - 1] != arena_view.shape[0]:
                raise ValueError(f"table {r}: offsets[-1] must equal len(arena)")
            keep.append((arena_view, offsets_view, counts_view))
            runs[r].arena = &arena_view[0] if arena_view.shape[0] > 0 else <const uint8_t*>heap
            runs[r].offsets = &offsets_view[0]
            runs[r].counts = &counts_view[0] if counts_view.shape[0] > 0 else NULL
            runs[r].n_words = counts_view.shape[0]
            with nogil:
                ok = _run_is_sorted(&runs[r])
            if not ok:
                raise ValueError(f"table {r} is not sorted by bytes with unique words")
        with nogil:
            _merge_runs(runs, n_runs, heap, NULL, NULL, NULL, &n_words, &n_bytes)
        arena_out = np.empty(n_bytes, dtype=np.uint8)
        offsets_out = np.empty(n_words + 1, dtype=np.int64)
        counts_out = np.empty(n_words, dtype=np.int64)
        out_arena = arena_out
        out_offsets = offsets_out
        out_counts = counts_out
        # A non-NULL arena pointer switches the merge to writing, even when there are no bytes.
        arena_ptr = &out_arena[0] if n_bytes > 0 else <uint8_t*>heap
        with nogil:
            _merge_runs(runs, n_runs, heap, arena_ptr, &out_offsets[0],
                        &out_counts[0] if n_words > 0 else NULL, &n_words, &n_bytes)
        return arena_out, offsets_out, counts_out
    finally:
        free(runs)
        free(heap)


# ==== Per-word character facts (SuperBPE's stage-2 units) ======================================

cdef int _check_word_offsets(const uint8_t[::1] arena, const int64_t[::1] offsets) except -1:
    """Raise ``ValueError`` unless ``offsets`` are the words of ``arena`` (in it, not decreasing)."""
    cdef Py_ssize_t n_words = offsets.shape[0] - 1, w
    if n_words > 0 and (offsets[0] < 0 or offsets[n_words] > arena.shape[0]):
        raise ValueError("offsets go past the arena")
    for w in range(n_words):
        if offsets[w + 1] < offsets[w]:
            raise ValueError("offsets must not decrease")
    return 0


def word_char_flags(const uint8_t[::1] arena, const int64_t[::1] offsets):
    """Per word ``arena[offsets[w]:offsets[w+1]]`` (uint8): 1 when a character is ``\\p{N}``, 2 when
    its first character is ``\\s``, 4 when its last is; each word decoded alone, as Python's
    ``decode("utf-8", "surrogateescape")`` decodes it (an undecodable byte is the character
    U+DC00 + byte, which is neither), with the character tables of the pre-tokenizer.

    >>> w = [b" a", b"x\\n", b" 12", b"\\xc2\\xa0", b"\\xd9\\xa3", b"\\xc2", b""]
    >>> word_char_flags(np.frombuffer(b"".join(w), np.uint8),
    ...                 np.cumsum([0] + [len(x) for x in w])).tolist()     # U+00A0 is \\s, U+0663 \\p{N}
    [2, 4, 3, 6, 1, 0, 0]

    Plain equivalent: ``superbpe.word_flags_python`` (``regex`` on each decoded word; tested equal).
    """
    cdef Py_ssize_t n_words = offsets.shape[0] - 1, w, i, e, end
    cdef uint16_t f
    cdef uint8_t out_f
    out = np.zeros(max(n_words, 0), dtype=np.uint8)
    cdef uint8_t[::1] ov = out
    cdef const uint8_t* s = &arena[0] if arena.shape[0] > 0 else NULL
    _check_word_offsets(arena, offsets)
    with nogil:
        for w in range(n_words):
            i = offsets[w]
            e = offsets[w + 1]
            out_f = 0
            f = 0
            while i < e:
                f = _char(s, i, e, &end)
                if f & BPE_UT_N:
                    out_f |= 1
                if i == offsets[w] and (f & BPE_UT_S):
                    out_f |= 2
                i = end
            if e > offsets[w] and (f & BPE_UT_S):       # f: the last character's
                out_f |= 4
            ov[w] = out_f
    return out


def word_byte_classes(const uint8_t[::1] arena, const int64_t[::1] offsets):
    """Per word (int64 rows of 5): its bytes, ASCII whitespace (`` \\t\\n\\r\\v\\f``), ASCII
    punctuation (``!`` to ``~`` less letters and digits), ASCII letters and digits, ASCII digits.

    >>> word_byte_classes(np.frombuffer(b"ab, 7\\xc3\\xa9", np.uint8), np.array([0, 3, 7])).tolist()
    [[3, 0, 1, 2, 0], [4, 1, 0, 1, 1]]

    Plain equivalent: ``superbpe.word_classes_python`` (numpy over the byte classes; tested equal).
    """
    cdef Py_ssize_t n_words = offsets.shape[0] - 1, w, i
    cdef uint8_t c
    out = np.zeros((max(n_words, 0), 5), dtype=np.int64)
    cdef int64_t[:, ::1] ov = out
    _check_word_offsets(arena, offsets)
    with nogil:
        for w in range(n_words):
            ov[w, 0] = offsets[w + 1] - offsets[w]
            for i in range(offsets[w], offsets[w + 1]):
                c = arena[i]
                if c == 0x20 or (0x09 <= c <= 0x0D):
                    ov[w, 1] += 1
                elif (0x30 <= c <= 0x39) or (0x41 <= c <= 0x5A) or (0x61 <= c <= 0x7A):
                    ov[w, 3] += 1
                    if c <= 0x39:
                        ov[w, 4] += 1
                elif 0x21 <= c <= 0x7E:
                    ov[w, 2] += 1
    return out


def table_sums(const int64_t[::1] offsets, const int64_t[::1] counts):
    """The totals of a word table: ``(pretokens, text bytes, one-byte words)``.

    Contract: ``offsets`` (int64, ``n_words + 1``) and ``counts`` (int64, ``n_words``) of a table
    (``count_pretokens``); any buffer (numpy arrays, ``array.array``). Returns the sum of the
    counts, the sum of ``len(word) * count`` (the bytes of text the table stands for), and the
    number of words of one byte.

    >>> table_sums(np.array([0, 1, 3, 6]), np.array([5, 2, 1]))
    (8, 12, 1)

    Plain equivalent: ``(int(counts.sum()), int(np.dot(np.diff(offsets), counts)),
    int(np.count_nonzero(np.diff(offsets) == 1)))``.
    """
    cdef Py_ssize_t i, n = counts.shape[0]
    cdef int64_t total = 0, covered = 0, single = 0, length
    if offsets.shape[0] != n + 1:
        raise ValueError(f"table_sums: {offsets.shape[0]} offsets for {n} words (n_words + 1 expected)")
    with nogil:
        for i in range(n):
            length = offsets[i + 1] - offsets[i]
            total += counts[i]
            covered += length * counts[i]
            single += length == 1
    return int(total), int(covered), int(single)


def drop_one_byte_words(const uint8_t[::1] arena, const int64_t[::1] offsets, const int64_t[::1] counts):
    """The table without its words of one byte (they hold no pair), as ``array.array`` (``"B"``,
    ``"q"``, ``"q"``); None when it has none.

    >>> a, o, c = drop_one_byte_words(b"abcdef", np.array([0, 1, 3, 6]), np.array([5, 2, 1]))
    >>> bytes(a), o.tolist(), c.tolist()
    (b'bcdef', [0, 2, 5], [2, 1])

    Plain equivalent: ``pretok.wordtable.WordTable.without_singletons`` (numpy masks).
    """
    cdef Py_ssize_t i, n = counts.shape[0], n_keep = 0, n_bytes = 0, k = 0, pos = 0, length
    if offsets.shape[0] != n + 1:
        raise ValueError(f"drop_one_byte_words: {offsets.shape[0]} offsets for {n} words")
    if n and (offsets[0] != 0 or offsets[n] > arena.shape[0]):
        raise ValueError("drop_one_byte_words: offsets outside the arena")
    for i in range(n):
        length = offsets[i + 1] - offsets[i]
        if length != 1:
            n_keep += 1
            n_bytes += length
    if n_keep == n:
        return None
    cdef array.array arena_out = array.clone(_U8, n_bytes, False)
    cdef array.array offsets_out = array.clone(_I64, n_keep + 1, False)
    cdef array.array counts_out = array.clone(_I64, n_keep, False)
    cdef uint8_t* a = arena_out.data.as_uchars
    cdef int64_t* o = <int64_t*>offsets_out.data.as_voidptr
    cdef int64_t* c = <int64_t*>counts_out.data.as_voidptr
    with nogil:
        o[0] = 0
        for i in range(n):
            length = offsets[i + 1] - offsets[i]
            if length != 1:
                if length:
                    memcpy(a + pos, &arena[offsets[i]], length)
                pos += length
                c[k] = counts[i]
                k += 1
                o[k] = pos
    return arena_out, offsets_out, counts_out
