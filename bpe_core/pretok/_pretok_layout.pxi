# _pretok.pyx, part 1 of 11 (``include``d: compiled into the module as if written there).
# The C side of the pre-tokenizer: the Unicode class tables, the ASCII window fast path, the
# counters' front cache, small C helpers (loads, byte order, prefetch, table memory); the table
# versions, pattern ids and byte constants.

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
